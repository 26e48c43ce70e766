package main

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
)

// storeCollector exports a store's size and evictions. An evicted live
// window is a silent reset of that key's count, so each one is counted and
// logged (at most once a minute, with the number since the last line).
type storeCollector struct {
	store *bucket.Store
	log   *slog.Logger

	keys, bytes, expired, live *prometheus.Desc

	mu         sync.Mutex
	loggedLive uint64
	loggedAt   time.Time
}

func newStoreCollector(store *bucket.Store, log *slog.Logger) *storeCollector {
	return &storeCollector{
		store:   store,
		log:     log,
		keys:    prometheus.NewDesc("ringlimit_store_keys", "Counters held in memory on this node (live and not yet swept).", nil, nil),
		bytes:   prometheus.NewDesc("ringlimit_store_bytes", "Approximate memory of the counters on this node, as --max-store-bytes counts it (key bytes plus 100 per counter).", nil, nil),
		expired: prometheus.NewDesc("ringlimit_store_evictions_expired_total", "Expired counters removed to make room under --max-keys or --max-store-bytes.", nil, nil),
		live:    prometheus.NewDesc("ringlimit_store_evictions_live_total", "Live counters evicted under --max-keys or --max-store-bytes: each one resets that key's count.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.bytes
	ch <- c.expired
	ch <- c.live
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	expired, live := c.store.Evictions()
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(c.store.Len()))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(c.store.Bytes()))
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(expired))
	ch <- prometheus.MustNewConstMetric(c.live, prometheus.CounterValue, float64(live))
}

// check logs live evictions since the last line, at most once a minute.
// The serve loop calls it periodically.
func (c *storeCollector) check(now time.Time) {
	_, live := c.store.Evictions()
	c.mu.Lock()
	defer c.mu.Unlock()
	if live == c.loggedLive || now.Sub(c.loggedAt) < time.Minute {
		return
	}
	c.log.Warn("live counters evicted: --max-keys or --max-store-bytes is too small for the key space; their counts restarted from zero",
		"evicted", live-c.loggedLive, "evicted_total", live, "keys", c.store.Len())
	c.loggedLive, c.loggedAt = live, now
}
