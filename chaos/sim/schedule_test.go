package sim

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// A schedule depends on its seed alone.
func TestScheduleDeterministic(t *testing.T) {
	a, b := NewSchedule(7, 0, 0), NewSchedule(7, 0, 0)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("seed 7 drew two different schedules")
	}
	if c := NewSchedule(8, 0, 0); reflect.DeepEqual(a.Calls, c.Calls) || a.String() == c.String() {
		t.Fatal("seeds 7 and 8 drew the same schedule")
	}
}

// Every schedule keeps the rules the run relies on.
func TestScheduleShape(t *testing.T) {
	pairs := 0
	for seed := uint64(1); seed <= 25; seed++ {
		s := NewSchedule(seed, 0, 10)
		if s.Initial < 3 || s.Initial > 10 || s.Hosts > 10 {
			t.Fatalf("seed %d: %d nodes, %d hosts", seed, s.Initial, s.Hosts)
		}
		if !slices.IsSortedFunc(s.Steps, func(a, b Step) int { return int(a.At - b.At) }) ||
			!slices.IsSortedFunc(s.Calls, func(a, b Call) int { return int(a.At - b.At) }) {
			t.Fatalf("seed %d: steps or calls out of order", seed)
		}
		if last := s.Steps[len(s.Steps)-1]; last.Act != HealAll || last.At != s.HealAt {
			t.Fatalf("seed %d: last step %v at %v, heal at %v", seed, last.Act, last.At, s.HealAt)
		}
		for _, c := range s.Calls {
			if c.At < s.LoadStart-5*time.Second || c.At >= s.LoadEnd || c.Keys[0] < 0 || c.Keys[0] == c.Keys[1] {
				t.Fatalf("seed %d: call %+v", seed, c)
			}
		}
		names := map[string]bool{}
		for _, k := range s.Keys {
			if names[k.Name] || k.Limit == 0 {
				t.Fatalf("seed %d: key %+v", seed, k)
			}
			names[k.Name] = true
		}
		// Replay the steps: a node starts only on a host without one, and
		// at least two nodes run at any time.
		running := map[int]bool{}
		for i := range s.Initial {
			running[i] = true
		}
		for _, st := range s.Steps {
			switch st.Act {
			case Start:
				if running[st.Node] {
					t.Fatalf("seed %d: %v starts %s twice", seed, st.At, NodeID(st.Node))
				}
				running[st.Node] = true
			case Drain, Crash:
				if !running[st.Node] {
					t.Fatalf("seed %d: %v stops %s, not running", seed, st.At, NodeID(st.Node))
				}
				delete(running, st.Node)
			case Split:
				for _, side := range st.Sides {
					if len(side) == 0 {
						t.Fatalf("seed %d: an empty side", seed)
					}
				}
			}
			if len(running) < 2 {
				t.Fatalf("seed %d: %d nodes at %v", seed, len(running), st.At)
			}
		}
		for i, f := range s.Faults {
			if f.Until < f.At || f.Peers < 2 || len(f.Nodes) == 0 {
				t.Fatalf("seed %d: fault %d %+v", seed, i, f)
			}
			if i > 0 && f.At-s.Faults[i-1].At <= relayWindow+200*time.Millisecond && f.Kind != Restart && f.At != s.Faults[i-1].At {
				pairs++
			}
		}
	}
	if pairs < 3 {
		t.Errorf("%d pairs of membership changes inside one join relay in 25 seeds", pairs)
	}
}
