package simnet_test

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

const gossipPort = 7946

// convergeLimit bounds a wait for gossip to converge. Usually it takes well
// under a second, but now and then (about 1 in 200 five-node joins) one
// node misses every retransmission of a new member's alive broadcast and
// learns of it only at its first push/pull, 30 to 60 s in (LAN
// PushPullInterval plus a random stagger).
const convergeLimit = 70 * time.Second

// mlCluster is a set of memberlist nodes on one simulated network.
type mlCluster struct {
	t     testing.TB
	net   *simnet.Network
	ips   []string
	lists []*memberlist.Memberlist
	logs  syncBuffer
}

// newMLCluster starts size memberlist nodes (LAN config) on 10.0.0.1...;
// they have not joined each other yet.
func newMLCluster(t testing.TB, net *simnet.Network, size int) *mlCluster {
	c := &mlCluster{t: t, net: net}
	for i := range size {
		ip := fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)
		c.ips = append(c.ips, ip)
		c.lists = append(c.lists, c.start(ip, 0))
	}
	return c
}

// start runs a memberlist node on ip; incarnation makes its name unique
// across restarts.
func (c *mlCluster) start(ip string, incarnation int) *memberlist.Memberlist {
	c.t.Helper()
	tr, err := mustHost(c.t, c.net, ip).Transport(gossipPort)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := memberlist.DefaultLANConfig()
	cfg.Name = ip + "/" + strconv.Itoa(incarnation)
	cfg.Transport = tr
	cfg.LogOutput = &c.logs
	list, err := memberlist.Create(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return list
}

func addr(ip string) string { return net.JoinHostPort(ip, strconv.Itoa(gossipPort)) }

// joinAll has every node but the first join the first.
func (c *mlCluster) joinAll() {
	c.t.Helper()
	for _, l := range c.lists[1:] {
		if _, err := l.Join([]string{addr(c.ips[0])}); err != nil {
			c.t.Fatal(err)
		}
	}
}

// waitMembers polls every 100 ms of virtual time until each listed node
// sees want members, and returns how long that took; it fails the test
// after limit.
func (c *mlCluster) waitMembers(idx []int, want int, limit time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	for {
		ok := true
		for _, i := range idx {
			ok = ok && c.lists[i].NumMembers() == want
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			var got []int
			for _, i := range idx {
				got = append(got, c.lists[i].NumMembers())
			}
			for _, i := range idx {
				var names []string
				for _, m := range c.lists[i].Members() {
					names = append(names, fmt.Sprintf("%s/%d", m.Name, m.State))
				}
				c.t.Logf("node %d sees %v", i, names)
			}
			c.t.Logf("stats %+v", c.net.Stats())
			c.t.Logf("log:\n%s", c.logs.String())
			c.t.Fatalf("after %v: members %v, want %d each", limit, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop shuts every node down, closes the network and lets memberlist's
// pending probe timers run out before the bubble ends.
func (c *mlCluster) stop() {
	for _, l := range c.lists {
		l.Shutdown()
	}
	c.net.Close()
	time.Sleep(5 * time.Second)
}

func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

func TestMemberlistConverges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{PacketLatencyMin: 200 * time.Microsecond, PacketLatencyMax: 2 * time.Millisecond, StreamLatency: time.Millisecond})
		c := newMLCluster(t, n, 5)
		defer c.stop()
		start := time.Now()
		c.joinAll()
		c.waitMembers(all(5), 5, convergeLimit)
		t.Logf("5 nodes converged in %v of virtual time", time.Since(start))
	})
}

func TestMemberlistDetectsCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(2, simnet.Config{PacketLatencyMin: 200 * time.Microsecond, PacketLatencyMax: 2 * time.Millisecond, StreamLatency: time.Millisecond})
		c := newMLCluster(t, n, 5)
		defer c.stop()
		c.joinAll()
		c.waitMembers(all(5), 5, convergeLimit)

		// LAN: a probe a second, then a suspicion of 4 s if others confirm
		// it: usually 6-8 s. A node that misses the others' dead
		// broadcasts finds out by its own probe, and without
		// confirmations its suspicion runs up to 6 x 4 s.
		must(t, n.Crash(c.ips[4]))
		d := c.waitMembers(all(4), 4, 35*time.Second)
		t.Logf("crash declared dead by the other 4 in %v of virtual time", d)

		// A new process on the restarted host, under a new name, joins.
		c.lists[4].Shutdown()
		must(t, n.Restart(c.ips[4]))
		c.lists[4] = c.start(c.ips[4], 1)
		if _, err := c.lists[4].Join([]string{addr(c.ips[0])}); err != nil {
			t.Fatal(err)
		}
		d = c.waitMembers(all(5), 5, convergeLimit)
		t.Logf("restarted node joined in %v", d)
	})
}

func TestMemberlistPartitionAndHeal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(3, simnet.Config{PacketLatencyMin: 200 * time.Microsecond, PacketLatencyMax: 2 * time.Millisecond, StreamLatency: time.Millisecond})
		c := newMLCluster(t, n, 5)
		defer c.stop()
		c.joinAll()
		c.waitMembers(all(5), 5, convergeLimit)

		// The smaller side gets few confirmations of its suspicions, so
		// they run close to the longest timeout (6 x 4 s), and failing
		// probes lower its awareness and slow its probing: 17-36 s here.
		must(t, n.Partition(c.ips[:2], c.ips[2:]))
		d1 := c.waitMembers([]int{0, 1}, 2, 60*time.Second)
		d2 := c.waitMembers([]int{2, 3, 4}, 3, 60*time.Second)
		t.Logf("partition seen: {a,b} after %v, {c,d,e} %v later", d1, d2)

		n.Heal()
		if _, err := c.lists[0].Join([]string{addr(c.ips[2])}); err != nil {
			t.Fatal(err)
		}
		d := c.waitMembers(all(5), 5, convergeLimit)
		t.Logf("one cluster again %v after heal and re-join", d)
	})
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
