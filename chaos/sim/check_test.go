package sim

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCheckerBounds(t *testing.T) {
	k := Key{Name: "k", Limit: 10, Unit: time.Second}
	c := NewChecker([]Key{k})
	allow := func(at time.Duration, n int) {
		for range n {
			// Decided 2 ms after the call, by a node whose clock says the
			// window ends at the next whole second.
			end := (at/time.Second + 1) * time.Second
			c.Answer("k", at, false, end-at-2*time.Millisecond, 3*time.Millisecond, 20*time.Millisecond)
		}
	}
	allow(500*time.Millisecond, 10)   // window (0, 1s]: exact
	allow(1500*time.Millisecond, 11)  // (1s, 2s]: one too many in steady state
	allow(30500*time.Millisecond, 13) // touched by the kill below: within 10+3
	allow(60500*time.Millisecond, 14) // touched by the kill: over 10+3
	c.Answer("k", 61*time.Second, true, time.Second, time.Millisecond, 20*time.Millisecond)
	c.Answer("k", 62*time.Second, true, time.Second, 25*time.Millisecond, 20*time.Millisecond)
	c.Fault(Fault{Kind: Kill, At: 30 * time.Second, Until: 30 * time.Second})
	c.Fault(Fault{Kind: Kill, At: 60 * time.Second, Until: 60 * time.Second})
	v := c.Violations()
	if len(v) != 3 {
		t.Fatalf("violations: %v", v)
	}
	for i, want := range []string{"key k window ending 2s: 11 allowed", "key k window ending 1m1s: 14 allowed", "late: k at 1m2s"} {
		if !strings.Contains(v[i].What, want) {
			t.Errorf("violation %d = %q, want %q", i, v[i].What, want)
		}
	}
	if n, _ := c.Worst(); n != 4 || c.Calls() != 50 {
		t.Fatalf("worst %d calls %d", n, c.Calls())
	}
}

func TestPartitionBoundGrowsWithSides(t *testing.T) {
	f := Fault{Kind: Partition, Sides: 3}
	if got := Bounds[Partition].Extra(Key{Limit: 100, Unit: time.Second}, f, Other); got != 220 {
		t.Fatalf("3 sides, limit 100: extra %d, want 220", got)
	}
	for k := range numFaults {
		if Bounds[k].Kind != k || Bounds[k].Why == "" || k.String() == "fault?" {
			t.Fatalf("Bounds[%d] is not filled in", k)
		}
	}
}

// A join's relayed keys may go 2 past their limit; the keys it moves
// between other nodes a second's share of it more than the others.
func TestJoinBoundByTouch(t *testing.T) {
	keys := []Key{{"r", 50, 10 * time.Second}, {"m", 50, time.Second}, {"o", 50, time.Second}}
	c := NewChecker(keys)
	c.Fault(Fault{Kind: Join, At: 5 * time.Second, Until: 5 * time.Second, Relayed: []string{"r"}, Moved: []string{"m"}})
	for _, k := range []struct {
		name    string
		allowed int
	}{{"r", 53}, {"m", 110}, {"o", 61}} {
		for range k.allowed {
			c.Answer(k.name, 5500*time.Millisecond, false, 500*time.Millisecond, time.Millisecond, 20*time.Millisecond)
		}
	}
	var got []string
	for _, v := range c.Violations() {
		got = append(got, v.What)
	}
	want := []string{
		"key o window ending 6s: 61 allowed, limit 50, bound 60 ([join at 5s])",
		"key r window ending 10s: 53 allowed, limit 50, bound 52 ([join at 5s])",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations %q, want %q", got, want)
	}
}
