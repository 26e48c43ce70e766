package transport

import (
	"fmt"
	"math/bits"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/cluster/internal/promreg"
)

// fwdMetrics are the forwarder's Prometheus metrics. The fallback children
// are curried once so the hot path does no label lookup.
type fwdMetrics struct {
	forwarded   prometheus.Counter
	fallbacks   *prometheus.CounterVec
	fbTimeout   prometheus.Counter
	fbError     prometheus.Counter
	fbSuspect   prometheus.Counter
	fbUnknown   prometheus.Counter
	rpcDuration prometheus.Histogram
	batchSize   prometheus.Histogram
	expired     prometheus.Counter
	refused     prometheus.Counter
	rerouted    prometheus.Counter
	overLocal   prometheus.Counter
	relayed     prometheus.Counter

	// Quota leases (lease.go). decisions counts every op Apply decides;
	// leases and leaseHits what this node holds as an entry node (by
	// event), leaseGrants, leaseGranted and releases what it grants as an
	// owner.
	decisions     prometheus.Counter
	leasesVec     *prometheus.CounterVec
	leases        leaseEvents
	leaseHitsVec  *prometheus.CounterVec
	leaseHits     leaseEvents
	leaseRenewals prometheus.Counter
	leaseGrants   prometheus.Counter
	leaseGranted  prometheus.Counter
	releasesVec   *prometheus.CounterVec
	releases      struct{ taken, refused prometheus.Counter }
}

// leaseEvents are a lease counter's children, curried once. used is only
// set for hits.
type leaseEvents struct {
	granted, used, returned, expired prometheus.Counter
}

func newFwdMetrics(maxBatch int) fwdMetrics {
	m := fwdMetrics{
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_forwarded_decisions_total",
			Help: "Decisions answered by their owner node over the peer protocol.",
		}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_local_fallbacks_total",
			Help: "Decisions for keys another node owns that this node decided itself, by reason.",
		}, []string{"reason"}),
		rpcDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_peer_rpc_duration_seconds",
			Help:    "Duration of Decide round trips to peers (one batch on a DecideStream, or a Decide call), errors included.",
			Buckets: prometheus.ExponentialBucketsRange(50e-6, 50e-3, 11),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ringlimit_peer_batch_size",
			Help:    "Ops per Decide batch sent to a peer.",
			Buckets: prometheus.ExponentialBuckets(1, 2, bits.Len(uint(maxBatch-1))+1),
		}),
	}
	m.expired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_peer_expired_ops_total",
		Help: "Ops in Decide batches this node received after their sender's deadline and did not apply.",
	})
	m.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_peer_refused_ops_total",
		Help: "Ops in Decide batches this node refused while it re-synced its counters.",
	})
	m.overLocal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_hot_key_local_answers_total",
		Help: "Over-limit decisions answered by the entry node without a forward, because the key's owner had already answered it over the limit for this window.",
	})
	m.relayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_relayed_ops_total",
		Help: "Ops this node received while leaving the cluster, or just after joining it, and relayed to the keys' new or previous owners.",
	})
	m.rerouted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_rerouted_decisions_total",
		Help: "Decisions for keys whose owner was suspect or unknown, sent to (or taken by) the key's first healthy replica instead.",
	})
	m.decisions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_decisions_total",
		Help: "Decisions this node made for its callers, wherever they were taken. 1 - ringlimit_forwarded_decisions_total / this is the share taken at this node.",
	})
	m.leasesVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_leases_total",
		Help: "Quota leases this node held as an entry node, by event: granted (by a key's owner), returned (ended with unused quota the owner took back), expired (ended with unused quota that stayed counted as used).",
	}, []string{"event"})
	m.leaseHitsVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_leased_hits_total",
		Help: "Quota in hits of the leases this node held as an entry node, by event: granted, used (hits decided here from a lease), returned, expired.",
	}, []string{"event"})
	m.leases = leaseEvents{granted: m.leasesVec.WithLabelValues("granted"),
		returned: m.leasesVec.WithLabelValues("returned"), expired: m.leasesVec.WithLabelValues("expired")}
	m.leaseHits = leaseEvents{granted: m.leaseHitsVec.WithLabelValues("granted"), used: m.leaseHitsVec.WithLabelValues("used"),
		returned: m.leaseHitsVec.WithLabelValues("returned"), expired: m.leaseHitsVec.WithLabelValues("expired")}
	m.leaseRenewals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_lease_renewals_total",
		Help: "Leases this node asked to renew in the background because they ran low (a quarter left), without a caller waiting.",
	})
	m.leaseGrants = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_lease_grants_total",
		Help: "Quota leases this node granted to peers for keys it owns.",
	})
	m.leaseGranted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringlimit_lease_granted_hits_total",
		Help: "Quota in hits this node leased to peers for keys it owns (counted as used when granted).",
	})
	m.releasesVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_lease_releases_total",
		Help: "Releases of unused leased quota peers sent this node, by result: taken (given back to the key's counter) or refused (granted under an earlier lease epoch, or its window is over: the quota stays used).",
	}, []string{"result"})
	m.releases.taken = m.releasesVec.WithLabelValues("taken")
	m.releases.refused = m.releasesVec.WithLabelValues("refused")
	m.fbTimeout = m.fallbacks.WithLabelValues("timeout")
	m.fbError = m.fallbacks.WithLabelValues("error")
	m.fbSuspect = m.fallbacks.WithLabelValues("suspect")
	m.fbUnknown = m.fallbacks.WithLabelValues("unknown")
	return m
}

// collectors lists every metric.
func (m fwdMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.forwarded, m.fallbacks, m.rpcDuration, m.batchSize, m.expired, m.refused, m.rerouted, m.overLocal, m.relayed,
		m.decisions, m.leasesVec, m.leaseHitsVec, m.leaseRenewals, m.leaseGrants, m.leaseGranted, m.releasesVec}
}

// register registers every metric on r, or none of them.
func (m fwdMetrics) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	if err := promreg.RegisterAll(r, m.collectors()...); err != nil {
		return fmt.Errorf("transport: forwarder: register metrics: %w", err)
	}
	return nil
}
