package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
)

// What --data-dir keeps, and how often.
const (
	// snapshotFile is the node's counters in its --data-dir; snapshotTemp
	// is where the next version is written before it replaces the file.
	snapshotFile = "counters.snap"
	snapshotTemp = snapshotFile + ".tmp"
	// saveInterval is how often the counters are saved while they change,
	// unless a save takes more than a tenth of it (see saveDelay).
	saveInterval = time.Second
	// saveDuty bounds the share of one core that saving takes: after a
	// save that took d, the next starts no sooner than d*saveDuty after the
	// last one started.
	saveDuty = 10
	// minSavedUnit is the shortest window (or token bucket period) worth
	// saving: a shorter one is over, or nearly, before a restarted node is
	// ready.
	minSavedUnit = time.Minute
)

// worthSaving reports whether a counter state goes into the snapshot: its
// unit is at least minSavedUnit. (Expired states are never written.)
func worthSaving(_ []byte, st bucket.State) bool { return st.Unit >= int64(minSavedUnit) }

// dataDir keeps this node's counters in --data-dir, so that they survive a
// restart of every node at once: it reads them back once at start
// (restore), saves them every second while they change (start) and once
// more at shutdown (close). A save writes the whole snapshot to a temporary
// file, fsyncs it, renames it over the previous one and fsyncs the
// directory, so the file is always a complete snapshot, old or new. It holds
// an exclusive lock on the directory while the process runs.
type dataDir struct {
	dir, path, temp string
	node            string
	store           *bucket.Store
	clock           func() int64
	log             *slog.Logger
	unlock          func()

	// restored is set once restore has returned, whatever it found,
	// unless it was cut short: until then a save would replace a file not
	// read yet.
	restored atomic.Bool

	mu          sync.Mutex // one save at a time; guards what follows
	saved       bool       // a save has succeeded
	lastChanges uint64     // store.Changes() when the last successful save began
	failures    int        // saves failed since the last success
	failLogged  time.Time  // when a failure was last logged

	stop, done chan struct{}
	metrics    dataDirMetrics
}

// openDataDir creates dir if needed, locks it, and checks that this process
// can write there. Every error names --data-dir.
func openDataDir(dir, node string, store *bucket.Store, clock func() int64, log *slog.Logger) (*dataDir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("serve: --data-dir %s: %w", dir, err)
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("serve: --data-dir %s: %w", dir, err)
	}
	d := &dataDir{
		dir: dir, path: filepath.Join(dir, snapshotFile), temp: filepath.Join(dir, snapshotTemp),
		node: node, store: store, clock: clock, log: log, unlock: unlock,
		metrics: newDataDirMetrics(),
	}
	// A leftover temporary file (a save cut short) goes; the probe shows
	// the directory is writable by this process.
	f, err := os.OpenFile(d.temp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err == nil {
		err = f.Close()
	}
	if err == nil {
		err = os.Remove(d.temp)
	}
	if err != nil {
		unlock()
		return nil, fmt.Errorf("serve: --data-dir %s: not writable: %w", dir, err)
	}
	return d, nil
}

// restore merges the saved counters into the store, by the store's merge
// rule (so it adds to whatever the store holds, never lowers it), and logs
// one line saying what it found. A missing file (a first start) and a file
// whose windows are all over are normal and return nil; a file that cannot
// be read, is damaged or was written by another node is skipped whole and
// returned as an error. Once it has returned, saves may replace the file.
// ctx ends a long restore early; the file is then never replaced, since
// the store holds only part of it.
func (d *dataDir) restore(ctx context.Context) (err error) {
	defer func() {
		if ctx.Err() == nil {
			d.restored.Store(true)
		}
	}()
	start := time.Now()
	b, err := os.ReadFile(d.path)
	if errors.Is(err, fs.ErrNotExist) {
		d.log.Info("data-dir: no saved counters (a first start with this --data-dir)", "file", d.path)
		return nil
	}
	if err != nil {
		return fmt.Errorf("data-dir: %w", err)
	}
	snap, err := bucket.DecodeSnapshot(b)
	if err != nil {
		return fmt.Errorf("data-dir: %s: skipped: %w", d.path, err)
	}
	if snap.Header.Node != d.node {
		return fmt.Errorf("data-dir: %s: skipped: written by node %q, this is %q (give each node its own --data-dir)", d.path, snap.Header.Node, d.node)
	}
	now := d.clock()
	var merged, expired, skipped, seen int
	snap.Range(func(key []byte, st bucket.State) bool {
		switch {
		case now >= st.End():
			expired++
		case d.store.Merge(now, key, st):
			merged++
		default:
			skipped++ // the store holds as much already, or a clock ran far ahead
		}
		seen++
		return seen%4096 != 0 || ctx.Err() == nil
	})
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("data-dir: restore cut short after %d of %d entries: %w", seen, snap.Len(), err)
	}
	written := time.Unix(0, snap.Header.Written).UTC()
	age := time.Duration(now - snap.Header.Written).Round(time.Millisecond)
	if snap.Len() > 0 && expired == snap.Len() {
		d.log.Info("data-dir: saved counters are stale (every window is over): nothing restored",
			"file", d.path, "written", written.Format(time.RFC3339Nano), "age", age, "entries", snap.Len())
		return nil
	}
	d.log.Info("data-dir: restored saved counters", "file", d.path, "written", written.Format(time.RFC3339Nano), "age", age,
		"entries", snap.Len(), "merged", merged, "expired", expired, "skipped", skipped, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// start saves every saveInterval (see saveDelay) until close; a save
// waits for restore.
func (d *dataDir) start() {
	d.stop, d.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(d.done)
		timer := time.NewTimer(saveInterval)
		defer timer.Stop()
		for {
			select {
			case <-d.stop:
				return
			case <-timer.C:
			}
			wait := saveInterval
			if d.restored.Load() {
				start := time.Now()
				d.saveLogged(false)
				wait = saveDelay(time.Since(start))
			}
			timer.Reset(wait)
		}
	}()
}

// saveDelay is how long to wait after a save that took took: the next one
// starts saveInterval after this one did, or saveDuty times took after it
// when that is later (a store of millions of keys), so that saving never
// takes more than a tenth of a core.
func saveDelay(took time.Duration) time.Duration {
	return max(saveInterval, saveDuty*took) - took
}

// close stops the periodic saves, saves one last time (once restore has
// run) and releases the directory. The caller has stopped every writer of
// the store it cares about: what changes afterwards is not saved.
func (d *dataDir) close() {
	if d.stop != nil {
		close(d.stop)
		<-d.done
		d.stop = nil
	}
	if d.restored.Load() {
		d.saveLogged(true)
	}
	d.unlock()
}

// saveLogged saves and logs: the final save always, a failure the first
// time and then at most once a minute, a success after failures once.
func (d *dataDir) saveLogged(final bool) {
	start := time.Now()
	entries, size, wrote, err := d.save()
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err != nil:
		d.failures++
		if final || d.failures == 1 || time.Since(d.failLogged) >= time.Minute {
			d.log.Warn("data-dir: saving counters failed; the file keeps the last saved ones", "file", d.path, "err", err, "failures", d.failures)
			d.failLogged = time.Now()
		}
	case final:
		d.log.Info("data-dir: counters saved at shutdown", "file", d.path, "entries", entries, "bytes", size, "unchanged", !wrote, "took", time.Since(start).Round(time.Millisecond))
	case d.failures > 0 && wrote:
		d.log.Info("data-dir: saving counters works again", "file", d.path, "failures", d.failures)
		d.failures = 0
	}
}

// save writes a snapshot of the counters worth saving unless nothing
// changed since the last successful save. wrote reports whether it wrote.
func (d *dataDir) save() (entries int, size int64, wrote bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	changes := d.store.Changes()
	if d.saved && changes == d.lastChanges {
		return 0, 0, false, nil
	}
	start := time.Now()
	h := bucket.SnapshotHeader{Node: d.node, Written: d.clock()}
	size, err = writeAtomic(d.dir, d.temp, d.path, func(w io.Writer) error {
		var err error
		entries, err = d.store.WriteSnapshot(w, h, worthSaving)
		return err
	})
	if err != nil {
		d.metrics.saves.WithLabelValues("error").Inc()
		return 0, 0, false, err
	}
	d.saved, d.lastChanges = true, changes
	d.metrics.saves.WithLabelValues("ok").Inc()
	d.metrics.lastSave.Set(float64(h.Written) / 1e9)
	d.metrics.lastDuration.Set(time.Since(start).Seconds())
	d.metrics.lastEntries.Set(float64(entries))
	d.metrics.lastBytes.Set(float64(size))
	return entries, size, true, nil
}

// writeAtomic replaces path with what write writes, through temp (in dir,
// on the same file system): write, fsync, rename, fsync the directory. On
// any error path is left as it was and temp is removed. It returns the
// size written.
func writeAtomic(dir, temp, path string, write func(io.Writer) error) (int64, error) {
	f, err := os.OpenFile(temp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	size, err := func() (int64, error) {
		cw := &countingWriter{w: f}
		if err := write(cw); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
		return cw.n, nil
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(temp, path)
	}
	if err != nil {
		os.Remove(temp)
		return 0, err
	}
	// The rename is durable once the directory is.
	if err := syncDir(dir); err != nil {
		return 0, fmt.Errorf("fsync %s: %w", dir, err)
	}
	return size, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// dataDirMetrics are the saves' metrics.
type dataDirMetrics struct {
	saves                                          *prometheus.CounterVec
	lastSave, lastDuration, lastEntries, lastBytes prometheus.Gauge
}

func newDataDirMetrics() dataDirMetrics {
	m := dataDirMetrics{
		saves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringlimit_data_dir_saves_total",
			Help: "Snapshots of the counters written to --data-dir, by result (ok, error); a save with nothing changed since the last is skipped and not counted."}, []string{"result"}),
		lastSave: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_data_dir_last_save_timestamp_seconds",
			Help: "When the last successful snapshot was taken, Unix seconds."}),
		lastDuration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_data_dir_last_save_duration_seconds",
			Help: "How long the last successful snapshot took to write, fsync and rename."}),
		lastEntries: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_data_dir_last_save_entries",
			Help: "Counters in the last successful snapshot (live, with windows of a minute or more)."}),
		lastBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_data_dir_last_save_bytes",
			Help: "Size of the last successful snapshot file."}),
	}
	// Both results are exported from the start, at zero, so that an alert
	// on increase(...{result="error"}) sees the first failed save.
	m.saves.WithLabelValues("ok")
	m.saves.WithLabelValues("error")
	return m
}

func (m dataDirMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.saves, m.lastSave, m.lastDuration, m.lastEntries, m.lastBytes}
}
