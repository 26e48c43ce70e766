package sim

import (
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

var flagScale = flag.Bool("sim.scale", false, "run TestSimScale: membership convergence, key movement and ring balance at 10, 25 and 50 nodes")

// TestSimScale measures, at 10, 25 and 50 nodes on the simulated network,
// how long after one node joins (and after one leaves gracefully) every
// node routes by the same ring; and, through the ring package, the share of
// 100,000 keys whose owner that join and that leave move, and the ring's
// balance (the most keys one node owns over the mean). Run it with
//
//	go test -v -run TestSimScale ./chaos/sim/ -sim.scale
func TestSimScale(t *testing.T) {
	if !*flagScale {
		t.Skip("a measurement: run with -sim.scale")
	}
	const sample = 100_000
	keys := make([][]byte, sample)
	for i := range keys {
		keys[i] = []byte("key-" + strconv.Itoa(i))
	}
	var rows []string
	for _, n := range []int{10, 25, 50} {
		var formed, join, leave time.Duration
		wall := time.Now()
		synctest.Test(t, func(t *testing.T) {
			formed, join, leave = scaleRun(t, n)
		})
		wallTime := time.Since(wall)

		ids := make([]string, n+1)
		for i := range ids {
			ids[i] = NodeID(i)
		}
		before, joined, left := mustRing(t, ids[:n]), mustRing(t, ids), mustRing(t, ids[1:])
		jAll, jOthers := moved(keys, before, joined, ids[n])
		lAll, lOthers := moved(keys, joined, left, ids[0])
		row := fmt.Sprintf("| %d | %v | %v | %v | %.1f%% (%.1f%%) | %.1f%% (%.1f%%) | %.3f | %v |", n,
			formed.Round(time.Millisecond), join.Round(time.Millisecond), leave.Round(time.Millisecond),
			100*jAll, 100*jOthers, 100*lAll, 100*lOthers, balance(keys, before),
			wallTime.Round(100*time.Millisecond))
		t.Log(row)
		rows = append(rows, row)
	}
	fmt.Println("| nodes | cluster formed | rings agree after a join | rings agree after a graceful leave | keys moved by the join (between others) | keys moved by the leave (between others) | balance (max/mean keys per node) | wall time |")
	fmt.Println("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rows {
		fmt.Println(r)
	}
}

// scaleRun starts n nodes, waits for them to agree, then starts one more
// and drains the first, and returns how long each took to converge, in
// virtual time.
func scaleRun(t *testing.T, n int) (formed, join, leave time.Duration) {
	s := &Schedule{Seed: 1, Initial: n, Hosts: n + 1,
		LatencyMin: 200 * time.Microsecond, LatencyMax: 2 * time.Millisecond, StreamLatency: 500 * time.Microsecond}
	logs := &syncBuffer{}
	c, err := newCluster(s, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})), NoBreak)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	wait := func(what string) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			ok, why := c.converged()
			if ok {
				return time.Since(start)
			}
			if time.Since(start) > 2*time.Minute {
				t.Fatalf("%d nodes, %s: not converged after 2m: %s\n%s", n, what, why, Tail(logs.String(), 40))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i := range n {
		if err := c.startNode(i); err != nil {
			t.Fatal(err)
		}
	}
	formed = wait("forming")
	time.Sleep(5 * time.Second) // the join relays of the start end
	if err := c.startNode(n); err != nil {
		t.Fatal(err)
	}
	join = wait("join")
	time.Sleep(5 * time.Second)
	c.drain(0, func(time.Duration) {})
	leave = wait("leave")
	return formed, join, leave
}

func mustRing(t *testing.T, ids []string) *ring.Ring {
	t.Helper()
	r, err := ring.New(ids, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// moved returns the share of keys whose owner differs between a and b,
// and the share that moves between two members other than changed.
func moved(keys [][]byte, a, b *ring.Ring, changed string) (all, others float64) {
	var n, o int
	for _, k := range keys {
		x, _ := a.Owner(k)
		y, _ := b.Owner(k)
		if x != y {
			n++
			if x != changed && y != changed {
				o++
			}
		}
	}
	return float64(n) / float64(len(keys)), float64(o) / float64(len(keys))
}

// balance returns the most keys one member of r owns over the mean.
func balance(keys [][]byte, r *ring.Ring) float64 {
	count := map[string]int{}
	for _, k := range keys {
		id, _ := r.Owner(k)
		count[id]++
	}
	most := slices.Max(slices.Collect(maps.Values(count)))
	return float64(most) * float64(r.Len()) / float64(len(keys))
}
