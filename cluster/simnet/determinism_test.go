package simnet_test

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// fates sends 200 packets on each of two links into one receiver, one
// packet per link every 10 ms, and returns each packet's delay ("a/17" ->
// 23ms; absent if lost) and the order they arrived in. order says how the
// two senders interleave.
func fates(t *testing.T, seed uint64, cfg simnet.Config, order string) (map[string]time.Duration, []string) {
	const perLink = 200
	got := make(map[string]time.Duration)
	var arrived []string
	synctest.Test(t, func(t *testing.T) {
		n := simnet.New(seed, cfg)
		defer n.Close()
		var ts [3]interface {
			WriteTo([]byte, string) (time.Time, error)
		}
		tc, err := mustHost(t, n, "10.0.0.3").Transport(7946)
		must(t, err)
		defer tc.Shutdown()
		for i, ip := range []string{"10.0.0.1", "10.0.0.2"} {
			tr, err := mustHost(t, n, ip).Transport(7946)
			must(t, err)
			defer tr.Shutdown()
			ts[i] = tr
		}
		start := time.Now()
		send := func(link, i int) {
			if _, err := ts[link].WriteTo([]byte{byte(link), byte(i)}, "10.0.0.3:7946"); err != nil {
				t.Error(err)
			}
		}
		switch order {
		case "ab", "ba": // one goroutine, alternating
			for i := range perLink {
				if order == "ab" {
					send(0, i)
					send(1, i)
				} else {
					send(1, i)
					send(0, i)
				}
				time.Sleep(10 * time.Millisecond)
			}
		case "concurrent": // one goroutine per link
			var wg sync.WaitGroup
			for link := range 2 {
				wg.Go(func() {
					for i := range perLink {
						send(link, i)
						time.Sleep(10 * time.Millisecond)
					}
				})
			}
			wg.Wait()
		}
		time.Sleep(time.Second)
		for len(tc.PacketCh()) > 0 {
			p := <-tc.PacketCh()
			link, i := int(p.Buf[0]), int(p.Buf[1])
			sent := start.Add(time.Duration(i) * 10 * time.Millisecond)
			key := fmt.Sprintf("%c/%d", 'a'+link, i)
			got[key] = p.Timestamp.Sub(sent)
			arrived = append(arrived, key)
		}
	})
	return got, arrived
}

// The same seed and the same sends per link give the same losses, delays
// and arrival order (packets due at one instant arrive in a fixed order),
// however the senders interleave; another seed gives others.
func TestPacketFatesDeterministic(t *testing.T) {
	cfg := simnet.Config{PacketLatencyMin: time.Millisecond, PacketLatencyMax: 50 * time.Millisecond, Loss: 0.3}
	want, wantOrder := fates(t, 42, cfg, "ab")
	if k := len(want); k < 240 || k > 320 {
		t.Errorf("%d of 400 delivered with loss 0.3", k)
	}
	for key, d := range want {
		if d < time.Millisecond || d > 50*time.Millisecond {
			t.Errorf("%s: delay %v outside [1ms, 50ms]", key, d)
		}
	}
	for _, order := range []string{"ab", "ba", "concurrent"} {
		got, gotOrder := fates(t, 42, cfg, order)
		if !maps.Equal(got, want) {
			t.Errorf("seed 42, order %s: fates differ from the first run", order)
		}
		if !slices.Equal(gotOrder, wantOrder) {
			t.Errorf("seed 42, order %s: arrival order differs from the first run", order)
		}
	}
	if got, _ := fates(t, 43, cfg, "ab"); maps.Equal(got, want) {
		t.Errorf("seeds 42 and 43 gave the same fates")
	}
}

// Packets due at the same instant from different senders arrive in the
// same order whichever sender sent first.
func TestPacketTiesOrdered(t *testing.T) {
	cfg := simnet.Config{PacketLatencyMin: 5 * time.Millisecond, PacketLatencyMax: 5 * time.Millisecond}
	_, want := fates(t, 1, cfg, "ab")
	for _, order := range []string{"ba", "concurrent"} {
		if _, got := fates(t, 1, cfg, order); !slices.Equal(got, want) {
			t.Errorf("order %s: arrivals %v..., want %v...", order, got[:6], want[:6])
		}
	}
}
