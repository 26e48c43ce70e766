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
// /healthcheck also says why the node is not ready.
type healthState struct {
	notReady func() string
	grpc     *health.Server

	mu     sync.Mutex             // serialises updates
	reason atomic.Pointer[string] // what /healthcheck answers: "" when ready
}

// newHealthState registers gs's health at NOT_SERVING; update publishes
// notReady(): "" when ready, else why not.
func newHealthState(grpc *health.Server, notReady func() string) *healthState {
	for _, name := range healthNames {
		grpc.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	h := &healthState{notReady: notReady, grpc: grpc}
	starting := "starting"
	h.reason.Store(&starting)
	return h
}

// update reads notReady() and publishes it to both; gRPC health only
// changes when readiness does.
func (h *healthState) update() {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.notReady()
	if was := *h.reason.Load(); (r == "") == (was == "") {
		h.reason.Store(&r) // the same readiness; the reason may read differently
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if r == "" {
		st = healthpb.HealthCheckResponse_SERVING
	}
	// gRPC first: whoever sees /healthcheck flip sees gRPC health flipped.
	for _, name := range healthNames {
		h.grpc.SetServingStatus(name, st)
	}
	h.reason.Store(&r)
}

// NotReady is what /healthcheck answers, from the last update: "" when
// ready, else why not.
func (h *healthState) NotReady() string { return *h.reason.Load() }
