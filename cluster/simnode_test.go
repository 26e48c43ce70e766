package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// simCluster runs nodes inside one synctest bubble on a simulated network:
// real memberlist (LAN timing), real gRPC, virtual time. Each node has its
// own host and its own freezable clock.
type simCluster struct {
	t     *testing.T
	net   *simnet.Network
	hosts map[string]string // host name (by default the node ID) -> IP
}

// Ports every simulated node uses on its host.
const (
	simGossipPort = 7946
	simGRPCPort   = 8081
)

// newSimCluster returns an empty cluster; call it inside synctest.Test. The
// network closes when the test ends, after every node has stopped, and
// virtual time then passes for memberlist's probes to wait out their
// timeouts.
func newSimCluster(t *testing.T) *simCluster {
	net := simnet.New(1, simnet.Config{PacketLatencyMin: 100 * time.Microsecond, PacketLatencyMax: time.Millisecond, StreamLatency: 100 * time.Microsecond})
	t.Cleanup(func() {
		net.Close()
		time.Sleep(10 * time.Second)
	})
	return &simCluster{t: t, net: net, hosts: map[string]string{}}
}

// start runs node id on the host named id (a new one, or the one it had:
// a restart keeps its address), joining the nodes of join (IDs), with the
// LAN timing changed by tweak.
func (c *simCluster) start(id string, join []string, tweak func(*NodeConfig)) *nodeTestNode {
	c.t.Helper()
	return c.startAt(id, id, join, tweak)
}

// startAt is start on the host named host.
func (c *simCluster) startAt(hostName, id string, join []string, tweak func(*NodeConfig)) *nodeTestNode {
	c.t.Helper()
	ip := c.ip(hostName)
	host, err := c.net.Host(ip)
	if err != nil {
		c.t.Fatal(err)
	}
	tr, err := host.Transport(simGossipPort)
	if err != nil {
		c.t.Fatal(err)
	}
	lis, err := host.Listen(simGRPCPort)
	if err != nil {
		c.t.Fatal(err)
	}
	var seeds []string
	for _, j := range join {
		seeds = append(seeds, fmt.Sprintf("%s:%d", c.hosts[j], simGossipPort))
	}
	tn := &nodeTestNode{
		id:    id,
		store: bucket.NewStore(bucket.StoreConfig{}),
		reg:   prometheus.NewRegistry(),
		logs:  &testkit.LogSink{},
		clock: clock.NewFreezable(nil),
	}
	cfg := testConfig(tn, membership.Config{
		ID:        id,
		GRPCAddr:  fmt.Sprintf("%s:%d", ip, simGRPCPort),
		Transport: tr,
		Join:      seeds,
	})
	cfg.Clock = tn.clock
	cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(host.Dial), grpc.WithTransportCredentials(insecure.NewCredentials())}
	tn.dial = cfg.DialOptions
	return runNode(c.t, tn, cfg, lis, tweak)
}

// ip returns the IP of the host named name, giving it the next one.
func (c *simCluster) ip(name string) string {
	ip, ok := c.hosts[name]
	if !ok {
		ip = fmt.Sprintf("10.0.0.%d", len(c.hosts)+1)
		c.hosts[name] = ip
	}
	return ip
}

// crash kills n as SIGKILL would: its host's connections reset and its
// address refuses, its process stops without a word; the host can be
// started on again.
func (c *simCluster) crash(n *nodeTestNode, host string) {
	c.t.Helper()
	if err := c.net.Crash(c.ip(host)); err != nil {
		c.t.Fatal(err)
	}
	n.stop()
	if err := c.net.Restart(c.ip(host)); err != nil {
		c.t.Fatal(err)
	}
}

// cluster starts ids, each joining the first, and waits until every node is
// ready with all of them in its ring.
func (c *simCluster) cluster(ids []string, tweak func(*NodeConfig)) []*nodeTestNode {
	c.t.Helper()
	var nodes []*nodeTestNode
	for i, id := range ids {
		nodes = append(nodes, c.start(id, ids[:min(i, 1)], tweak))
	}
	nodeWaitRing(c.t, nodes, nodes)
	return nodes
}

// freeze stops n as SIGSTOP would: its clock's timers and its network
// traffic are held until thaw.
func (c *simCluster) freeze(n *nodeTestNode) {
	c.t.Helper()
	n.clock.Freeze()
	if err := c.net.Freeze(c.hosts[n.id]); err != nil {
		c.t.Fatal(err)
	}
}

// thaw continues a frozen node.
func (c *simCluster) thaw(n *nodeTestNode) {
	c.t.Helper()
	if err := c.net.Thaw(c.hosts[n.id]); err != nil {
		c.t.Fatal(err)
	}
	n.clock.Thaw()
}
