package replication

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

// Recording a write for replication allocates nothing in steady state.
func TestRecorderZeroAllocs(t *testing.T) {
	store := bucket.NewStore(bucket.StoreConfig{})
	log := newWriteLog()
	rs := Recorder{store: store, log: log}
	op := bucket.Op{Key: []byte("domain\x00key\x00value"), Limit: bucket.Limit{Requests: 1 << 40, Unit: int64(time.Minute)}, Hits: 1}
	var spare [numStripes]recBuf
	drain := func() {
		for i := range spare {
			log.swap(i, &spare[i])
			spare[i].reset()
		}
	}
	for range 2 * stripeRecs { // grow every buffer to steady state
		rs.Apply(1e18, &op)
	}
	drain()
	drain()
	if n := testing.AllocsPerRun(1000, func() { rs.Apply(1e18, &op) }); n != 0 {
		t.Fatalf("%v allocs per recorded apply, want 0", n)
	}
	recs := 0
	for i := range log.stripes {
		recs += len(log.stripes[i].buf.recs)
	}
	if recs == 0 {
		t.Fatal("nothing recorded")
	}
}

// A key decided here instead of at its owner continues from the owner's
// last remembered answer, in the owner's window; answers far below the
// limit are not remembered.
func TestRecorderRemembersAnswers(t *testing.T) {
	const unit = int64(time.Minute)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % unit
	now := w + 20*int64(time.Second)
	lim := bucket.Limit{Requests: 10, Unit: unit}
	op := func(key string, mode bucket.Mode) *bucket.Op {
		return &bucket.Op{Key: []byte(key), Limit: lim, Hits: 1, Mode: mode}
	}
	answer := func(count uint64, skew int64) bucket.Result {
		r := bucket.Result{Count: count, Over: count > 10, ResetAfter: w + unit - now + skew}
		if !r.Over {
			r.Remaining = 10 - count
		}
		return r
	}
	tests := []struct {
		name   string
		op     *bucket.Op
		answer bucket.Result
		want   bucket.Result // of the next hit decided here
	}{
		{"over", op("a", bucket.Consume), answer(12, 0), bucket.Result{Over: true, Count: 13, ResetAfter: w + unit - now}},
		{"exhausted, owner clock behind", op("b", bucket.Consume), answer(10, -3*int64(time.Millisecond)), bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}},
		{"half used, owner clock ahead", op("c", bucket.Consume), answer(5, 3*int64(time.Millisecond)), bucket.Result{Count: 6, Remaining: 4, ResetAfter: w + unit - now}},
		{"far below the limit: not kept", op("d", bucket.Consume), answer(2, 0), bucket.Result{Count: 1, Remaining: 9, ResetAfter: w + unit - now}},
		{"peek: the hits were not stored", op("e", bucket.Peek), answer(12, 0), bucket.Result{Over: true, Count: 12, ResetAfter: w + unit - now}},
		{"stop on over: the hits were not stored", op("f", bucket.StopOnOver), answer(11, 0), bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := Recorder{store: bucket.NewStore(bucket.StoreConfig{}), shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
			rs.Remember(now, tt.op, tt.answer)
			next := *tt.op
			next.Mode = bucket.Consume
			if got := rs.ApplyInstead(now, &next); got != tt.want {
				t.Fatalf("next hit here: %+v, want %+v", got, tt.want)
			}
		})
	}
}

// A key its owner answered over the limit is answered over here until the
// owner's window ends, without asking the owner again; anything else still
// goes to the owner.
func TestRecorderOverUntil(t *testing.T) {
	const unit = int64(time.Minute)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % unit
	now := w + 20*int64(time.Second)
	lim := bucket.Limit{Requests: 10, Unit: unit}
	answer := func(count uint64) bucket.Result {
		r := bucket.Result{Count: count, Over: count > 10, ResetAfter: w + unit - now}
		if !r.Over {
			r.Remaining = 10 - count
		}
		return r
	}
	tests := []struct {
		name     string
		answered uint64
		at       int64        // when the next hit comes
		lim      bucket.Limit // of the next hit
		hits     uint64
		want     bucket.Result
		wantOver bool
	}{
		{"over: answered here", 11, now + int64(time.Second), lim, 1, bucket.Result{Over: true, Count: 12, ResetAfter: w + unit - now - int64(time.Second)}, true},
		{"over, check only", 11, now, lim, 0, bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}, true},
		{"exactly at the limit: ask the owner", 10, now, lim, 1, bucket.Result{}, false},
		{"next window: ask the owner", 11, w + unit, lim, 1, bucket.Result{}, false},
		{"limit raised by a reload: ask the owner", 11, now, bucket.Limit{Requests: 20, Unit: unit}, 1, bucket.Result{}, false},
		{"unit changed: ask the owner", 11, now, bucket.Limit{Requests: 10, Unit: int64(time.Hour)}, 1, bucket.Result{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs := Recorder{store: bucket.NewStore(bucket.StoreConfig{}), shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
			rs.Remember(now, &bucket.Op{Key: []byte("k"), Limit: lim, Hits: 1}, answer(tt.answered))
			got, over := rs.OverUntil(tt.at, &bucket.Op{Key: []byte("k"), Limit: tt.lim, Hits: tt.hits})
			if over != tt.wantOver || got != tt.want {
				t.Fatalf("overUntil = %+v, %v; want %+v, %v", got, over, tt.want, tt.wantOver)
			}
		})
	}
	// Nothing remembered, or no shadow at all: ask the owner.
	rs := Recorder{store: bucket.NewStore(bucket.StoreConfig{})}
	if _, over := rs.OverUntil(now, &bucket.Op{Key: []byte("k"), Limit: lim, Hits: 1}); over {
		t.Fatal("no shadow: answered locally")
	}
}

// A node that becomes the owner of keys it held no copy of adopts the
// owners' last answers: the keys it now owns continue from them (and go to
// the replication log), the others stay as they were.
func TestRecorderAdopt(t *testing.T) {
	const unit = int64(time.Minute)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % unit
	now := w + 20*int64(time.Second)
	lim := bucket.Limit{Requests: 10, Unit: unit}
	log := newWriteLog()
	rs := Recorder{store: bucket.NewStore(bucket.StoreConfig{}), log: log, shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
	over := bucket.Result{Over: true, Count: 11, ResetAfter: w + unit - now}
	for _, k := range []string{"mine", "theirs"} {
		rs.Remember(now, &bucket.Op{Key: []byte(k), Limit: lim, Hits: 1}, over)
	}
	rs.Adopt(now, func(key []byte) bool { return string(key) == "mine" })

	for _, tt := range []struct {
		key  string
		want bucket.Result
	}{
		{"mine", bucket.Result{Over: true, Count: 12, ResetAfter: w + unit - now}},
		{"theirs", bucket.Result{Count: 1, Remaining: 9, ResetAfter: w + unit - now}},
	} {
		if got := rs.store.(*bucket.Store).Apply(now, &bucket.Op{Key: []byte(tt.key), Limit: lim, Hits: 1}); got != tt.want {
			t.Errorf("%s after adopt: %+v, want %+v", tt.key, got, tt.want)
		}
	}
	var spare recBuf
	var recorded []string
	for i := range numStripes {
		log.swap(i, &spare)
		for _, r := range spare.recs {
			recorded = append(recorded, string(spare.keys[r.off:r.off+r.n]))
		}
		spare.recs, spare.keys = spare.recs[:0], spare.keys[:0]
	}
	if len(recorded) != 1 || recorded[0] != "mine" {
		t.Errorf("replication log holds %q, want the adopted key only", recorded)
	}
}

// A remembered answer under another unit (a reload changed the limit, or
// an override shares the descriptor) does not replace the live counter.
func TestRecorderAdoptKeepsOtherUnits(t *testing.T) {
	const minute, hour = int64(time.Minute), int64(time.Hour)
	w := int64(1_700_000_000) * int64(time.Second)
	w -= w % hour
	now := w + 20*int64(time.Second)
	rs := Recorder{store: bucket.NewStore(bucket.StoreConfig{}), shadow: bucket.NewStore(bucket.StoreConfig{MaxKeys: 16})}
	hourly := bucket.Limit{Requests: 1000, Unit: hour}
	for range 900 {
		rs.store.(*bucket.Store).Apply(now, &bucket.Op{Key: []byte("k"), Limit: hourly, Hits: 1})
	}
	rs.Remember(now, &bucket.Op{Key: []byte("k"), Limit: bucket.Limit{Requests: 100, Unit: minute}, Hits: 1},
		bucket.Result{Over: true, Count: 101, ResetAfter: minute - now%minute})
	rs.Adopt(now, func([]byte) bool { return true })
	if got := rs.ApplyInstead(now, &bucket.Op{Key: []byte("k"), Limit: hourly, Hits: 1}); got.Count != 901 {
		t.Fatalf("hourly count after adopting a per-minute answer: %d, want 901", got.Count)
	}
}
