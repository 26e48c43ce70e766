# ringlimit: `make run` starts a local three-node cluster, `make test` runs
# every test that fits in CI's budget.
GO       ?= go
BIN      := .build/ringlimit
PKGS     := ./...
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.buildVersion=$(VERSION)
IMAGE    ?= ghcr.io/ringlimit/ringlimit

.PHONY: all help build run test allocs lint vet fmt fuzz-short fuzz chaos sim bench proto image clean

all: build

help:
	@echo 'make run      build, then start RUN_NODES (3) nodes on 127.0.0.1 serving deploy/examples/config; Ctrl-C stops them'
	@echo '              RUN_PORT_BASE=9000 make run moves every port: node i uses BASE+100i (HTTP), +1 (gRPC), +2 (debug), +3 (gossip);'
	@echo '              the default 8080 gives node 0 HTTP 8080, gRPC 8081, debug 8082, gossip 8083'
	@echo 'make build    the binary in $(BIN)'
	@echo 'make test     vet, gofmt, race-enabled tests of every package, allocation tests, a short fuzz run (under 10 minutes)'
	@echo 'make lint     vet and gofmt'
	@echo 'make bench    the floor, one node and three nodes under the same load; as root, one, three and five nodes at'
	@echo '              BENCH_CPU_QUOTA (0.25) CPU per server process (about 8 minutes)'
	@echo 'make chaos    the full failure suite (about 3 minutes)'
	@echo 'make sim      the deterministic simulation (SIM_SEEDS, SIM_SEED, SIM_BREAK)'
	@echo 'make image    the container image (needs Docker)'

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/ringlimit

# A local cluster on loopback serving deploy/examples/config; Ctrl-C stops it.
# RUN_PORT_BASE moves every port it uses (see make help).
RUN_NODES     ?= 3
RUN_PORT_BASE ?= 8080
run:
	@echo "make run: building $(BIN) (the first build downloads modules and compiles everything: about 2 minutes; later ones take seconds)..."
	@$(MAKE) --no-print-directory build
	@echo "make run: built; starting the cluster (Ctrl-C stops it)"
	@RUN_PORT_BASE=$(RUN_PORT_BASE) exec ./deploy/local/run-cluster.sh $(BIN) $(RUN_NODES)

# vet + gofmt + race-enabled tests of every package (incl. the short chaos
# suite and the short simulation, three small seeds of make sim), the allocation tests (without -race, which changes allocation
# counts) and a short fuzz run. Budget: well under 10 minutes on 2 cores.
test: lint
	$(GO) test -race -count=1 -timeout 9m $(PKGS)
	$(MAKE) --no-print-directory allocs
	$(MAKE) --no-print-directory fuzz-short

# The testing.AllocsPerRun tests (every Test*Alloc*), without the race
# detector: the hot path allocates nothing beyond gRPC's own messages.
allocs:
	$(GO) test -count=1 -run 'Alloc' ./bucket/ ./ring/ ./rls/ ./cluster/...

# Every fuzz target for a bounded number of inputs (a count, not a time:
# go1.26's -fuzztime with a duration can fail spuriously, golang/go#75804).
FUZZ_TARGETS := rls:FuzzParseConfig rls:FuzzConfigFromXDS rls:FuzzMatch rls:FuzzKeyRoundTrip ring:FuzzSuccessors cluster/membership:FuzzMeta cluster/transport:FuzzPeerDecode cluster/lifecycle:FuzzStep bucket:FuzzReadSnapshot
FUZZ_N ?= 3000x
fuzz-short:
	@set -e; n=0; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZ_N))"; \
		out=$$($(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZ_N) ./$$pkg/ 2>&1) || { echo "$$out"; echo "fuzz: $$n passed, 1 failed"; exit 1; }; \
		n=$$((n + 1)); \
	done; \
	echo "fuzz: $$n passed, 0 failed"

fuzz:
	$(MAKE) fuzz-short FUZZ_N=500000x

# Regenerate the peer protocol (needs protoc, protoc-gen-go, protoc-gen-go-grpc).
proto:
	protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative cluster/peerpb/peer.proto

lint: vet fmt

vet:
	$(GO) vet $(PKGS)

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

clean:
	rm -rf .build

# The floor (a do-nothing RLS), one node and three nodes under the same load, as a
# table with ratios to the floor; as root, the same at equal CPU per server
# process (a cgroup quota each, BENCH_CPU_QUOTA) for one, three and five nodes;
# then the Go micro-benchmarks (benchstat-ready). See docs/performance.md.
bench: build
	./deploy/local/bench.sh $(BIN)

# The full chaos suite (about 3 minutes): kills, freezes, restarts, scale steps
# and, as root, a partition in network namespaces; one row per scenario,
# Markdown in .build/chaos-report.md. make test runs the short version.
chaos:
	$(GO) test -count=1 -v -timeout 20m -run 'TestChaos$$' ./chaos/ -chaos.full -chaos.report=$(CURDIR)/.build/chaos-report.md

# The deterministic simulation (chaos/sim): SIM_SEEDS seeded schedules of joins,
# leaves, kills, restarts, pauses and partitions against 3 to 50 in-process
# nodes on a simulated network and virtual time, every answer checked against
# docs/consistency.md's bounds (about two minutes here). A failing seed prints
# `replay: make sim SIM_SEED=n`; SIM_SEED=n runs that one with its debug log;
# SIM_BREAK=relay|replication|lease builds the nodes with that defect on purpose.
# The last line is `sim: N seeds, M violations`; make test runs a short version.
SIM_SEEDS    ?= 30
SIM_SEED     ?=
SIM_BREAK    ?=
SIM_NODES    ?=
SIM_MAXNODES ?=
SIM_ARGS     = $(if $(SIM_SEED),-sim.seed=$(SIM_SEED) -sim.v,-sim.seeds=$(SIM_SEEDS)) $(if $(SIM_BREAK),-sim.break=$(SIM_BREAK)) \
	$(if $(SIM_NODES),-sim.nodes=$(SIM_NODES)) $(if $(SIM_MAXNODES),-sim.maxnodes=$(SIM_MAXNODES))
sim:
	@mkdir -p .build
	@{ cd chaos/sim && $(GO) test -count=1 -timeout 60m -run '^TestSim$$' $(if $(SIM_SEED),-v) -args $(SIM_ARGS); \
		echo $$? > $(CURDIR)/.build/sim.rc; } 2>&1 | \
		awk '/^sim: [0-9]+ seeds, [0-9]+ violations$$/ { last = $$0; next } { print; fflush() } END { if (last != "") print last }'
	@exit $$(cat .build/sim.rc)

# Container image from ./Dockerfile; needs a Docker engine with BuildKit (none runs in CI here).
image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .
