package cluster

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the node's own metrics; its packages register theirs.
type nodeMetrics struct {
	members  prometheus.Gauge
	rebuilds prometheus.Counter
	pauses   prometheus.Counter
	ready    prometheus.Gauge
}

func newNodeMetrics() nodeMetrics {
	return nodeMetrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_cluster_members", Help: "Ready cluster members in this node's ring (itself included once ready).",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_ring_rebuilds_total", Help: "Times the hash ring was rebuilt after a membership change.",
		}),
		pauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_pauses_detected_total",
			Help: "Times this process found it had been frozen (SIGSTOP, VM pause) and re-synced.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_node_ready",
			Help: "1 when this node has synced its counters and is a ring member, else 0.",
		}),
	}
}

func (m nodeMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.members, m.rebuilds, m.pauses, m.ready}
}

// undoRegisterer registers on reg and remembers what it registered, so that
// a NewNode that fails after its packages registered their metrics can take
// them all back and be retried on the same registry.
type undoRegisterer struct {
	reg  prometheus.Registerer
	mu   sync.Mutex
	done []prometheus.Collector
}

func (u *undoRegisterer) Register(c prometheus.Collector) error {
	if err := u.reg.Register(c); err != nil {
		return err
	}
	u.mu.Lock()
	u.done = append(u.done, c)
	u.mu.Unlock()
	return nil
}

func (u *undoRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := u.Register(c); err != nil {
			panic(err)
		}
	}
}

func (u *undoRegisterer) Unregister(c prometheus.Collector) bool {
	u.mu.Lock()
	for i, d := range u.done {
		if d == c {
			u.done = append(u.done[:i], u.done[i+1:]...)
			break
		}
	}
	u.mu.Unlock()
	return u.reg.Unregister(c)
}

// orNil is u as a Registerer, or nil when u is nil (nothing is registered).
func (u *undoRegisterer) orNil() prometheus.Registerer {
	if u == nil {
		return nil
	}
	return u
}

// undo unregisters everything registered through u (nil: nothing).
func (u *undoRegisterer) undo() {
	if u == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.done {
		u.reg.Unregister(c)
	}
	u.done = nil
}
