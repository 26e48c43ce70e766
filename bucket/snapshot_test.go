package bucket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"strings"
	"testing"
)

// snapEntry is one decoded entry.
type snapEntry struct {
	key string
	st  State
}

func snapEntries(s *Snapshot) map[string]State {
	out := map[string]State{}
	s.Range(func(key []byte, st State) bool {
		out[string(key)] = st
		return true
	})
	return out
}

// snapshotStore is a store holding one live counter of each algorithm, a
// one-second counter, an expired one and a key too long for a snapshot,
// all at base+30s.
func snapshotStore(t *testing.T) (*Store, int64) {
	t.Helper()
	now := base + 30*second
	s := NewStore(StoreConfig{})
	apply := func(key string, lim Limit, hits uint64, at int64) {
		s.Apply(at, &Op{Key: []byte(key), Limit: lim, Hits: hits})
	}
	apply("fixed-hour", Limit{Requests: 100, Unit: hour}, 7, now)
	apply("fixed-minute", Limit{Requests: 100, Unit: minute}, 3, now)
	apply("sliding", Limit{Algorithm: SlidingWindow, Requests: 50, Unit: minute}, 4, now-minute)
	apply("sliding", Limit{Algorithm: SlidingWindow, Requests: 50, Unit: minute}, 5, now)
	apply("token", Limit{Algorithm: TokenBucket, Requests: 60, Unit: minute, Burst: 10}, 6, now)
	apply("fixed-second", Limit{Requests: 100, Unit: second}, 9, now)
	apply("expired", Limit{Requests: 100, Unit: minute}, 1, now-minute)
	apply(strings.Repeat("x", MaxSnapshotKeyLen+1), Limit{Requests: 100, Unit: hour}, 1, now)
	return s, now
}

func TestSnapshotRoundTrip(t *testing.T) {
	s, now := snapshotStore(t)
	keepMinute := func(key []byte, st State) bool { return st.Unit >= minute }
	var buf bytes.Buffer
	h := SnapshotHeader{Node: "ringlimit-0", Written: now}
	n, err := s.WriteSnapshot(&buf, h, keepMinute)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("wrote %d entries, want 4 (hour, minute, sliding, token)", n)
	}
	snap, err := ReadSnapshot(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Header != h || snap.Len() != n {
		t.Errorf("header %+v len %d, want %+v len %d", snap.Header, snap.Len(), h, n)
	}
	got := snapEntries(snap)
	for _, key := range []string{"fixed-hour", "fixed-minute", "sliding", "token"} {
		want, ok := s.Get(now, []byte(key))
		if !ok {
			t.Fatalf("%s not in the store", key)
		}
		if got[key] != want {
			t.Errorf("%s: snapshot holds %+v, store %+v", key, got[key], want)
		}
	}
	for _, key := range []string{"fixed-second", "expired"} {
		if _, ok := got[key]; ok {
			t.Errorf("%s was written", key)
		}
	}
	if len(got) != n {
		t.Errorf("%d distinct entries, want %d", len(got), n)
	}

	// Merged into an empty store, the entries decide as the original does.
	fresh := NewStore(StoreConfig{})
	snap.Range(func(key []byte, st State) bool {
		if !fresh.Merge(now, key, st) {
			t.Errorf("%s: merge of %+v changed nothing", key, st)
		}
		return true
	})
	op := Op{Key: []byte("fixed-hour"), Limit: Limit{Requests: 100, Unit: hour}, Hits: 1}
	if a, b := s.Apply(now, &op), fresh.Apply(now, &op); a != b {
		t.Errorf("after restore: %+v, original %+v", b, a)
	}

	// nil keep: every live entry a snapshot can hold.
	buf.Reset()
	if n, err := s.WriteSnapshot(&buf, h, nil); err != nil || n != 5 {
		t.Errorf("keep nil: %d entries, %v; want 5", n, err)
	}

	// Range stops when fn says so.
	calls := 0
	snap.Range(func([]byte, State) bool { calls++; return false })
	if calls != 1 {
		t.Errorf("Range went on after false: %d calls", calls)
	}
}

func TestSnapshotEmptyStore(t *testing.T) {
	var buf bytes.Buffer
	if n, err := NewStore(StoreConfig{}).WriteSnapshot(&buf, SnapshotHeader{}, nil); err != nil || n != 0 {
		t.Fatalf("%d, %v", n, err)
	}
	snap, err := ReadSnapshot(&buf)
	if err != nil || snap.Len() != 0 || snap.Header != (SnapshotHeader{}) {
		t.Fatalf("%+v, %v", snap, err)
	}
	snap.Range(func([]byte, State) bool { t.Error("an entry in an empty snapshot"); return true })
}

// validSnapshot is a snapshot of snapshotStore with every entry it can hold.
func validSnapshot(t *testing.T) []byte {
	t.Helper()
	s, now := snapshotStore(t)
	var buf bytes.Buffer
	if _, err := s.WriteSnapshot(&buf, SnapshotHeader{Node: "node-a", Written: now}, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Every damage of one byte, every truncation and any trailing byte is
// refused as a whole: no entry is ever handed out of a damaged snapshot.
func TestSnapshotRejectsDamage(t *testing.T) {
	good := validSnapshot(t)
	check := func(what string, b []byte) {
		t.Helper()
		snap, err := ReadSnapshot(bytes.NewReader(b))
		if err == nil {
			t.Fatalf("%s: accepted (%d entries)", what, snap.Len())
		}
		if !errors.Is(err, ErrBadSnapshot) {
			t.Fatalf("%s: error %v does not wrap ErrBadSnapshot", what, err)
		}
	}
	for i := range good {
		for _, mask := range []byte{0x01, 0x80, 0xff, 0x5a} {
			b := bytes.Clone(good)
			b[i] ^= mask
			check(fmt.Sprintf("byte %d ^ %#x", i, mask), b)
		}
	}
	for n := range len(good) {
		check(fmt.Sprintf("truncated to %d bytes", n), good[:n])
	}
	check("a byte appended", append(bytes.Clone(good), 0))
	check("doubled", append(bytes.Clone(good), good...))
}

// sealed builds a snapshot from raw parts with a correct checksum, to
// reach the checks behind it.
func sealed(parts ...[]byte) []byte {
	b := bytes.Join(parts, nil)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func uv(v uint64) []byte { return binary.AppendUvarint(nil, v) }
func sv(v int64) []byte  { return binary.AppendVarint(nil, v) }

func TestSnapshotRejectsInvalidContent(t *testing.T) {
	head := func(version uint64, node string) []byte {
		return bytes.Join([][]byte{[]byte(snapshotMagic), uv(version), uv(uint64(len(node))), []byte(node), sv(base)}, nil)
	}
	h := head(1, "n")
	entry := func(key string, algo byte, fields ...[]byte) []byte {
		return bytes.Join(append([][]byte{{1}, uv(uint64(len(key))), []byte(key), {algo}}, fields...), nil)
	}
	fixed := entry("k", 0, sv(base), sv(minute), uv(3))
	end := func(n uint64) []byte { return append([]byte{0}, uv(n)...) }

	if _, err := ReadSnapshot(bytes.NewReader(sealed(h, fixed, end(1)))); err != nil {
		t.Fatalf("the well-formed base case is refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "not a ringlimit snapshot"},
		{"another file", []byte("domain: x\ndescriptors: []\n"), "not a ringlimit snapshot"},
		{"no checksum", []byte(snapshotMagic), "truncated"},
		{"version 2", sealed(head(2, "n"), end(0)), "format version 2"},
		{"version 0", sealed(head(0, "n"), end(0)), "format version 0"},
		{"node name too long", sealed(head(1, strings.Repeat("n", MaxSnapshotNodeLen+1)), end(0)), "node name is"},
		{"count too high", sealed(h, fixed, end(2)), "trailer says 2"},
		{"count too low", sealed(h, fixed, end(0)), "trailer says 0"},
		{"bytes after the trailer", sealed(h, fixed, end(1), []byte{0}), "after the trailer"},
		{"bad tag", sealed(h, []byte{2}), "tag 2"},
		{"empty key", sealed(h, entry("", 0, sv(base), sv(minute), uv(1)), end(1)), "key is 0 bytes"},
		{"key too long", sealed(h, entry(strings.Repeat("k", MaxSnapshotKeyLen+1), 0, sv(base), sv(minute), uv(1)), end(1)), "key is 8193 bytes"},
		{"key length beyond the data", sealed(h, []byte{1}, uv(100), []byte("k")), "truncated or malformed key"},
		{"unknown algorithm", sealed(h, entry("k", 3, sv(base), sv(minute), uv(1)), end(1)), "unknown algorithm 3"},
		{"zero unit", sealed(h, entry("k", 0, sv(base), sv(0), uv(1)), end(1)), "unit must be > 0"},
		{"negative unit", sealed(h, entry("k", 2, sv(-minute), sv(base)), end(1)), "unit must be > 0"},
		{"window off the grid", sealed(h, entry("k", 0, sv(base+1), sv(minute), uv(1)), end(1)), "not a multiple"},
		{"sliding count too large", sealed(h, entry("k", 1, sv(base), sv(minute), uv(math.MaxUint32+1), uv(0)), end(1)), "sliding window counts"},
		{"sliding prev too large", sealed(h, entry("k", 1, sv(base), sv(minute), uv(0), uv(math.MaxUint32+1)), end(1)), "sliding window counts"},
		{"truncated entry", sealed(h, entry("k", 0, sv(base), sv(minute))), "truncated or malformed"},
		{"overlong varint", sealed(h, entry("k", 0, sv(base), sv(minute), bytes.Repeat([]byte{0xff}, 11)), end(1)), "truncated or malformed count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := ReadSnapshot(bytes.NewReader(tc.b))
			if err == nil {
				t.Fatalf("accepted: %d entries", snap.Len())
			}
			if !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want ErrBadSnapshot mentioning %q", err, tc.want)
			}
		})
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if len(p) > w.after {
		n := w.after
		w.after = 0
		return n, io.ErrShortWrite
	}
	w.after -= len(p)
	return len(p), nil
}

func TestWriteSnapshotErrors(t *testing.T) {
	s, now := snapshotStore(t)
	if _, err := s.WriteSnapshot(io.Discard, SnapshotHeader{Node: strings.Repeat("n", MaxSnapshotNodeLen+1)}, nil); err == nil {
		t.Error("a node name over the bound was written")
	}
	// The buffer hides small writes; a store larger than it reaches the
	// writer mid-way.
	for i := range 5000 {
		s.Apply(now, &Op{Key: fmt.Appendf(nil, "key-%d", i), Limit: Limit{Requests: 10, Unit: hour}, Hits: 1})
	}
	for _, after := range []int{0, 10, 70_000} {
		if _, err := s.WriteSnapshot(&failingWriter{after: after}, SnapshotHeader{Written: now}, nil); !errors.Is(err, io.ErrShortWrite) {
			t.Errorf("writer failing after %d bytes: err %v", after, err)
		}
	}
}

func TestStoreChanges(t *testing.T) {
	s := NewStore(StoreConfig{})
	lim := Limit{Requests: 2, Unit: minute}
	steps := []struct {
		name string
		do   func()
		want uint64
	}{
		{"new store", func() {}, 0},
		{"insert", func() { s.Apply(base, &Op{Key: []byte("a"), Limit: lim, Hits: 1}) }, 1},
		{"count", func() { s.Apply(base, &Op{Key: []byte("a"), Limit: lim, Hits: 1}) }, 2},
		{"check only", func() { s.Apply(base, &Op{Key: []byte("a"), Limit: lim}) }, 2},
		{"peek", func() { s.Apply(base, &Op{Key: []byte("a"), Limit: lim, Hits: 1, Mode: Peek}) }, 2},
		{"refused with StopOnOver", func() { s.Apply(base, &Op{Key: []byte("a"), Limit: lim, Hits: 1, Mode: StopOnOver}) }, 2},
		{"merge that changes nothing", func() { s.Merge(base, []byte("a"), State{Window: base, Unit: minute, Count: 1}) }, 2},
		{"merge that raises", func() { s.Merge(base, []byte("a"), State{Window: base, Unit: minute, Count: 9}) }, 3},
		{"merge that inserts", func() { s.Merge(base, []byte("b"), State{Window: base, Unit: minute, Count: 1}) }, 4},
		{"sweep", func() { s.Sweep(base + hour) }, 4},
	}
	for _, st := range steps {
		st.do()
		if got := s.Changes(); got != st.want {
			t.Fatalf("after %s: Changes() = %d, want %d", st.name, got, st.want)
		}
	}
}

func TestStateEnd(t *testing.T) {
	for _, tc := range []struct {
		st   State
		want int64
	}{
		{State{Window: base, Unit: minute}, base + minute},
		{State{Algorithm: SlidingWindow, Window: base, Unit: minute}, base + 2*minute},
		{State{Algorithm: TokenBucket, Unit: minute, TAT: base + second}, base + minute},
		{State{Algorithm: TokenBucket, Unit: minute, TAT: base}, base},
		{State{Window: math.MaxInt64 - 1, Unit: minute}, math.MaxInt64},
		{State{Algorithm: 9, Window: base, Unit: minute}, math.MinInt64},
	} {
		if got := tc.st.End(); got != tc.want {
			t.Errorf("%+v.End() = %d, want %d", tc.st, got, tc.want)
		}
	}
}

// FuzzReadSnapshot: the decoder never panics, and what it accepts holds
// only valid entries and survives a round trip through the encoder.
func FuzzReadSnapshot(f *testing.F) {
	s := NewStore(StoreConfig{})
	now := base + 30*second
	s.Apply(now, &Op{Key: []byte("fixed"), Limit: Limit{Requests: 100, Unit: hour}, Hits: 7})
	s.Apply(now, &Op{Key: []byte("sliding"), Limit: Limit{Algorithm: SlidingWindow, Requests: 50, Unit: minute}, Hits: 5})
	s.Apply(now, &Op{Key: []byte("token"), Limit: Limit{Algorithm: TokenBucket, Requests: 60, Unit: minute}, Hits: 6})
	var buf bytes.Buffer
	if _, err := s.WriteSnapshot(&buf, SnapshotHeader{Node: "n", Written: now}, nil); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	var empty bytes.Buffer
	NewStore(StoreConfig{}).WriteSnapshot(&empty, SnapshotHeader{}, nil)
	f.Add(empty.Bytes())
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Checksums make random input almost always fail early; fuzzing
		// the sealed form too reaches the entry checks.
		for _, in := range [][]byte{b, sealedTail(b)} {
			snap, err := ReadSnapshot(bytes.NewReader(in))
			if err != nil {
				if !errors.Is(err, ErrBadSnapshot) {
					t.Fatalf("error %v does not wrap ErrBadSnapshot", err)
				}
				continue
			}
			var got []snapEntry
			snap.Range(func(key []byte, st State) bool {
				if len(key) == 0 || len(key) > MaxSnapshotKeyLen || (Limit{Algorithm: st.Algorithm, Unit: st.Unit}).Validate() != nil || !slidingCountsFit(st) {
					t.Fatalf("invalid entry accepted: %q %+v", key, st)
				}
				got = append(got, snapEntry{string(key), st})
				return true
			})
			if len(got) != snap.Len() {
				t.Fatalf("Range gave %d entries, Len %d", len(got), snap.Len())
			}
			// Encode the same entries again: they decode to the same.
			var parts [][]byte
			parts = append(parts, []byte(snapshotMagic), uv(snapshotVersion), uv(uint64(len(snap.Header.Node))), []byte(snap.Header.Node), sv(snap.Header.Written))
			for _, e := range got {
				parts = append(parts, appendSnapshotEntry(nil, []byte(e.key), e.st))
			}
			parts = append(parts, []byte{0}, uv(uint64(len(got))))
			again, err := ReadSnapshot(bytes.NewReader(sealed(parts...)))
			if err != nil {
				t.Fatalf("re-encoded snapshot refused: %v", err)
			}
			i := 0
			again.Range(func(key []byte, st State) bool {
				if e := got[i]; string(key) != e.key || st != e.st {
					t.Fatalf("entry %d: %q %+v after a round trip, was %q %+v", i, key, st, e.key, e.st)
				}
				i++
				return true
			})
			if again.Header != snap.Header || i != len(got) {
				t.Fatalf("round trip: header %+v, %d entries; was %+v, %d", again.Header, i, snap.Header, len(got))
			}
		}
	})
}

// sealedTail is b with its last four bytes replaced by the checksum of the
// rest (b as is when shorter).
func sealedTail(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	return sealed(bytes.Clone(b[:len(b)-4]))
}
