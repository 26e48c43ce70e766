package simnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/nettest"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// TestConnConformance runs x/net's net.Conn suite, in real time (the suite
// calls t.Run, which a bubble forbids).
func TestConnConformance(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		n := simnet.New(1, simnet.Config{})
		a, _ := n.Host("10.0.0.1")
		b, _ := n.Host("10.0.0.2")
		l, err := b.Listen(80)
		if err != nil {
			return nil, nil, nil, err
		}
		c1, err = a.Dial(context.Background(), "10.0.0.2:80")
		if err != nil {
			return nil, nil, nil, err
		}
		c2, err = l.Accept()
		if err != nil {
			return nil, nil, nil, err
		}
		return c1, c2, func() { c1.Close(); c2.Close(); n.Close() }, nil
	})
}

func TestConnAddrs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		c, s := mustConnect(t, a, mustListen(t, b, 9000))
		la, ok := c.LocalAddr().(*net.TCPAddr)
		if !ok || la.IP.String() != "10.0.0.1" || la.Port == 0 {
			t.Errorf("client LocalAddr = %v", c.LocalAddr())
		}
		if c.RemoteAddr().String() != "10.0.0.2:9000" || s.LocalAddr().String() != "10.0.0.2:9000" {
			t.Errorf("addrs: client remote %v, server local %v", c.RemoteAddr(), s.LocalAddr())
		}
		if s.RemoteAddr().String() != c.LocalAddr().String() {
			t.Errorf("server RemoteAddr %v, client LocalAddr %v", s.RemoteAddr(), c.LocalAddr())
		}
	})
}

// A write returns at once within the buffer; the bytes arrive one
// StreamLatency later; a writer blocks once the buffer is full.
func TestConnLatencyAndBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lat = 10 * time.Millisecond
		n := simnet.New(1, simnet.Config{StreamLatency: lat, StreamBuffer: 100})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		start := time.Now()
		c, s := mustConnect(t, a, mustListen(t, b, 9000))
		if d := time.Since(start); d != 2*lat {
			t.Errorf("dial took %v, want a round trip, %v", d, 2*lat)
		}

		start = time.Now()
		if _, err := c.Write(make([]byte, 60)); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) != 0 {
			t.Errorf("write within the buffer blocked")
		}
		buf := make([]byte, 100)
		k, err := s.Read(buf)
		if err != nil || k != 60 || time.Since(start) != lat {
			t.Errorf("read %d, %v after %v; want 60 bytes after %v", k, err, time.Since(start), lat)
		}

		// 100 bytes fill the buffer; the next write waits for a read.
		if _, err := c.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		c.SetWriteDeadline(time.Now().Add(time.Second))
		start = time.Now()
		k, err = c.Write([]byte{1})
		if !isTimeout(err) || k != 0 || time.Since(start) != time.Second {
			t.Errorf("write to a full buffer: %d, %v after %v; want a timeout after 1s", k, err, time.Since(start))
		}
		c.SetWriteDeadline(time.Time{})
		done := make(chan error)
		go func() {
			_, err := c.Write([]byte{2})
			done <- err
		}()
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("write after a read made room: %v", err)
		}
		if _, err := io.ReadFull(s, buf[:1]); err != nil || buf[0] != 2 {
			t.Errorf("read %v, %v; want [2]", buf[:1], err)
		}
	})
}

// Close: the peer reads what was written, then EOF; the peer's writes then
// fail; local calls fail with net.ErrClosed.
func TestConnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{StreamLatency: time.Millisecond})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		c, s := mustConnect(t, a, mustListen(t, b, 9000))
		c.Write([]byte("hello"))
		must(t, c.Close())
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "hello" {
			t.Errorf("peer read %q, %v; want hello then EOF", got, err)
		}
		if _, err := s.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Errorf("write to a closed peer: %v, want EPIPE", err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Errorf("read after Close: %v, want net.ErrClosed", err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("write after Close: %v, want net.ErrClosed", err)
		}
		s.Close()
	})
}

func TestDialErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{StreamLatency: time.Millisecond})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		mustListen(t, b, 9000)
		ctx := context.Background()

		if _, err := a.Dial(ctx, "10.0.0.2:9001"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial to a closed port: %v, want ECONNREFUSED", err)
		}
		if _, err := a.Dial(ctx, "10.0.0.9:9000"); !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("dial to no host: %v, want EHOSTUNREACH", err)
		}
		if _, err := a.Dial(ctx, "nohost:9000"); err == nil {
			t.Errorf("dial to a name: no error")
		}

		// Partitioned: waits out the timeout; healed meanwhile: connects.
		must(t, n.Partition([]string{"10.0.0.1"}))
		start := time.Now()
		tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := a.Dial(tctx, "10.0.0.2:9000")
		cancel()
		if !isTimeout(err) || time.Since(start) != 3*time.Second {
			t.Errorf("dial across a partition: %v after %v; want a timeout after 3s", err, time.Since(start))
		}
		go func() {
			time.Sleep(time.Second)
			n.Heal()
		}()
		start = time.Now()
		c, err := a.Dial(ctx, "10.0.0.2:9000")
		if err != nil || time.Since(start) != time.Second+2*time.Millisecond {
			t.Errorf("dial healed after 1s: %v after %v", err, time.Since(start))
		} else {
			c.Close()
		}

		// Crashed: refused at once; restarted: the port is free again.
		must(t, n.Crash("10.0.0.2"))
		start = time.Now()
		if _, err := a.Dial(ctx, "10.0.0.2:9000"); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) != 0 {
			t.Errorf("dial to a crashed host: %v after %v; want ECONNREFUSED at once", err, time.Since(start))
		}
		if _, err := b.Listen(9000); err == nil {
			t.Errorf("listen on a down host: no error")
		}
		must(t, n.Restart("10.0.0.2"))
		mustListen(t, b, 9000)
		if _, err := b.Listen(9000); !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("second listen on a port: %v, want EADDRINUSE", err)
		}
	})
}

// Bytes across a partition are held, then delivered in order at Heal.
func TestConnPartitionHoldsBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{StreamLatency: 5 * time.Millisecond})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		c, s := mustConnect(t, a, mustListen(t, b, 9000))
		must(t, n.Partition([]string{"10.0.0.1"}, []string{"10.0.0.2"}))
		for i := range 10 {
			if _, err := c.Write([]byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		s.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := s.Read(make([]byte, 1)); !isTimeout(err) {
			t.Fatalf("read across a partition: %v, want a timeout", err)
		}
		s.SetReadDeadline(time.Time{})
		n.Heal()
		got := make([]byte, 10)
		if _, err := io.ReadFull(s, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
			t.Errorf("after heal read %v", got)
		}
	})
}

// A crash resets the connections of the crashed host, both ends, at once.
func TestConnCrashResets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{StreamLatency: 5 * time.Millisecond})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		l := mustListen(t, b, 9000)
		c, s := mustConnect(t, a, l)
		errc := make(chan error)
		go func() {
			_, err := c.Read(make([]byte, 1))
			errc <- err
		}()
		go func() {
			_, err := l.Accept()
			errc <- err
		}()
		time.Sleep(time.Second)
		must(t, n.Crash("10.0.0.2"))
		for range 2 {
			if err := <-errc; !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, net.ErrClosed) {
				t.Errorf("blocked call on crash: %v", err)
			}
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("write after the peer crashed: %v, want ECONNRESET", err)
		}
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read on the crashed host: %v, want ECONNRESET", err)
		}
		must(t, c.Close())
	})
}

// Network.Close ends every blocked call.
func TestNetworkCloseUnblocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{})
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		l := mustListen(t, b, 9000)
		c, _ := mustConnect(t, a, l)
		must(t, n.Partition([]string{"10.0.0.1"}))
		errc := make(chan error, 3)
		go func() { _, err := c.Read(make([]byte, 1)); errc <- err }()
		go func() { _, err := l.Accept(); errc <- err }()
		go func() { _, err := a.Dial(context.Background(), "10.0.0.2:9000"); errc <- err }()
		synctest.Wait()
		must(t, n.Close())
		for range 3 {
			if err := <-errc; err == nil {
				t.Errorf("blocked call returned no error at Close")
			}
		}
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && errors.Is(err, os.ErrDeadlineExceeded)
}
