package replication

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/cluster/internal/promreg"
)

// metrics are the replication, handoff and sync metrics.
type metrics struct {
	sent      prometheus.Counter
	rpcErrors prometheus.Counter
	dropped   *prometheus.CounterVec
	drop      [dropReasons]prometheus.Counter
	received  prometheus.Counter
	merged    prometheus.Counter
	handoff   *prometheus.CounterVec
	// handoffFailures counts ring-change handoffs that missed a peer.
	handoffFailures prometheus.Counter
	syncs           *prometheus.CounterVec
	syncDur         prometheus.Histogram
	syncMerged      prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_sent_entries_total",
			Help: "Counter states this node's replicas acknowledged (after coalescing per key).",
		}),
		rpcErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_rpc_errors_total",
			Help: "Replicate RPCs to replicas that failed; their entries are retried with backoff.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_replication_dropped_total",
			Help: "Recorded writes that never reached a replica, by reason (queue_full, backlog_full, gone, refused).",
		}, []string{"reason"}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_received_entries_total",
			Help: "Counter states received from peers (replication, handoff and sync).",
		}),
		merged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_replication_merged_entries_total",
			Help: "Received counter states that changed this node's counters.",
		}),
		handoffFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_handoff_failures_total",
			Help: "Handoffs after a ring change that did not reach every peer; each is run again with backoff (0.5 s to 30 s) until one succeeds.",
		}),
		handoff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_entries_total",
			Help: "Counter states pushed to their new owner and replicas, by cause (ring_change, drain).",
		}, []string{"cause"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_syncs_total",
			Help: "Syncs of this node's counters from its peers before it became ready, by result (ok, partial).",
		}, []string{"result"}),
		syncDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_sync_duration_seconds",
			Help:    "How long a sync from the peers took.",
			Buckets: prometheus.ExponentialBucketsRange(1e-3, 10, 9),
		}),
		syncMerged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_sync_entries_total",
			Help: "Counter states received by syncs.",
		}),
	}
	for i, name := range dropNames {
		m.drop[i] = m.dropped.WithLabelValues(name)
	}
	// Every label value is exported from the start, at zero, so that
	// rate() and increase() see the first handoff or partial sync.
	for _, cause := range []string{"ring_change", "drain"} {
		m.handoff.WithLabelValues(cause)
	}
	for _, result := range []string{"ok", "partial"} {
		m.syncs.WithLabelValues(result)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.sent, m.rpcErrors, m.dropped, m.received, m.merged, m.handoff, m.handoffFailures,
		m.syncs, m.syncDur, m.syncMerged}
}

// register registers every metric on reg (nil: nowhere), or none of them.
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	if err := promreg.RegisterAll(reg, m.collectors()...); err != nil {
		return fmt.Errorf("replication: register metrics: %w", err)
	}
	return nil
}
