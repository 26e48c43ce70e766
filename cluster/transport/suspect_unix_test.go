//go:build unix

package transport

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// fwdRefusingAddr returns a loopback address whose connections are refused
// for the whole test: a socket bound to the port but not listening, so that
// no other listener (another test's :0) can take the port meanwhile.
func fwdRefusingAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// TestForwardRefusedPeerStaysSuspect: a peer whose connection is refused (a
// crashed process) stays suspect past SuspectFor while its probes fail, so
// entry nodes keep sending its keys to their replicas instead of deciding
// another batch on their own counters every SuspectFor until memberlist
// declares it dead.
func TestForwardRefusedPeerStaysSuspect(t *testing.T) {
	addr := fwdRefusingAddr(t)
	const suspectFor = 300 * time.Millisecond
	nodes := fwdStartCluster(t, []string{"a"}, map[string]string{"b": addr}, func(c *ForwarderConfig) {
		c.Timeout = 30 * time.Millisecond
		c.SuspectFor = suspectFor
	})
	a := nodes["a"]
	fwdMakeSuspect(t, a, "b/1")
	// SuspectFor has passed on a's clock: the suspicion must hold through
	// several probes all the same.
	a.clock.Add(4 * suspectFor)
	end := time.Now().Add(4 * suspectFor)
	for time.Now().Before(end) {
		if s := a.f.Suspects(); len(s) != 1 {
			t.Fatalf("Suspects() = %v while b refuses connections, want [b]", s)
		}
		time.Sleep(20 * time.Millisecond) // sampling a state that must not change
	}
}
