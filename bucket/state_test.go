package bucket

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestMergeTable(t *testing.T) {
	const now = base + 30*second // in window [base, base+minute)
	cur := State{Window: base, Unit: minute, Count: 10}
	tests := []struct {
		name    string
		stored  *State
		in      State
		changed bool
		want    *State // nil: no live entry
	}{
		{"insert into empty", nil, cur, true, &cur},
		{"same window larger count", &cur, State{Window: base, Unit: minute, Count: 11}, true,
			&State{Window: base, Unit: minute, Count: 11}},
		{"same window smaller count never lowers", &cur, State{Window: base, Unit: minute, Count: 3}, false, &cur},
		{"same window equal count", &cur, cur, false, &cur},
		{"later window replaces even with a lower count", &State{Window: base, Unit: minute, Count: 90}, State{Window: base + minute, Unit: minute, Count: 1}, true,
			&State{Window: base + minute, Unit: minute, Count: 1}},
		{"earlier window ignored", &cur, State{Window: base - minute, Unit: minute, Count: 99}, false, &cur},
		{"expired incoming ignored on empty", nil, State{Window: base - minute, Unit: minute, Count: 99}, false, nil},
		{"next window accepted", &cur, State{Window: base + minute, Unit: minute, Count: 2}, true,
			&State{Window: base + minute, Unit: minute, Count: 2}},
		{"two windows ahead ignored", &cur, State{Window: base + 2*minute, Unit: minute, Count: 2}, false, &cur},
		{"zero unit ignored", nil, State{Window: base, Unit: 0, Count: 2}, false, nil},
		{"negative unit ignored", nil, State{Window: base, Unit: -minute, Count: 2}, false, nil},
		{"unknown algorithm ignored", nil, State{Algorithm: 7, Window: base, Unit: minute, Count: 2}, false, nil},
		{"larger unit same window start wins", &cur, State{Window: base, Unit: hour, Count: 1}, true,
			&State{Window: base, Unit: hour, Count: 1}},
		{"max count", &cur, State{Window: base, Unit: minute, Count: math.MaxUint64}, true,
			&State{Window: base, Unit: minute, Count: math.MaxUint64}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(StoreConfig{})
			key := []byte("k")
			if tc.stored != nil {
				if !s.Merge(now, key, *tc.stored) {
					t.Fatalf("seeding Merge(%+v) = false", *tc.stored)
				}
			}
			if got := s.Merge(now, key, tc.in); got != tc.changed {
				t.Errorf("Merge(%+v) = %v, want %v", tc.in, got, tc.changed)
			}
			got, ok := s.Get(now, key)
			switch {
			case tc.want == nil && ok:
				t.Errorf("Get = %+v, want no entry", got)
			case tc.want != nil && (!ok || got != *tc.want):
				t.Errorf("Get = %+v, %v; want %+v", got, ok, *tc.want)
			}
		})
	}
}

func TestMergeExpiredStoredIsAbsent(t *testing.T) {
	s := NewStore(StoreConfig{})
	key := []byte("k")
	s.Merge(base, key, State{Window: base, Unit: hour, Count: 50})
	// At base+2h the stored state has expired; a live state with an earlier
	// start but a longer unit replaces it.
	in := State{Window: 0, Unit: 24 * 365 * 100 * hour, Count: 1}
	now := base + 2*hour
	if !s.Merge(now, key, in) {
		t.Fatal("Merge over an expired entry = false")
	}
	if got, ok := s.Get(now, key); !ok || got != in {
		t.Fatalf("Get = %+v, %v; want %+v", got, ok, in)
	}
}

func TestApplyCountsInMergedNextWindow(t *testing.T) {
	s := NewStore(StoreConfig{})
	key := []byte("k")
	lim := Limit{Requests: 10, Unit: minute}
	now := base + 59*second
	s.Apply(now, &Op{Key: key, Limit: lim, Hits: 4})
	// A peer whose clock is ahead already counted 8 in the next window.
	if !s.Merge(now, key, State{Window: base + minute, Unit: minute, Count: 8}) {
		t.Fatal("Merge of next window = false")
	}
	got := s.Apply(now, &Op{Key: key, Limit: lim, Hits: 1})
	want := Result{Count: 9, Remaining: 1, ResetAfter: second + minute}
	if got != want {
		t.Fatalf("Apply = %+v, want %+v", got, want)
	}
	// Once the local clock reaches that window it is simply the current one.
	got = s.Apply(base+minute, &Op{Key: key, Limit: lim, Hits: 1})
	want = Result{Count: 10, Remaining: 0, ResetAfter: minute}
	if got != want {
		t.Fatalf("Apply in the window = %+v, want %+v", got, want)
	}
}

// stateLess orders states as Merge does, then by count.
func stateLess(a, b State) bool {
	if a.Window != b.Window {
		return a.Window < b.Window
	}
	if a.Unit != b.Unit {
		return a.Unit < b.Unit
	}
	if a.Algorithm != b.Algorithm {
		return a.Algorithm < b.Algorithm
	}
	return a.Count < b.Count
}

func randState(r *rand.Rand, now int64) State {
	units := []int64{second, 2 * second, minute}
	u := units[r.IntN(len(units))]
	w, _ := fixedWindow(now, u)
	st := State{Window: w + int64(r.IntN(5)-2)*u, Unit: u, Count: uint64(r.IntN(20))}
	switch r.IntN(20) {
	case 0:
		st.Unit = 0
	case 1:
		st.Algorithm = Algorithm(100 + r.IntN(3)) // unknown: ignored (other algorithms: conformance_test.go)
	}
	return st
}

func TestMergeProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	key := []byte("k")
	for iter := range 2000 {
		now := base + int64(r.IntN(int(minute)))
		states := make([]State, 1+r.IntN(6))
		for i := range states {
			states[i] = randState(r, now)
		}

		// Never lowers, and the result says whether anything changed.
		a := NewStore(StoreConfig{})
		for _, st := range states {
			before, hadBefore := a.Get(now, key)
			changed := a.Merge(now, key, st)
			after, ok := a.Get(now, key)
			if hadBefore && (!ok || stateLess(after, before)) {
				t.Fatalf("iter %d: Merge(%+v) lowered %+v to %+v", iter, st, before, after)
			}
			if changed != (ok != hadBefore || after != before) {
				t.Fatalf("iter %d: Merge(%+v) = %v but state went %+v,%v -> %+v,%v", iter, st, changed, before, hadBefore, after, ok)
			}
		}
		want, wantOK := a.Get(now, key)

		// Idempotent: merging everything again changes nothing.
		for _, st := range states {
			if a.Merge(now, key, st) {
				t.Fatalf("iter %d: second Merge(%+v) changed the state", iter, st)
			}
		}

		// Commutative: any order gives the same state.
		b := NewStore(StoreConfig{})
		for _, i := range r.Perm(len(states)) {
			b.Merge(now, key, states[i])
		}
		if got, ok := b.Get(now, key); got != want || ok != wantOK {
			t.Fatalf("iter %d: shuffled order gave %+v,%v, want %+v,%v (states %+v)", iter, got, ok, want, wantOK, states)
		}

		// Associative: merging two partial merges equals merging all.
		cut := r.IntN(len(states) + 1)
		left, right := NewStore(StoreConfig{}), NewStore(StoreConfig{})
		for _, st := range states[:cut] {
			left.Merge(now, key, st)
		}
		for _, st := range states[cut:] {
			right.Merge(now, key, st)
		}
		if st, ok := right.Get(now, key); ok {
			left.Merge(now, key, st)
		}
		if got, ok := left.Get(now, key); got != want || ok != wantOK {
			t.Fatalf("iter %d: (a..)+(..z) gave %+v,%v, want %+v,%v", iter, got, ok, want, wantOK)
		}

		// The result is the latest live valid input.
		var best State
		var bestOK bool
		for _, st := range states {
			start, _ := fixedWindow(now, max(st.Unit, 1))
			if st.Unit <= 0 || st.Algorithm != FixedWindow || now >= st.Window+st.Unit || st.Window > start+st.Unit {
				continue
			}
			if !bestOK || stateLess(best, st) {
				best, bestOK = st, true
			}
		}
		if best != want || bestOK != wantOK {
			t.Fatalf("iter %d: merged %+v,%v, want the latest input %+v,%v", iter, want, wantOK, best, bestOK)
		}
	}
}

// model is a naive reference for the store without a key bound.
type model struct {
	m map[string]State
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func (m *model) live(now int64, key string) (State, bool) {
	st, ok := m.m[key]
	if !ok || now >= st.Window+st.Unit {
		return State{}, false
	}
	return st, true
}

func (m *model) apply(now int64, op Op) Result {
	u := op.Limit.Unit
	w := floorDiv(now, u) * u
	reset := w + u - now
	var before uint64
	if st, ok := m.m[string(op.Key)]; ok && st.Unit == u && st.Algorithm == op.Limit.Algorithm {
		if st.Window == w {
			before = st.Count
		} else if st.Window == w+u {
			before, w, reset = st.Count, w+u, reset+u
		}
	}
	count := before + op.Hits
	if count < before {
		count = math.MaxUint64
	}
	over := count > op.Limit.Requests
	var rem uint64
	if !over {
		rem = op.Limit.Requests - count
	}
	if op.Hits > 0 && op.Mode != Peek && !(op.Mode == StopOnOver && over) {
		m.m[string(op.Key)] = State{Window: w, Unit: u, Count: count}
	}
	return Result{Over: over, Count: count, Remaining: rem, ResetAfter: reset}
}

func (m *model) merge(now int64, key string, in State) bool {
	if in.Unit <= 0 || in.Algorithm != FixedWindow || now >= in.Window+in.Unit {
		return false
	}
	if in.Window > floorDiv(now, in.Unit)*in.Unit+in.Unit {
		return false
	}
	cur, ok := m.live(now, key)
	if !ok {
		m.m[key] = in
		return true
	}
	c := State{Window: cur.Window, Unit: cur.Unit, Algorithm: cur.Algorithm}
	i := State{Window: in.Window, Unit: in.Unit, Algorithm: in.Algorithm}
	switch {
	case stateLess(c, i):
		m.m[key] = in
		return true
	case stateLess(i, c) || in.Count <= cur.Count:
		return false
	}
	m.m[key] = in
	return true
}

func (m *model) sweep(now int64) int {
	n := 0
	for k, st := range m.m {
		if now >= st.Window+st.Unit {
			delete(m.m, k)
			n++
		}
	}
	return n
}

// TestStoreAgainstModel runs random operations on a store and on the naive
// model and compares every answer.
func TestStoreAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 7))
	s := NewStore(StoreConfig{Shards: 4})
	m := &model{m: map[string]State{}}
	keys := []string{"a", "b", "c", "d", "e", "f"}
	units := []int64{second, 2 * second, minute}
	now := base
	for i := range 20000 {
		key := keys[r.IntN(len(keys))]
		switch op := r.IntN(100); {
		case op < 10:
			now += int64(r.IntN(int(700 * ms)))
			if r.IntN(10) == 0 {
				now -= int64(r.IntN(int(1500 * ms))) // clock steps back
			}
		case op < 55:
			o := Op{
				Key:   []byte(key),
				Limit: Limit{Requests: uint64(r.IntN(30)), Unit: units[r.IntN(len(units))]},
				Hits:  uint64(r.IntN(5)),
				Mode:  Mode(r.IntN(3)),
			}
			if r.IntN(50) == 0 {
				o.Hits = math.MaxUint64 - uint64(r.IntN(3))
			}
			got, want := s.Apply(now, &o), m.apply(now, o)
			if got != want {
				t.Fatalf("op %d: Apply(%d, %+v) = %+v, model %+v", i, now, o, got, want)
			}
		case op < 85:
			st := randState(r, now)
			if got, want := s.Merge(now, []byte(key), st), m.merge(now, key, st); got != want {
				t.Fatalf("op %d: Merge(%d, %q, %+v) = %v, model %v", i, now, key, st, got, want)
			}
		case op < 90:
			s.Delete([]byte(key))
			delete(m.m, key)
		case op < 93:
			if got, want := s.Sweep(now), m.sweep(now); got != want {
				t.Fatalf("op %d: Sweep = %d, model %d", i, got, want)
			}
		default:
			if got, want := s.Len(), len(m.m); got != want {
				t.Fatalf("op %d: Len = %d, model %d", i, got, want)
			}
		}
		for _, k := range keys {
			got, ok := s.Get(now, []byte(k))
			want, wantOK := m.live(now, k)
			if got != want || ok != wantOK {
				t.Fatalf("op %d: Get(%q) = %+v,%v, model %+v,%v", i, k, got, ok, want, wantOK)
			}
		}
	}
}

func TestRange(t *testing.T) {
	s := NewStore(StoreConfig{Shards: 8})
	lim := Limit{Requests: 10, Unit: second}
	want := map[string]State{}
	for i := range 50 {
		key := "live-" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('A'+i/26))
		s.Apply(base, &Op{Key: []byte(key), Limit: lim, Hits: uint64(i%3 + 1)})
		want[key] = State{Window: base, Unit: second, Count: uint64(i%3 + 1)}
		s.Apply(base-second, &Op{Key: []byte("old-" + key), Limit: lim, Hits: 1}) // expired at base
	}
	got := map[string]State{}
	s.Range(base, func(key []byte, st State) bool {
		got[string(key)] = st
		key[0] = 'X' // a caller scribbling on key must not corrupt the store
		s.Delete([]byte("nothing"))
		return true
	})
	if len(got) != len(want) {
		t.Fatalf("Range saw %d entries, want %d", len(got), len(want))
	}
	for k, st := range want {
		if got[k] != st {
			t.Errorf("Range[%q] = %+v, want %+v", k, got[k], st)
		}
		if g, ok := s.Get(base, []byte(k)); !ok || g != st {
			t.Errorf("Get(%q) after Range = %+v,%v", k, g, ok)
		}
	}

	var seen []string
	s.Range(base, func(key []byte, _ State) bool {
		seen = append(seen, string(key))
		return len(seen) < 3
	})
	if len(seen) != 3 || slices.Contains(seen, "") {
		t.Errorf("Range stopping after 3 saw %q", seen)
	}
}

// MaxState keeps what Merge keeps: merging a then b into an empty store
// leaves MaxState(a, b), and MaxState commutes, associates and is
// idempotent.
func TestMaxState(t *testing.T) {
	const now = base + 30*second
	w := base - base%minute
	tests := []struct {
		name string
		a, b State
		want State
	}{
		{"larger count", State{Window: w, Unit: minute, Count: 3}, State{Window: w, Unit: minute, Count: 5}, State{Window: w, Unit: minute, Count: 5}},
		{"later window wins with a lower count", State{Window: w, Unit: minute, Count: 9}, State{Window: w + minute, Unit: minute, Count: 1}, State{Window: w + minute, Unit: minute, Count: 1}},
		{"larger unit wins at the same start", State{Window: w, Unit: minute, Count: 9}, State{Window: w, Unit: hour, Count: 1}, State{Window: w, Unit: hour, Count: 1}},
		{"equal", State{Window: w, Unit: minute, Count: 2}, State{Window: w, Unit: minute, Count: 2}, State{Window: w, Unit: minute, Count: 2}},
		{"zero and a state", State{}, State{Window: w, Unit: minute, Count: 2}, State{Window: w, Unit: minute, Count: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MaxState(tc.a, tc.b); got != tc.want {
				t.Errorf("MaxState(a, b) = %+v, want %+v", got, tc.want)
			}
			if got := MaxState(tc.b, tc.a); got != tc.want {
				t.Errorf("MaxState(b, a) = %+v, want %+v", got, tc.want)
			}
		})
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func() State {
		return State{Window: w + int64(rnd.IntN(2))*minute, Unit: minute, Count: uint64(rnd.IntN(4))}
	}
	for range 1000 {
		a, b, c := pick(), pick(), pick()
		if MaxState(MaxState(a, b), c) != MaxState(a, MaxState(b, c)) || MaxState(a, a) != a {
			t.Fatalf("not associative or idempotent on %+v %+v %+v", a, b, c)
		}
		s := NewStore(StoreConfig{})
		s.Merge(now, []byte("k"), a)
		s.Merge(now, []byte("k"), b)
		got, _ := s.Get(now, []byte("k"))
		if want := MaxState(a, b); got != want {
			t.Fatalf("Merge kept %+v, MaxState says %+v (a %+v, b %+v)", got, want, a, b)
		}
	}
}
