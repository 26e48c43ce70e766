// Package replication keeps a node's counters where the ring wants them:
// it records every write on the hit path (Recorder) and ships it to the
// key's replicas, pushes the keys whose replica set changed after a ring
// change or before a graceful leave (handoff), pulls the counters a node
// should hold from its peers before it is ready (sync), and merges what
// peers send. It declares what it needs (Store, Conns) and imports neither
// transport nor membership. A Replicator is safe for concurrent use.
package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/ring"
)

// DefaultInterval is how often recorded writes are sent to the replicas by
// default: the most an owner crash can lose.
const DefaultInterval = 5 * time.Millisecond

// Config configures a Replicator. Self, Replicas, Recorder, Conns, Ring
// and SyncTimeout are required, and Targets when Replicas > 1.
type Config struct {
	// Self is this node's ID, as the rings name it.
	Self string
	// Replicas is how many distinct nodes hold each key: its owner and
	// Replicas-1 replicas, the key's next successors on the ring. 1 sends
	// no writes to replicas (handoff and sync still move counters).
	Replicas int
	// Recorder is the node's store; with Replicas > 1 it must record
	// (NewRecorder(store, true)), and its writes are sent to the replicas.
	Recorder *Recorder
	// Clock is the replicator's one source of time: the "now" (Unix ns) of
	// merges and of the ranges that handoff, drain and sync read, the
	// shipper's ticker and retry backoff, the senders' stream ages, and the
	// timing of syncs. Nil means clock.Real().
	Clock clock.Clock
	// Interval is how often recorded writes are sent; 0 means
	// DefaultInterval.
	Interval time.Duration
	// SyncTimeout bounds how long Pull waits for each peer's Sync.
	SyncTimeout time.Duration
	// RingConfig is the ring's placement settings: a Sync places keys on
	// the ring of the current members plus the caller.
	RingConfig ring.Config
	// Ring returns the ring that places keys now (a Sync's members).
	Ring func() *ring.Ring
	// Targets returns the ring that places the replicas of this node's
	// writes now: Ring, or the ring without this node while it drains.
	Targets func() *ring.Ring
	// Conns gives the peers' connections, for replication and handoff.
	Conns Conns
	// DialOptions dial the peers a Pull syncs from.
	DialOptions []grpc.DialOption
	// Registerer receives the replication, handoff and sync metrics; nil
	// registers nowhere.
	Registerer prometheus.Registerer
	// Logger receives what replication drops and what syncs serve; nil
	// discards it.
	Logger *slog.Logger
}

// Replicator keeps a node's counters where the ring wants them (see the
// package documentation). Close stops it.
type Replicator struct {
	self        string
	replicas    int
	rec         *Recorder
	store       Store
	clock       clock.Clock
	syncTimeout time.Duration
	ringCfg     ring.Config
	ring        func() *ring.Ring
	conns       Conns
	dialOpts    []grpc.DialOption
	log         *slog.Logger
	m           *metrics
	ship        *shipper // nil when Replicas is 1
}

// New checks cfg, registers the metrics and, with Replicas > 1, starts the
// goroutine that sends the recorded writes to the replicas.
func New(cfg Config) (*Replicator, error) {
	switch {
	case cfg.Self == "":
		return nil, errors.New("replication: Self is empty")
	case cfg.Replicas < 1:
		return nil, fmt.Errorf("replication: Replicas must be at least 1, got %d", cfg.Replicas)
	case cfg.Recorder == nil:
		return nil, errors.New("replication: Recorder is nil")
	case cfg.Replicas > 1 && cfg.Recorder.log == nil:
		return nil, errors.New("replication: Replicas > 1 needs a Recorder that records")
	case cfg.Replicas > 1 && cfg.Targets == nil:
		return nil, errors.New("replication: Targets is nil")
	case cfg.Conns == nil:
		return nil, errors.New("replication: Conns is nil")
	case cfg.Ring == nil:
		return nil, errors.New("replication: Ring is nil")
	case cfg.Interval < 0:
		return nil, fmt.Errorf("replication: Interval must be >= 0, got %v", cfg.Interval)
	case cfg.SyncTimeout <= 0:
		return nil, fmt.Errorf("replication: SyncTimeout must be > 0, got %v", cfg.SyncTimeout)
	}
	r := &Replicator{
		self:        cfg.Self,
		replicas:    cfg.Replicas,
		rec:         cfg.Recorder,
		store:       cfg.Recorder.store,
		clock:       clock.Or(cfg.Clock),
		syncTimeout: cfg.SyncTimeout,
		ringCfg:     cfg.RingConfig,
		ring:        cfg.Ring,
		conns:       cfg.Conns,
		dialOpts:    cfg.DialOptions,
		log:         cfg.Logger,
		m:           newMetrics(),
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if err := r.m.register(cfg.Registerer); err != nil {
		return nil, err
	}
	if r.replicas > 1 {
		r.ship = &shipper{
			self:     r.self,
			replicas: r.replicas,
			log:      r.rec.log,
			clock:    r.clock,
			interval: cmp.Or(cfg.Interval, DefaultInterval),
			targets:  cfg.Targets,
			conns:    r.conns,
			m:        r.m,
			logger:   r.log,
		}
		r.ship.start()
	}
	return r, nil
}

// Flush sends everything recorded so far to every replica at once,
// ignoring backoff, and waits until those sends finished or ctx ended. It
// returns an error when a send failed and its writes are still waiting
// (they are retried as usual). Without replicas it returns nil at once.
func (r *Replicator) Flush(ctx context.Context) error {
	if r.ship == nil {
		return nil
	}
	return r.ship.flush(ctx)
}

// now reads the clock: Unix ns, the time of a merge or a range.
func (r *Replicator) now() int64 { return r.clock.Now().UnixNano() }

// Close stops sending writes to the replicas, cancels and joins the sends
// in flight; what is still recorded or pending is dropped. Idempotent. The
// metrics stay registered.
func (r *Replicator) Close() {
	if r.ship != nil {
		r.ship.close()
	}
}
