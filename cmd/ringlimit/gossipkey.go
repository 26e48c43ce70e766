package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/rls"
)

// readGossipKeys reads --gossip-key-file: one base64 AES key (16, 24 or 32
// bytes, as `openssl rand -base64 32` writes) per line, blank lines and
// lines starting with # ignored. The first key is the primary. Errors name
// the flag, the file and the line.
func readGossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("serve: --gossip-key-file: %w", err)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return nil, fmt.Errorf("serve: --gossip-key-file: %s:%d: not base64: %w", path, line, err)
		}
		switch len(key) {
		case 16, 24, 32:
		default:
			return nil, fmt.Errorf("serve: --gossip-key-file: %s:%d: key is %d bytes, want 16, 24 or 32", path, line, len(key))
		}
		keys = append(keys, key)
	}
	if err := sc.Err(); err != nil { // a line over 64 KiB
		return nil, fmt.Errorf("serve: --gossip-key-file: %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("serve: --gossip-key-file: %s: no key (want one base64 key per line, the first one primary)", path)
	}
	return keys, nil
}

// fingerprints names keys by membership.KeyFingerprint, in order.
func fingerprints(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = membership.KeyFingerprint(k)
	}
	return out
}

// gossipKeyWatcher reloads --gossip-key-file when it changes and installs
// its keys in the running membership (SetKeys): a file that does not read
// or parse is logged and counted, and the keys in use stay. It owns the
// file watcher, stopped by close.
type gossipKeyWatcher struct {
	path   string
	m      *membership.Membership
	log    *slog.Logger
	w      *rls.Watcher
	errors atomic.Uint64
	mu     sync.Mutex // serialises reloads (SetKeys calls may not overlap)

	keysDesc, errorsDesc *prometheus.Desc
}

// watchGossipKeys starts watching path for m, whose keys were read from it
// at start, and registers the keyring's metrics on reg (nil: none). Once
// the watch is on it reads the file again, for a change made since the
// keys were read raised no event it sees.
func watchGossipKeys(path string, m *membership.Membership, reg prometheus.Registerer, log *slog.Logger) (*gossipKeyWatcher, error) {
	g := &gossipKeyWatcher{
		path: path, m: m, log: log,
		keysDesc: prometheus.NewDesc("ringlimit_gossip_keys", "Gossip keys this node holds, by fingerprint (first 8 hex digits of the key's SHA-256); primary=\"true\" on the one that encrypts what it sends. Always 1.",
			[]string{"fingerprint", "primary"}, nil),
		errorsDesc: prometheus.NewDesc("ringlimit_gossip_key_reload_errors_total", "Changes of --gossip-key-file that did not read, parse or apply; the keys in use stayed.", nil, nil),
	}
	w, err := rls.NewFileWatcher(path, g.reload, func(err error) {
		log.Warn("cluster: watching --gossip-key-file", "err", err)
	})
	if err != nil {
		return nil, fmt.Errorf("serve: --gossip-key-file: %w", err)
	}
	g.w = w
	if reg != nil {
		if err := reg.Register(g); err != nil {
			w.Close()
			return nil, fmt.Errorf("serve: gossip key metrics: %w", err)
		}
	}
	g.reload()
	return g, nil
}

// reload reads the file again and applies it when its keys differ from
// those in use.
func (g *gossipKeyWatcher) reload() {
	g.mu.Lock()
	defer g.mu.Unlock()
	keys, err := readGossipKeys(g.path)
	if err == nil {
		fps := fingerprints(keys)
		cur := g.m.KeyFingerprints()
		if len(cur) > 0 && fps[0] == cur[0] && sameSet(fps, cur) {
			return // rewritten with the same keys, or a touch
		}
		if err = g.m.SetKeys(keys); err == nil {
			g.log.Info("cluster: gossip keys reloaded", "primary", fps[0], "keys", g.m.KeyFingerprints())
			return
		}
	}
	g.errors.Add(1)
	g.log.Warn("cluster: --gossip-key-file changed but cannot be used; keeping the gossip keys in use", "err", err, "keys", g.m.KeyFingerprints())
}

// sameSet reports whether a and b hold the same strings, ignoring order and
// repeats.
func sameSet(a, b []string) bool {
	for _, s := range a {
		if !slices.Contains(b, s) {
			return false
		}
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			return false
		}
	}
	return true
}

// Describe implements prometheus.Collector.
func (g *gossipKeyWatcher) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.keysDesc
	ch <- g.errorsDesc
}

// Collect implements prometheus.Collector.
func (g *gossipKeyWatcher) Collect(ch chan<- prometheus.Metric) {
	for i, fp := range g.m.KeyFingerprints() {
		ch <- prometheus.MustNewConstMetric(g.keysDesc, prometheus.GaugeValue, 1, fp, fmt.Sprint(i == 0))
	}
	ch <- prometheus.MustNewConstMetric(g.errorsDesc, prometheus.CounterValue, float64(g.errors.Load()))
}

// close stops watching the file.
func (g *gossipKeyWatcher) close() { g.w.Close() }
