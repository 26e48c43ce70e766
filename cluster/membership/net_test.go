package membership

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// testNet is a simulated network (simnet) for the tests that run inside a
// testing/synctest bubble, on virtual time (newTestNet), or in real time
// (newRealTimeNet): every node gets a host of its own, with its gossip
// transport on testPort. Unlike memberlist's
// MockNetwork it never blocks: a packet to a node that is gone or cut off
// is dropped, and a stream to one fails (refused) or waits (cut off) as
// over TCP.
type testNet struct {
	t    testing.TB
	net  *simnet.Network
	next int
}

// testPort is the gossip port of every simulated node.
const testPort = 7946

// newTestNet returns an empty network; call it inside synctest.Test, before
// starting nodes on it. When the test ends, after its nodes have closed
// (their cleanups run first), the network closes and virtual time passes
// for memberlist's probes to wait out their timeouts: time stops once the
// bubble's root goroutine has exited.
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	n := simnet.New(1, simnet.Config{PacketLatencyMin: 100 * time.Microsecond, PacketLatencyMax: time.Millisecond, StreamLatency: 100 * time.Microsecond})
	t.Cleanup(func() {
		n.Close()
		time.Sleep(10 * time.Second)
	})
	return &testNet{t: t, net: n}
}

// newRealTimeNet returns an empty network for a test outside a bubble, in
// real time: it closes when the test ends, and TestMain's leak check waits
// for memberlist's probes to end.
func newRealTimeNet(t testing.TB) *testNet {
	t.Helper()
	n := simnet.New(1, simnet.Config{PacketLatencyMin: 100 * time.Microsecond, PacketLatencyMax: time.Millisecond, StreamLatency: 100 * time.Microsecond})
	t.Cleanup(func() { n.Close() })
	return &testNet{t: t, net: n}
}

// reserve returns the gossip address of a fresh host, which has not been
// created yet: nothing answers there until transportAt creates it.
func (n *testNet) reserve() string {
	n.next++
	return net.JoinHostPort(fmt.Sprintf("10.0.%d.%d", n.next/250, n.next%250+1), strconv.Itoa(testPort))
}

// transport creates a transport on a fresh host.
func (n *testNet) transport() *simnet.Transport { return n.transportAt(n.reserve()) }

// transportAt creates the transport at addr (a reserved address).
func (n *testNet) transportAt(addr string) *simnet.Transport {
	n.t.Helper()
	ip, port := n.split(addr)
	h, err := n.net.Host(ip)
	if err != nil {
		n.t.Fatal(err)
	}
	tr, err := h.Transport(port)
	if err != nil {
		n.t.Fatal(err)
	}
	return tr
}

// partition splits the hosts of the addresses in groups from each other
// (and from every host not named), until heal.
func (n *testNet) partition(groups ...[]string) {
	n.t.Helper()
	var ips [][]string
	for _, g := range groups {
		var ipg []string
		for _, addr := range g {
			ip, _ := n.split(addr)
			ipg = append(ipg, ip)
		}
		ips = append(ips, ipg)
	}
	if err := n.net.Partition(ips...); err != nil {
		n.t.Fatal(err)
	}
}

// heal removes the partition.
func (n *testNet) heal() { n.net.Heal() }

func (n *testNet) split(addr string) (string, int) {
	n.t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		n.t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		n.t.Fatal(err)
	}
	return host, port
}
