package sim

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// member is one host of the simulated cluster and the node process on it.
// Only the goroutine that drives the run touches it, except done, which
// the goroutine stopping its process closes.
type member struct {
	idx  int
	id   string
	host *simnet.Host
	clk  *clock.Freezable // the current process's clock (frozen with the host)
	node *simNode         // the current process; nil before the first start
	done chan struct{}    // closed once the current process has stopped
	// live: the process runs and was neither drained nor killed.
	live   bool
	frozen bool
}

// simCluster is a ringlimit cluster on a simulated network. Its methods
// are called from one goroutine, inside the run's synctest bubble.
type simCluster struct {
	net     *simnet.Network
	members []*member
	log     *slog.Logger
	brk     Break
	start   time.Time
	stops   sync.WaitGroup // drains and kills in progress
	procs   []*simNode     // every node process started, stopped ones included
	dropped atomic.Uint64  // lease grants BreakLease stores did not count
}

func newCluster(s *Schedule, log *slog.Logger, brk Break) (*simCluster, error) {
	c := &simCluster{
		net: simnet.New(s.Seed, simnet.Config{
			PacketLatencyMin: s.LatencyMin,
			PacketLatencyMax: s.LatencyMax,
			StreamLatency:    s.StreamLatency,
			Loss:             s.Loss,
		}),
		log:   log,
		brk:   brk,
		start: time.Now(),
	}
	for i := range s.Hosts {
		h, err := c.net.Host(HostIP(i))
		if err != nil {
			return nil, err
		}
		c.members = append(c.members, &member{idx: i, id: NodeID(i), host: h})
	}
	return c, nil
}

func (c *simCluster) since() time.Duration { return time.Since(c.start) }

// joinList is what a starting node joins, as a headless Service would
// resolve: the gossip addresses of up to three live nodes, lowest first.
func (c *simCluster) joinList(self int) []string {
	var out []string
	for _, m := range c.members {
		if m.idx != self && m.live && len(out) < 3 {
			out = append(out, net.JoinHostPort(m.host.IP(), strconv.Itoa(gossipPort)))
		}
	}
	return out
}

// startNode starts host i's node: the first time, or again after a crash
// (same identity, same address).
func (c *simCluster) startNode(i int) error {
	m := c.members[i]
	if m.node != nil {
		<-m.done // the killed process's goroutines
		if err := c.net.Restart(m.host.IP()); err != nil {
			return err
		}
	}
	m.clk = clock.NewFreezable(nil)
	n, err := startNode(nodeSpec{
		ID:      m.id,
		Host:    m.host,
		Join:    c.joinList(i),
		Clock:   m.clk,
		Logger:  c.log.With("node", m.id),
		Break:   c.brk,
		Dropped: &c.dropped,
	})
	if err != nil {
		return err
	}
	c.procs = append(c.procs, n)
	m.node, m.done, m.live, m.frozen = n, make(chan struct{}), true, false
	return nil
}

// drain stops host i's node as SIGTERM does, in the background, and calls
// done with the time it finished.
func (c *simCluster) drain(i int, done func(time.Duration)) {
	m := c.members[i]
	m.live = false
	n, stopped := m.node, m.done
	c.stops.Go(func() {
		if err := n.drain(); err != nil {
			c.log.Warn("sim: drain incomplete", "node", n.id, "err", err)
		}
		done(c.since())
		close(stopped)
	})
}

// crash kills host i's node: the host goes down at once; the process's
// goroutines are stopped in the background.
func (c *simCluster) crash(i int) error {
	m := c.members[i]
	if err := c.net.Crash(m.host.IP()); err != nil {
		return err
	}
	m.live, m.frozen = false, false
	m.clk.Thaw()
	n, stopped := m.node, m.done
	c.stops.Go(func() {
		n.stop()
		close(stopped)
	})
	return nil
}

func (c *simCluster) freeze(i int) error {
	m := c.members[i]
	if err := c.net.Freeze(m.host.IP()); err != nil {
		return err
	}
	m.clk.Freeze()
	m.frozen = true
	return nil
}

func (c *simCluster) thaw(i int) error {
	m := c.members[i]
	if !m.frozen {
		return nil
	}
	if err := c.net.Thaw(m.host.IP()); err != nil {
		return err
	}
	m.clk.Thaw()
	m.frozen = false
	return nil
}

func (c *simCluster) split(sides [][]int) error {
	var groups [][]string
	for _, side := range sides {
		var g []string
		for _, i := range side {
			g = append(g, c.members[i].host.IP())
		}
		groups = append(groups, g)
	}
	return c.net.Partition(groups...)
}

func (c *simCluster) healAll() error {
	c.net.Heal()
	for _, m := range c.members {
		if err := c.thaw(m.idx); err != nil {
			return err
		}
	}
	return nil
}

// reachable appends the members Envoys may call now to dst: live, not
// frozen, and ready by their /healthcheck.
func (c *simCluster) reachable(dst []*member) []*member {
	for _, m := range c.members {
		if m.live && !m.frozen && m.node.ready() {
			dst = append(dst, m)
		}
	}
	return dst
}

// converged reports whether every live node is ready and routes by the
// ring of exactly the live nodes; if not, it says what differs.
func (c *simCluster) converged() (bool, string) {
	var want []string
	for _, m := range c.members {
		if m.live {
			want = append(want, m.id)
		}
	}
	slices.Sort(want)
	var diffs []string
	for _, m := range c.members {
		if !m.live {
			continue
		}
		st, err := m.node.status()
		switch {
		case err != nil:
			diffs = append(diffs, err.Error())
		case !st.Ready:
			diffs = append(diffs, m.id+" not ready")
		case !slices.Equal(st.Ring, want):
			diffs = append(diffs, fmt.Sprintf("%s routes by %v", m.id, st.Ring))
		}
	}
	if len(diffs) > 0 {
		return false, fmt.Sprintf("want every node ready with ring %v: %s", want, strings.Join(diffs, "; "))
	}
	return true, ""
}

// rings returns each live node's ring.
func (c *simCluster) rings() map[string][]string {
	out := map[string][]string{}
	for _, m := range c.members {
		if m.live {
			if st, err := m.node.status(); err == nil {
				out[m.id] = st.Ring
			}
		}
	}
	return out
}

// leases sums LeaseStats over every node process the run started.
func (c *simCluster) leases() (LeaseStats, error) {
	st := LeaseStats{Uncounted: c.dropped.Load()}
	for _, n := range c.procs {
		if err := n.leases(&st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// close stops everything the cluster started: it waits for the drains and
// kills in progress, closes the network (which fails every send and dial
// from then on, so nothing waits on a peer), stops every node still
// running, and lets virtual time pass for the timers memberlist's probes
// still wait on.
func (c *simCluster) close() {
	c.stops.Wait()
	c.net.Close()
	var wg sync.WaitGroup
	for _, m := range c.members {
		if m.live {
			m.live = false
			m.clk.Thaw()
			wg.Go(m.node.stop)
		}
	}
	wg.Wait()
	time.Sleep(10 * time.Second)
}
