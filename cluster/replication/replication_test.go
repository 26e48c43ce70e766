package replication

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// New refuses a config it cannot run with, registers its metrics once,
// and runs without replicas (Flush has nothing to send).
func TestNewConfig(t *testing.T) {
	store := bucket.NewStore(bucket.StoreConfig{})
	rg, err := ring.New(nil, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	current := func() *ring.Ring { return rg }
	none := connsFunc(func(string) peerpb.PeerClient { return nil })
	ok := Config{Self: "a", Replicas: 2, Recorder: NewRecorder(store, true), SyncTimeout: time.Second,
		Ring: current, Targets: current, Conns: none}
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"no self", func(c *Config) { c.Self = "" }},
		{"no replicas", func(c *Config) { c.Replicas = 0 }},
		{"no recorder", func(c *Config) { c.Recorder = nil }},
		{"replicas without a recording recorder", func(c *Config) { c.Recorder = NewRecorder(store, false) }},
		{"replicas without targets", func(c *Config) { c.Targets = nil }},
		{"no conns", func(c *Config) { c.Conns = nil }},
		{"no ring", func(c *Config) { c.Ring = nil }},
		{"negative interval", func(c *Config) { c.Interval = -time.Second }},
		{"no sync timeout", func(c *Config) { c.SyncTimeout = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			if r, err := New(cfg); err == nil {
				r.Close()
				t.Fatal("New succeeded")
			}
		})
	}

	reg := prometheus.NewRegistry()
	one := Config{Self: "a", Replicas: 1, Recorder: NewRecorder(store, false), SyncTimeout: time.Second,
		Ring: current, Conns: none, Registerer: reg}
	r, err := New(one)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Flush(t.Context()); err != nil {
		t.Errorf("Flush without replicas: %v", err)
	}
	before, err := reg.Gather()
	if err != nil || len(before) == 0 {
		t.Fatalf("gathered %d metric families (err %v)", len(before), err)
	}
	if _, err := New(one); err == nil {
		t.Error("a second Replicator on the same registry: want an error")
	}
	// The failed registration must not have left half its metrics behind.
	if after, err := reg.Gather(); err != nil || len(after) != len(before) {
		t.Errorf("gathered %d metric families after a failed New (err %v), want %d", len(after), err, len(before))
	}
}
