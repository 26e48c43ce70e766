package simnet_test

import (
	"context"
	"net"
	"testing"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

func mustHost(t testing.TB, n *simnet.Network, ip string) *simnet.Host {
	t.Helper()
	h, err := n.Host(ip)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func mustListen(t testing.TB, h *simnet.Host, port int) net.Listener {
	t.Helper()
	l, err := h.Listen(port)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mustConnect dials from a to a listener l and returns both ends.
func mustConnect(t testing.TB, a *simnet.Host, l net.Listener) (client, server net.Conn) {
	t.Helper()
	c, err := a.Dial(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
