package simnet_test

import (
	"flag"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

var wallTime = flag.Bool("simnet.walltime", false, "run TestClusterWallTime (about 1 s, 5 s with -race)")

// TestClusterWallTime measures the wall time a memberlist cluster takes to
// join and run for 33 virtual seconds (plus the 5 virtual seconds its
// shutdown waits). Run it with
//
//	go test -v -run WallTime ./cluster/simnet/ -simnet.walltime
func TestClusterWallTime(t *testing.T) {
	if !*wallTime {
		t.Skip("a measurement: run with -simnet.walltime")
	}
	for _, size := range []int{10, 50} {
		t.Run(fmt.Sprintf("nodes=%d", size), func(t *testing.T) {
			var low, high int
			var st simnet.Stats
			wall := time.Now()
			synctest.Test(t, func(t *testing.T) {
				n := simnet.New(uint64(size), simnet.Config{
					PacketLatencyMin: 200 * time.Microsecond,
					PacketLatencyMax: 2 * time.Millisecond,
					StreamLatency:    time.Millisecond,
				})
				start := time.Now()
				c := newMLCluster(t, n, size)
				defer c.stop()
				c.joinAll()
				time.Sleep(33*time.Second - time.Since(start))
				low, high = size, 0
				for _, l := range c.lists {
					low, high = min(low, l.NumMembers()), max(high, l.NumMembers())
				}
				st = n.Stats()
			})
			// Convergence is reported, not required: a node that missed a
			// join's broadcasts learns of it at a push/pull, which 50
			// nodes space 60 s apart.
			t.Logf("%d nodes, 33 virtual seconds: %v wall; members seen %d-%d; %+v",
				size, time.Since(wall).Round(time.Millisecond), low, high, st)
		})
	}
}
