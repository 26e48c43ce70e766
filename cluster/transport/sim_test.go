package transport

import (
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// fwdSim is a simulated network for the tests that run inside a
// testing/synctest bubble, on virtual time: every node, fake peer, proxy
// and test client gets a host of its own.
type fwdSim struct {
	t     testing.TB
	net   *simnet.Network
	hosts int
}

// fwdSimPort is the port nodes and fake peers listen on.
const fwdSimPort = 8081

// newFwdSim returns an empty network; call it inside synctest.Test. The
// network closes when the test ends, after everything started on it (whose
// cleanups run first) has stopped, and virtual time then passes for what
// is still winding down (a handler a stopped server left sleeping): time
// stops once the bubble's root goroutine has exited.
func newFwdSim(t testing.TB) *fwdSim {
	t.Helper()
	n := simnet.New(1, simnet.Config{StreamLatency: 100 * time.Microsecond})
	t.Cleanup(func() {
		n.Close()
		time.Sleep(10 * time.Second)
	})
	return &fwdSim{t: t, net: n}
}

// host returns a new host.
func (s *fwdSim) host() *simnet.Host {
	s.t.Helper()
	s.hosts++
	h, err := s.net.Host(fmt.Sprintf("10.0.%d.%d", s.hosts/250, s.hosts%250))
	if err != nil {
		s.t.Fatal(err)
	}
	return h
}

// listen returns a listener on fwdSimPort of a new host, and the host.
func (s *fwdSim) listen() (net.Listener, *simnet.Host) {
	s.t.Helper()
	h := s.host()
	l, err := h.Listen(fwdSimPort)
	if err != nil {
		s.t.Fatal(err)
	}
	return l, h
}

// dialFrom returns the options of a gRPC client on h.
func (s *fwdSim) dialFrom(h *simnet.Host) []grpc.DialOption {
	return []grpc.DialOption{grpc.WithContextDialer(h.Dial), grpc.WithTransportCredentials(insecure.NewCredentials())}
}

// refusing returns an address whose connections are refused: a live host
// with nothing listening on the port, as a crashed process's.
func (s *fwdSim) refusing() string {
	return net.JoinHostPort(s.host().IP(), fmt.Sprint(fwdSimPort))
}
