package replication

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// Bounds and windows of these tests.
const (
	// quick bounds a wait for what takes milliseconds on an idle machine:
	// generous, as a busy -race run stalls for seconds at times.
	quick = 20 * time.Second
	// dayUnit is the window of the limits these tests count under in real
	// time: a day, so that counts taken over the seconds a test runs
	// almost never straddle a window edge.
	dayUnit = 24 * time.Hour
)

// replWindow is the start of the current dayUnit window (Unix ns).
func replWindow() int64 {
	now := time.Now().UnixNano()
	return now - now%int64(dayUnit)
}

// The shipper sends each key's latest state to its replicas only,
// retries a destination that failed, and never sends to itself.
func TestShipperCoalescesAndRetries(t *testing.T) {
	rg, err := ring.New([]string{"a", "b", "c"}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]*testkit.ReplicaPeer{
		"b": testkit.NewReplicaPeer(0, true),
		"c": testkit.NewReplicaPeer(0, false),
	}
	r := &shipper{
		self:     "a",
		replicas: 2,
		log:      newWriteLog(),
		interval: time.Millisecond,
		targets:  func() *ring.Ring { return rg },
		conns: connsFunc(func(id string) peerpb.PeerClient {
			if p := peers[id]; p != nil {
				return p
			}
			return nil
		}),
		m:      newMetrics(),
		logger: slog.New(slog.DiscardHandler),
	}
	r.start()
	defer r.close()
	const keys = 50
	for k := range keys {
		key := []byte{'k', byte(k)}
		for c := uint64(1); c <= 5; c++ {
			r.log.record(key, bucket.State{Window: int64(time.Hour), Unit: int64(time.Hour), Count: c})
		}
	}
	// b refuses sends while it is down: flush says so (a drain reports
	// it), and the writes wait for a retry.
	if err := r.flush(context.Background()); err == nil || !strings.Contains(err.Error(), "not delivered") {
		t.Fatalf("flush with a failing replica: %v, want writes not delivered", err)
	}
	peers["b"].SetDown(false)
	// The background retry or a forced send delivers them now.
	testkit.WaitFor(t, quick, "a flush to deliver everything", func() bool { return r.flush(context.Background()) == nil })
	for k := range keys {
		key := []byte{'k', byte(k)}
		succ := rg.Successors(key, 2, nil)
		for id, p := range peers {
			st, _ := p.State(string(key))
			switch want := slices.Contains(succ, id); {
			case want && st.Count != 5:
				t.Errorf("key %d: %s holds %+v, want count 5", k, id, st)
			case !want && st.Count != 0:
				t.Errorf("key %d: %s is no replica but holds %+v", k, id, st)
			}
		}
	}
	if got := testCounterValue(t, r.m.sent); got == 0 {
		t.Error("no entry counted as sent")
	}
	if got := testCounterValue(t, r.m.rpcErrors); got < 1 {
		t.Errorf("%v RPC errors counted, want at least the first", got)
	}
}

// testCounterValue reads one counter.
func testCounterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v", err)
	}
	return mfs[0].GetMetric()[0].GetCounter().GetValue()
}
