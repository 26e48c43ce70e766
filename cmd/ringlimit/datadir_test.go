package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

// t0 is an hour-aligned instant (2023-11-14T22:00:00Z); tests run their
// clocks from it.
var t0 = time.Date(2023, 11, 14, 22, 0, 0, 0, time.UTC).UnixNano()

var (
	hourLimit   = bucket.Limit{Requests: 100, Unit: int64(time.Hour)}
	minuteLimit = bucket.Limit{Algorithm: bucket.SlidingWindow, Requests: 100, Unit: int64(time.Minute)}
	secondLimit = bucket.Limit{Requests: 100, Unit: int64(time.Second)}
)

// syncBuffer is a log destination safe for the saver's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now int64
}

func (c *fakeClock) read() int64 { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) set(v int64) { c.mu.Lock(); defer c.mu.Unlock(); c.now = v }

// dataNode is one node's view of a data dir in a test: its store, clock
// and log.
type dataNode struct {
	d     *dataDir
	store *bucket.Store
	clock *fakeClock
	log   *syncBuffer
}

func openTestDataDir(t *testing.T, dir, node string, now int64) *dataNode {
	t.Helper()
	n := &dataNode{store: bucket.NewStore(bucket.StoreConfig{}), clock: &fakeClock{now: now}, log: &syncBuffer{}}
	d, err := openDataDir(dir, node, n.store, n.clock.read, slog.New(slog.NewTextHandler(n.log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.unlock)
	n.d = d
	return n
}

func (n *dataNode) hit(key string, lim bucket.Limit, hits uint64) {
	n.store.Apply(n.clock.read(), &bucket.Op{Key: []byte(key), Limit: lim, Hits: hits})
}

func (n *dataNode) count(key string) uint64 {
	st, _ := n.store.Get(n.clock.read(), []byte(key))
	return st.Count
}

func TestDataDirSaveAndRestore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // created by openDataDir
	a := openTestDataDir(t, dir, "node-a", t0+10*int64(time.Minute))
	a.hit("hour", hourLimit, 7)
	a.hit("minute", minuteLimit, 3)
	a.hit("second", secondLimit, 9)
	a.d.restored.Store(true) // as after a restore that found no file
	entries, size, wrote, err := a.d.save()
	if err != nil || !wrote || entries != 2 || size == 0 {
		t.Fatalf("save: %d entries, %d bytes, wrote %v, err %v; want 2 entries (the second window is not worth saving)", entries, size, wrote, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, snapshotFile)); err != nil || fi.Size() != size || fi.Mode().Perm() != 0o600 {
		t.Fatalf("file: %v, %v; want %d bytes, mode 0600", fi, err, size)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshotTemp)); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	// Nothing changed: no write.
	if _, _, wrote, err := a.d.save(); wrote || err != nil {
		t.Errorf("second save with no change: wrote %v, err %v", wrote, err)
	}
	a.hit("hour", hourLimit, 1)
	if _, _, wrote, err := a.d.save(); !wrote || err != nil {
		t.Errorf("save after a hit: wrote %v, err %v", wrote, err)
	}
	a.d.unlock()

	// The restarted node, 20 s later, already holding some counts from a
	// peer: the two merge by maximum.
	b := openTestDataDir(t, dir, "node-a", t0+10*int64(time.Minute)+20*int64(time.Second))
	b.hit("hour", hourLimit, 5)  // below the saved 8: the saved count wins
	b.hit("other", hourLimit, 2) // not in the file: kept
	if err := b.d.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]uint64{"hour": 8, "minute": 3, "second": 0, "other": 2} {
		if got := b.count(key); got != want {
			t.Errorf("%s: %d after restore, want %d", key, got, want)
		}
	}
	if log := b.log.String(); !strings.Contains(log, "restored saved counters") || !strings.Contains(log, "merged=2") || !strings.Contains(log, "entries=2") {
		t.Errorf("log does not say what was restored:\n%s", log)
	}
}

func TestDataDirRestoreSkips(t *testing.T) {
	hourIn := t0 + 10*int64(time.Minute)
	saved := func(t *testing.T, node string) string {
		dir := t.TempDir()
		n := openTestDataDir(t, dir, node, hourIn)
		n.hit("hour", hourLimit, 7)
		n.d.restored.Store(true)
		if _, _, _, err := n.d.save(); err != nil {
			t.Fatal(err)
		}
		n.d.unlock()
		return dir
	}
	t.Run("missing", func(t *testing.T) {
		n := openTestDataDir(t, t.TempDir(), "node-a", hourIn)
		if err := n.d.restore(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(n.log.String(), "no saved counters") {
			t.Errorf("log:\n%s", n.log.String())
		}
	})
	t.Run("foreign", func(t *testing.T) {
		n := openTestDataDir(t, saved(t, "node-a"), "node-b", hourIn)
		err := n.d.restore(context.Background())
		if err == nil || !strings.Contains(err.Error(), `written by node "node-a", this is "node-b"`) {
			t.Fatalf("err %v", err)
		}
		if n.store.Len() != 0 {
			t.Errorf("%d keys merged from another node's file", n.store.Len())
		}
	})
	t.Run("stale", func(t *testing.T) {
		n := openTestDataDir(t, saved(t, "node-a"), "node-a", hourIn+int64(time.Hour))
		if err := n.d.restore(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n.store.Len() != 0 || !strings.Contains(n.log.String(), "stale") {
			t.Errorf("%d keys; log:\n%s", n.store.Len(), n.log.String())
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		dir := saved(t, "node-a")
		path := filepath.Join(dir, snapshotFile)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range [][]byte{b[:len(b)/2], append(append([]byte(nil), b[:20]...), b[21:]...), []byte("not a snapshot")} {
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			n := openTestDataDir(t, dir, "node-a", hourIn)
			err := n.d.restore(context.Background())
			if !errors.Is(err, bucket.ErrBadSnapshot) || !strings.Contains(err.Error(), "skipped") {
				t.Fatalf("err %v", err)
			}
			if n.store.Len() != 0 {
				t.Errorf("%d keys merged from a damaged file", n.store.Len())
			}
			// The next save replaces the damaged file.
			n.hit("new", hourLimit, 1)
			n.d.close()
			again := openTestDataDir(t, dir, "node-a", hourIn)
			if err := again.d.restore(context.Background()); err != nil || again.count("new") != 1 {
				t.Fatalf("after a save over the damaged file: %v, count %d", err, again.count("new"))
			}
			again.d.unlock()
		}
	})
}

// A save that fails part-way (a crash, a full disk) leaves the previous
// file whole; a temporary file left by a killed process is ignored on
// restore and removed at the next start.
func TestDataDirWriteIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path, temp := filepath.Join(dir, snapshotFile), filepath.Join(dir, snapshotTemp)
	if _, err := writeAtomic(dir, temp, path, func(w io.Writer) error {
		_, err := w.Write([]byte("old"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	_, err := writeAtomic(dir, temp, path, func(w io.Writer) error {
		w.Write([]byte("new, half written"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("file is %q after a failed save, want the old content", b)
	}
	if _, err := os.Stat(temp); !os.IsNotExist(err) {
		t.Errorf("temporary file left after a failed save: %v", err)
	}

	// A process killed mid-save leaves a partial temporary file and the
	// old snapshot.
	n := openTestDataDir(t, dir, "node-a", t0)
	n.hit("hour", hourLimit, 4)
	n.d.restored.Store(true)
	if _, _, _, err := n.d.save(); err != nil {
		t.Fatal(err)
	}
	n.d.unlock()
	good, _ := os.ReadFile(path)
	if err := os.WriteFile(temp, good[:len(good)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	m := openTestDataDir(t, dir, "node-a", t0)
	if _, err := os.Stat(temp); !os.IsNotExist(err) {
		t.Errorf("the leftover temporary file survived a start: %v", err)
	}
	if err := m.d.restore(context.Background()); err != nil || m.count("hour") != 4 {
		t.Fatalf("restore: %v, count %d; want the last complete save's 4", err, m.count("hour"))
	}
}

func TestDataDirOpenErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(bucket.StoreConfig{})
	log := slog.New(slog.DiscardHandler)
	clock := func() int64 { return t0 }
	for _, bad := range []string{file, filepath.Join(file, "sub")} {
		if _, err := openDataDir(bad, "n", store, clock, log); err == nil || !strings.Contains(err.Error(), "--data-dir "+bad) {
			t.Errorf("%s: err %v, want one naming --data-dir and the path", bad, err)
		}
	}
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "read-only")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		if _, err := openDataDir(ro, "n", store, clock, log); err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Errorf("read-only dir: err %v", err)
		}
	}
	// One process per data dir.
	d, err := openDataDir(dir, "n", store, clock, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openDataDir(dir, "n", store, clock, log); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a second open of a locked dir: err %v", err)
	}
	d.unlock()
	d2, err := openDataDir(dir, "n", store, clock, log)
	if err != nil {
		t.Fatalf("open after unlock: %v", err)
	}
	d2.unlock()
}

// The periodic saver writes once restore has run, and close saves the
// last changes; a node closed before it restored leaves the file alone.
func TestDataDirSaverAndClose(t *testing.T) {
	dir := t.TempDir()
	n := openTestDataDir(t, dir, "node-a", t0)
	n.hit("hour", hourLimit, 2)
	n.d.start()
	n.d.close() // never restored: the file is not replaced
	if _, err := os.Stat(filepath.Join(dir, snapshotFile)); !os.IsNotExist(err) {
		t.Fatalf("a node that never restored saved: %v", err)
	}

	m := openTestDataDir(t, dir, "node-a", t0)
	if err := m.d.restore(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.d.start()
	m.hit("hour", hourLimit, 3)
	deadline := time.Now().Add(10 * time.Second)
	for !fileHolds(t, dir, "node-a", t0, "hour", 3) {
		if time.Now().After(deadline) {
			t.Fatal("the periodic save did not write within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // polling a bounded wait
	}
	m.hit("hour", hourLimit, 1)
	m.d.close()
	if !fileHolds(t, dir, "node-a", t0, "hour", 4) {
		t.Fatal("close did not save the last change")
	}
	if log := m.log.String(); !strings.Contains(log, "counters saved at shutdown") {
		t.Errorf("no shutdown line in the log:\n%s", log)
	}
}

// fileHolds reports whether the snapshot in dir holds count for key.
func fileHolds(t *testing.T, dir, node string, now int64, key string, count uint64) bool {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, snapshotFile))
	if os.IsNotExist(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	snap, err := bucket.ReadSnapshot(f)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Header.Node != node {
		t.Fatalf("file written by %q", snap.Header.Node)
	}
	found := false
	snap.Range(func(k []byte, st bucket.State) bool {
		if string(k) == key && st.Count == count {
			found = true
		}
		return true
	})
	return found
}

func TestSaveDelay(t *testing.T) {
	for _, tc := range []struct{ took, want time.Duration }{
		{0, time.Second},
		{5 * time.Millisecond, 995 * time.Millisecond},
		{100 * time.Millisecond, 900 * time.Millisecond},
		{600 * time.Millisecond, 5400 * time.Millisecond},
	} {
		if got := saveDelay(tc.took); got != tc.want {
			t.Errorf("saveDelay(%v) = %v, want %v", tc.took, got, tc.want)
		}
	}
}

// A restore cut short (the node closed while loading) leaves the file as
// it was: the store holds only part of it, and no save may replace it.
func TestDataDirRestoreCutShort(t *testing.T) {
	dir := t.TempDir()
	a := openTestDataDir(t, dir, "node-a", t0)
	for i := range 10_000 {
		a.hit(fmt.Sprintf("key-%d", i), hourLimit, 1)
	}
	a.d.restored.Store(true)
	if _, _, _, err := a.d.save(); err != nil {
		t.Fatal(err)
	}
	a.d.unlock()
	before, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	if err != nil {
		t.Fatal(err)
	}
	b := openTestDataDir(t, dir, "node-a", t0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.d.restore(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("restore with a cancelled context: %v", err)
	}
	if n := b.store.Len(); n == 0 || n == 10_000 {
		t.Fatalf("%d keys restored, want part of them", n)
	}
	b.d.start()
	b.d.close()
	if after, err := os.ReadFile(filepath.Join(dir, snapshotFile)); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the file changed after a cut-short restore (err %v)", err)
	}
}

func TestDataDirFlagAndEnv(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  environment
		want string
	}{
		{nil, nil, ""},
		{nil, environment{"RINGLIMIT_DATA_DIR=/from/env"}, "/from/env"},
		{[]string{"--data-dir", "/from/flag"}, environment{"RINGLIMIT_DATA_DIR=/from/env"}, "/from/flag"},
	} {
		c, _, err := parseServeFlags(append([]string{"--node-name", "n"}, tc.args...), tc.env, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.DataDir != tc.want {
			t.Errorf("args %q env %q: DataDir %q, want %q", tc.args, tc.env, c.DataDir, tc.want)
		}
	}
}
