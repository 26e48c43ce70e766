package replication

import (
	"testing"

	"github.com/ringlimit/ringlimit/bucket"
)

// A full stripe drops records and counts them instead of blocking.
func TestWriteLogDropsWhenFull(t *testing.T) {
	log := &writeLog{maxRecs: 2, maxBytes: 1 << 10}
	st := bucket.State{Window: 0, Unit: 1, Count: 1}
	key := []byte("same-stripe")
	for range 5 {
		log.record(key, st)
	}
	if d := log.dropped.Load(); d != 3 {
		t.Fatalf("dropped %d, want 3", d)
	}
}
