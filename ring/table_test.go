package ring

import (
	"slices"
	"sync"
	"testing"
)

func TestTableZeroAndNil(t *testing.T) {
	var tab Table
	if r := tab.Load(); r == nil || r.Len() != 0 {
		t.Fatalf("zero Table Load() = %v", r)
	}
	if _, ok := tab.Load().Owner([]byte("k")); ok {
		t.Fatal("zero Table has an owner")
	}
	r := mustNew(t, []string{"a", "b"}, Config{})
	tab.Store(r)
	if tab.Load() != r {
		t.Fatal("Load did not return the stored ring")
	}
	tab.Store(nil)
	if got := tab.Load(); got == nil || got.Len() != 0 {
		t.Fatalf("after Store(nil) Load() = %v, want the empty ring", got)
	}
}

// TestTableConcurrent runs readers against a writer that keeps publishing
// new snapshots; run it with -race. Each reader checks that what one Load
// returns is self-consistent.
func TestTableConcurrent(t *testing.T) {
	snapshots := []*Ring{nil}
	for n := 1; n <= 8; n++ {
		snapshots = append(snapshots, mustNew(t, nodeIDs("c", n), Config{}))
	}
	keys := testKeys(64)
	var tab Table
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			dst := make([]string, 0, 3)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				r := tab.Load()
				k := keys[i%len(keys)]
				id, ok := r.Owner(k)
				if ok != (r.Len() > 0) || (ok && !slices.Contains(r.ids, id)) {
					t.Errorf("Owner = %q, %v on a ring of %d", id, ok, r.Len())
					return
				}
				dst = r.Successors(k, 3, dst[:0])
				if len(dst) != min(3, r.Len()) || (ok && dst[0] != id) {
					t.Errorf("Successors = %v, owner %q, ring of %d", dst, id, r.Len())
					return
				}
			}
		})
	}
	for i := range 2000 {
		tab.Store(snapshots[i%len(snapshots)])
	}
	close(done)
	wg.Wait()
}
