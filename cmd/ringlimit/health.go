package main

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthNames are the gRPC health services ringlimit answers for, as the
// reference: "ratelimit" and the server as a whole.
var healthNames = [...]string{"", "ratelimit"}

// healthState publishes readiness to /healthcheck and to gRPC health at
// once: both answer from the last update, so a client never sees one say
// ready while the other does not (beyond the instant of a flip).
type healthState struct {
	ready func() bool
	grpc  *health.Server

	mu sync.Mutex  // serialises updates
	ok atomic.Bool // what /healthcheck answers
}

// newHealthState registers gs's health at NOT_SERVING; update publishes
// ready().
func newHealthState(grpc *health.Server, ready func() bool) *healthState {
	for _, name := range healthNames {
		grpc.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return &healthState{ready: ready, grpc: grpc}
}

// update reads ready() and publishes it to both, if it changed.
func (h *healthState) update() {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.ready()
	if r == h.ok.Load() {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if r {
		st = healthpb.HealthCheckResponse_SERVING
	}
	// gRPC first: whoever sees /healthcheck flip sees gRPC health flipped.
	for _, name := range healthNames {
		h.grpc.SetServingStatus(name, st)
	}
	h.ok.Store(r)
}

// Ready is what /healthcheck answers: the last update.
func (h *healthState) Ready() bool { return h.ok.Load() }
