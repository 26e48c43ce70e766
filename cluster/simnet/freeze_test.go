package simnet_test

import (
	"bytes"
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// A frozen host's packets and stream bytes, both ways, are held and
// delivered at thaw; packets beyond the bound are dropped; its listener
// accepts nothing until thaw.
func TestFreezeHoldsTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lat = time.Millisecond
		n := simnet.New(5, simnet.Config{PacketLatencyMin: lat, PacketLatencyMax: lat, StreamLatency: lat, FrozenPackets: 8})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		ta, err := a.Transport(7946)
		must(t, err)
		tb, err := b.Transport(7946)
		must(t, err)
		defer ta.Shutdown()
		defer tb.Shutdown()
		c, s := mustConnect(t, a, mustListen(t, b, 9000))
		l2 := mustListen(t, b, 9001)

		must(t, n.Freeze("10.0.0.2"))
		for i := range 3 {
			tb.WriteTo([]byte{100 + byte(i)}, "10.0.0.1:7946") // held outbound
		}
		for i := range 7 {
			ta.WriteTo([]byte{byte(i)}, "10.0.0.2:7946") // 5 held, 2 dropped
		}
		c.Write([]byte("ping"))
		s.Write([]byte("pong"))
		accepted := make(chan error, 1)
		c2, err := a.Dial(context.Background(), "10.0.0.2:9001")
		must(t, err) // the frozen host's kernel completes the handshake
		go func() {
			s2, err := l2.Accept()
			if err == nil {
				s2.Close()
			}
			accepted <- err
		}()

		time.Sleep(10 * time.Second)
		if len(ta.PacketCh()) != 0 || len(tb.PacketCh()) != 0 {
			t.Errorf("packets delivered while frozen: %d to a, %d to b", len(ta.PacketCh()), len(tb.PacketCh()))
		}
		if st := n.Stats(); st.PacketsHeld != 8 || st.PacketsOverflow != 2 {
			t.Errorf("while frozen: %+v; want 8 held, 2 overflowed", st)
		}
		for _, conn := range []interface {
			SetReadDeadline(time.Time) error
			Read([]byte) (int, error)
		}{c, s} {
			conn.SetReadDeadline(time.Now().Add(time.Millisecond))
			if k, err := conn.Read(make([]byte, 4)); !isTimeout(err) {
				t.Errorf("read while frozen: %d, %v; want a timeout", k, err)
			}
			conn.SetReadDeadline(time.Time{})
		}
		select {
		case err := <-accepted:
			t.Errorf("accepted while frozen: %v", err)
		default:
		}

		thaw := time.Now()
		must(t, n.Thaw("10.0.0.2"))
		for i := range 5 {
			p := <-tb.PacketCh()
			if !bytes.Equal(p.Buf, []byte{byte(i)}) || !p.Timestamp.Equal(thaw) {
				t.Errorf("to b at thaw: %v at %v, want [%d] at once", p.Buf, p.Timestamp.Sub(thaw), i)
			}
		}
		for i := range 3 {
			p := <-ta.PacketCh()
			if !bytes.Equal(p.Buf, []byte{100 + byte(i)}) || p.Timestamp.Sub(thaw) != lat {
				t.Errorf("from b after thaw: %v after %v, want [%d] after %v", p.Buf, p.Timestamp.Sub(thaw), 100+i, lat)
			}
		}
		for _, tc := range []struct {
			r    io.Reader
			want string
		}{{s, "ping"}, {c, "pong"}} {
			got := make([]byte, 4)
			if _, err := io.ReadFull(tc.r, got); err != nil || string(got) != tc.want || time.Since(thaw) > lat {
				t.Errorf("after thaw read %q, %v after %v; want %q at once", got, err, time.Since(thaw), tc.want)
			}
		}
		if err := <-accepted; err != nil {
			t.Errorf("accept after thaw: %v", err)
		}
		c2.Close()
	})
}

// A frozen memberlist node is declared dead by the others; after thaw it
// refutes and the cluster is whole again without a re-join.
func TestMemberlistFreezeThaw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(6, simnet.Config{PacketLatencyMin: 200 * time.Microsecond, PacketLatencyMax: 2 * time.Millisecond, StreamLatency: time.Millisecond})
		c := newMLCluster(t, n, 5)
		defer c.stop()
		c.joinAll()
		c.waitMembers(all(5), 5, convergeLimit)

		must(t, n.Freeze(c.ips[4]))
		d := c.waitMembers(all(4), 4, 15*time.Second)
		t.Logf("frozen node declared dead in %v", d)
		must(t, n.Thaw(c.ips[4]))
		d = c.waitMembers(all(5), 5, convergeLimit)
		t.Logf("thawed node back in %v", d)
	})
}

var _ memberlist.NodeAwareTransport = (*simnet.Transport)(nil)
