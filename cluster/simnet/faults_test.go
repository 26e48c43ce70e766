package simnet_test

import (
	"bytes"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// A one-way cut drops packets and holds stream bytes in one direction only.
func TestCutOneWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{PacketLatencyMin: time.Millisecond, PacketLatencyMax: time.Millisecond, StreamLatency: time.Millisecond})
		defer n.Close()
		a, b := mustHost(t, n, "10.0.0.1"), mustHost(t, n, "10.0.0.2")
		ta, err := a.Transport(7946)
		must(t, err)
		defer ta.Shutdown()
		tb, err := b.Transport(7946)
		must(t, err)
		defer tb.Shutdown()
		c, s := mustConnect(t, a, mustListen(t, b, 9000))

		must(t, n.Cut("10.0.0.1", "10.0.0.2"))
		ta.WriteTo([]byte("a->b"), "10.0.0.2:7946")
		tb.WriteTo([]byte("b->a"), "10.0.0.1:7946")
		c.Write([]byte("held"))
		s.Write([]byte("flow"))
		time.Sleep(time.Second)
		if len(tb.PacketCh()) != 0 {
			t.Errorf("a packet crossed the cut")
		}
		if p := <-ta.PacketCh(); string(p.Buf) != "b->a" {
			t.Errorf("reverse packet %q", p.Buf)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "flow" {
			t.Errorf("reverse stream read %q, %v", got, err)
		}
		s.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := s.Read(got); !isTimeout(err) {
			t.Errorf("read across the cut: %v, want a timeout", err)
		}
		s.SetReadDeadline(time.Time{})
		if st := n.Stats(); st.PacketsCut != 1 {
			t.Errorf("stats %+v, want 1 packet cut", st)
		}

		n.Heal()
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, []byte("held")) {
			t.Errorf("after heal read %q, %v", got, err)
		}
	})
}

// Faults name known hosts; bad names and groups are errors.
func TestFaultErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(1, simnet.Config{})
		defer n.Close()
		mustHost(t, n, "10.0.0.1")
		if _, err := n.Host("node-1"); err == nil {
			t.Errorf("Host(node-1): no error")
		}
		for name, err := range map[string]error{
			"crash":      n.Crash("10.0.0.9"),
			"restart":    n.Restart("10.0.0.9"),
			"freeze":     n.Freeze("10.0.0.9"),
			"thaw":       n.Thaw("10.0.0.9"),
			"cut":        n.Cut("10.0.0.1", "10.0.0.9"),
			"partition":  n.Partition([]string{"10.0.0.9"}),
			"two groups": n.Partition([]string{"10.0.0.1"}, []string{"10.0.0.1"}),
		} {
			if err == nil {
				t.Errorf("%s: no error", name)
			}
		}
		must(t, n.Crash("10.0.0.1"))
		if err := n.Freeze("10.0.0.1"); err == nil {
			t.Errorf("freeze of a down host: no error")
		}
	})
}
