# ringlimit: `make run` starts a local three-node cluster, `make test` runs
# every test that fits in CI's budget.
GO       ?= go
BIN      := .build/ringlimit
PKGS     := ./...
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.buildVersion=$(VERSION)

.PHONY: all build run test test-short lint vet fmt chaos bench proto image clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/ringlimit

# A local cluster on loopback serving deploy/examples/config; Ctrl-C stops it.
run: build
	./deploy/local/run-cluster.sh $(BIN)

# vet + gofmt + race-enabled tests of every package (incl. the short chaos
# suite and the allocation tests). Budget: well under 10 minutes on 2 cores.
test: lint
	$(GO) test -race -count=1 -timeout 9m $(PKGS)

lint: vet fmt

vet:
	$(GO) vet $(PKGS)

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

clean:
	rm -rf .build
