package replication

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

// A copy made before a release does not count the released hits again
// when it comes back; a copy that never included the lease is merged as it
// is.
func TestReleasedHitsStayReleasedAcrossMerges(t *testing.T) {
	unit := int64(time.Minute)
	now := 10 * unit
	key := []byte("k")
	lim := bucket.Limit{Requests: 100, Unit: unit}
	for _, tt := range []struct {
		name string
		copy uint64 // the copy's count, same window
		want uint64 // the owner's count after merging it
	}{
		{"a copy with the lease", 30, 22},
		{"a copy with the lease and 5 more hits", 35, 27},
		{"a copy from before the lease", 20, 22},
		{"an older, lower copy", 10, 22},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := NewRecorder(bucket.NewStore(bucket.StoreConfig{}), false)
			rec.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 20})
			rec.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 10, Mode: bucket.StopOnOver}) // a lease of 10, at 30
			if !rec.Release(now, key, lim, now, 8, 30) {                                        // 2 of it used
				t.Fatal("release refused")
			}
			rec.Merge(now, key, bucket.State{Algorithm: bucket.FixedWindow, Window: now, Unit: unit, Count: tt.copy})
			if st, _ := rec.store.Get(now, key); st.Count != tt.want {
				t.Errorf("count %d, want %d", st.Count, tt.want)
			}
		})
	}
}

func TestReleasedBookForgetsOtherWindows(t *testing.T) {
	unit := int64(time.Minute)
	now := 10 * unit
	key := []byte("k")
	lim := bucket.Limit{Requests: 100, Unit: unit}
	rec := NewRecorder(bucket.NewStore(bucket.StoreConfig{}), false)
	rec.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 30})
	rec.Release(now, key, lim, now, 8, 30)
	next := now + unit
	rec.Merge(next, key, bucket.State{Algorithm: bucket.FixedWindow, Window: next, Unit: unit, Count: 40})
	if st, _ := rec.store.Get(next, key); st.Count != 40 {
		t.Errorf("next window's copy merged as %d, want 40 untouched", st.Count)
	}
}
