# syntax=docker/dockerfile:1
# ringlimit image: a static binary on distroless, running as non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always) -t ringlimit .
# (or `make image`). Multi-arch: docker buildx build --platform linux/amd64,linux/arm64 .

# Build stage: the Go toolchain the module asks for (go.mod's go line).
FROM --platform=$BUILDPLATFORM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS=linux
ARG TARGETARCH
# CGO_ENABLED=0: a static binary with Go's own DNS resolver (reads
# /etc/hosts and /etc/resolv.conf; no libc needed in the final image).
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" \
      -o /out/ringlimit ./cmd/ringlimit

# Final stage: no shell, no package manager; CA certificates, /etc/passwd
# with the nonroot user (65532) and tzdata only.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ringlimit /ringlimit
USER 65532:65532
# gRPC (RLS v3, health, peer RPCs), HTTP (/healthcheck, /json), debug
# (/metrics, /rlconfig, pprof), gossip (memberlist, TCP and UDP).
EXPOSE 8081/tcp 8080/tcp 6070/tcp 7946/tcp 7946/udp
ENTRYPOINT ["/ringlimit"]
CMD ["serve"]
