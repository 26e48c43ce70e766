package clock_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/clock"
)

func TestRealClockInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := clock.Real()
		start := c.Now()
		tm := c.NewTimer(time.Second)
		<-tm.C()
		if got := c.Now().Sub(start); got != time.Second {
			t.Fatalf("timer fired after %v", got)
		}
		var n atomic.Int32
		c.AfterFunc(time.Second, func() { n.Add(1) })
		tk := c.NewTicker(100 * time.Millisecond)
		for range 3 {
			<-tk.C()
		}
		tk.Stop()
		time.Sleep(time.Second)
		if n.Load() != 1 {
			t.Fatalf("AfterFunc ran %d times", n.Load())
		}
		if clock.Or(nil) == nil || clock.Or(c) != c {
			t.Fatal("Or")
		}
	})
}

func TestFreezableHoldsTimersUntilThaw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := clock.NewFreezable(nil)
		start := c.Now()
		tm := c.NewTimer(time.Second)
		var ran atomic.Int32
		c.AfterFunc(2*time.Second, func() { ran.Add(1) })
		tk := c.NewTicker(100 * time.Millisecond)

		c.Freeze()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case <-tm.C():
			t.Fatal("timer fired while frozen")
		case <-tk.C():
			t.Fatal("ticker ticked while frozen")
		default:
		}
		if ran.Load() != 0 || !c.Frozen() {
			t.Fatal("AfterFunc ran while frozen")
		}
		if got := c.Now().Sub(start); got != 5*time.Second {
			t.Fatalf("Now stopped while frozen: %v", got)
		}

		c.Thaw()
		synctest.Wait()
		// Each fire that came due happens once, late; the ticks collapse
		// into one, then tick on.
		if at := <-tm.C(); at.Sub(start) != 5*time.Second {
			t.Fatalf("timer fired at %v, want at the thaw", at.Sub(start))
		}
		if ran.Load() != 1 {
			t.Fatalf("AfterFunc ran %d times", ran.Load())
		}
		first := <-tk.C()
		next := <-tk.C()
		if first.Sub(start) != 5*time.Second || next.Sub(first) != 100*time.Millisecond {
			t.Fatalf("ticks at %v then %v", first.Sub(start), next.Sub(start))
		}
		tk.Stop()
	})
}

func TestFreezableStopAndReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := clock.NewFreezable(nil)
		var ran atomic.Int32
		f := c.AfterFunc(time.Second, func() { ran.Add(1) })
		c.Freeze()
		time.Sleep(2 * time.Second)
		// Came due while frozen: stopping it still cancels the fire.
		if !f.Stop() {
			t.Fatal("Stop of a held timer reported it inactive")
		}
		c.Thaw()
		synctest.Wait()
		if ran.Load() != 0 {
			t.Fatal("a stopped timer fired at the thaw")
		}

		tm := c.NewTimer(time.Second)
		time.Sleep(500 * time.Millisecond)
		if !tm.Reset(time.Second) {
			t.Fatal("Reset of an active timer reported it inactive")
		}
		start := c.Now()
		at := <-tm.C()
		if at.Sub(start) != time.Second {
			t.Fatalf("reset timer fired after %v", at.Sub(start))
		}
		if tm.Stop() {
			t.Fatal("Stop of a fired timer reported it active")
		}
		tm.Reset(time.Second)
		tm.Stop()
		time.Sleep(2 * time.Second)
		select {
		case <-tm.C():
			t.Fatal("a stopped timer sent")
		default:
		}
	})
}
