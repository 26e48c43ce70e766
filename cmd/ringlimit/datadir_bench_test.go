package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

// benchKeys is the number of counters the --data-dir benchmarks save and
// restore: the default --max-keys, about.
const benchKeys = 1_000_000

// benchDataDir is a data dir holding a store of benchKeys hour-window
// counters shaped like the seed config's (domain, remote_address, PATH),
// saved once. The file goes under $RINGLIMIT_BENCH_DIR when set (a disk
// like the one production uses), else the test's temporary directory.
func benchDataDir(b *testing.B) (*dataDir, *bucket.Store, int64) {
	b.Helper()
	parent := os.Getenv("RINGLIMIT_BENCH_DIR")
	if parent == "" {
		parent = b.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "data-dir-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	now := t0 + 10*int64(time.Minute)
	store := bucket.NewStore(bucket.StoreConfig{})
	lim := bucket.Limit{Requests: 1000, Unit: int64(time.Hour)}
	var key []byte
	for i := range benchKeys {
		key = seedKey(key[:0], i)
		store.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: uint64(1 + i%100)})
	}
	d, err := openDataDir(dir, "ringlimit-0", store, func() int64 { return now }, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.unlock)
	d.restored.Store(true)
	if _, _, _, err := d.save(); err != nil {
		b.Fatal(err)
	}
	return d, store, now
}

// seedKey appends the counter key of domain ratelimit, remote_address
// 10.x.y.z (the i-th address), PATH /login, as rls builds it.
func seedKey(dst []byte, i int) []byte {
	for _, s := range []string{"ratelimit", "remote_address", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "PATH", "/login"} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	return dst
}

// BenchmarkDataDirSave: one save of 1 M counters (snapshot, fsync, rename,
// fsync of the directory); ns/op is the time for 1 M keys.
func BenchmarkDataDirSave(b *testing.B) {
	d, _, _ := benchDataDir(b)
	var size int64
	b.ResetTimer()
	for b.Loop() {
		d.saved = false // as if counters changed
		entries, n, _, err := d.save()
		if err != nil || entries != benchKeys {
			b.Fatalf("%d entries, %v", entries, err)
		}
		size = n
	}
	b.ReportMetric(float64(size)/(1<<20), "MiB")
	b.ReportMetric(float64(size)/benchKeys, "B/key")
}

// BenchmarkDataDirRestore: reading the file of 1 M counters and merging
// every one into an empty store, as a node does at start; ns/op is the
// time for 1 M keys.
func BenchmarkDataDirRestore(b *testing.B) {
	d, _, now := benchDataDir(b)
	fi, err := os.Stat(filepath.Join(d.dir, snapshotFile))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		fresh := bucket.NewStore(bucket.StoreConfig{})
		r := &dataDir{path: d.path, node: d.node, store: fresh, clock: func() int64 { return now }, log: slog.New(slog.DiscardHandler)}
		b.StartTimer()
		if err := r.restore(context.Background()); err != nil {
			b.Fatal(err)
		}
		if fresh.Len() != benchKeys {
			b.Fatalf("restored %d keys", fresh.Len())
		}
	}
	b.ReportMetric(float64(fi.Size())/(1<<20), "MiB")
}
