package rls

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// watchRecorder collects a Watcher's callbacks.
type watchRecorder struct {
	mu   sync.Mutex
	cfgs []*Config
	errs []error
}

func (r *watchRecorder) onLoad(c *Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cfgs = append(r.cfgs, c)
}

func (r *watchRecorder) onError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// lastDump is the Dump of the last config loaded ("" if none).
func (r *watchRecorder) lastDump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cfgs) == 0 {
		return ""
	}
	return r.cfgs[len(r.cfgs)-1].Dump()
}

func (r *watchRecorder) errCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs)
}

func (r *watchRecorder) lastErr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) == 0 {
		return ""
	}
	return r.errs[len(r.errs)-1].Error()
}

// watchWaitFor polls cond until it holds, failing the test after 10 s.
func watchWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// watchWriteAtomic replaces dir/name with content the way tools do: a
// temporary dotfile, then a rename.
func watchWriteAtomic(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func watchDump(domain, key string, rpu int) string {
	return domain + "." + key + ": unit=MINUTE requests_per_unit=" + strconv.Itoa(rpu) + ", shadow_mode: false, quota_mode: false\n"
}

func TestWatchDirectory(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	cfgWrite(t, dir, map[string]string{"a.yaml": cfgRule("a", "k", 1)})
	if _, err := Load(dir, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	var rec watchRecorder
	w, err := NewWatcher(dir, LoadOptions{}, rec.onLoad, rec.onError)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	// An edit in place.
	cfgWrite(t, dir, map[string]string{"a.yaml": cfgRule("a", "k", 2)})
	watchWaitFor(t, "the edited file", func() bool { return rec.lastDump() == watchDump("a", "k", 2) })

	// A bad new file: an error, and no config. The in-place edit above may
	// have been read half written (an error about a.yaml) on a busy
	// machine, so wait for this file's error, not for any error.
	watchWriteAtomic(t, dir, "b.yaml", "domain: b\nbogus: 1\n")
	watchWaitFor(t, "the error", func() bool {
		return strings.Contains(rec.lastErr(), "b.yaml: bogus: unknown key 'bogus'")
	})
	// The good version of it.
	watchWriteAtomic(t, dir, "b.yaml", cfgRule("b", "j", 3))
	want := watchDump("a", "k", 2) + watchDump("b", "j", 3)
	watchWaitFor(t, "the fixed file", func() bool { return rec.lastDump() == want })

	// A removal.
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	watchWaitFor(t, "the removal", func() bool { return rec.lastDump() == watchDump("a", "k", 2) })

	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestWatchSubdirectories: files in subdirectories are watched as the
// directory's own: an edit in an existing subdirectory, a file in a new
// subdirectory (and a later edit of it), the removal of a subdirectory.
func TestWatchSubdirectories(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	cfgWrite(t, dir, map[string]string{"a.yaml": cfgRule("a", "k", 1), "sub/deep/b.yaml": cfgRule("b", "j", 1)})
	var rec watchRecorder
	w, err := NewWatcher(dir, LoadOptions{}, rec.onLoad, rec.onError)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	watchWriteAtomic(t, filepath.Join(dir, "sub", "deep"), "b.yaml", cfgRule("b", "j", 2))
	want := watchDump("a", "k", 1) + watchDump("b", "j", 2)
	watchWaitFor(t, "the edit in sub/deep", func() bool { return rec.lastDump() == want })

	cfgWrite(t, dir, map[string]string{"new/c.yaml": cfgRule("c", "i", 3)})
	want = watchDump("a", "k", 1) + watchDump("b", "j", 2) + watchDump("c", "i", 3)
	watchWaitFor(t, "the file in a new subdirectory", func() bool { return rec.lastDump() == want })
	watchWriteAtomic(t, filepath.Join(dir, "new"), "c.yaml", cfgRule("c", "i", 4))
	want = watchDump("a", "k", 1) + watchDump("b", "j", 2) + watchDump("c", "i", 4)
	watchWaitFor(t, "the edit in the new subdirectory", func() bool { return rec.lastDump() == want })

	if err := os.RemoveAll(filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	want = watchDump("a", "k", 1) + watchDump("c", "i", 4)
	watchWaitFor(t, "the removed subdirectory", func() bool { return rec.lastDump() == want })
}

// TestWatchReplacedDirectory: the config directory itself removed and
// created again (rm -rf; cp -r) is followed: its new files reload, and so
// does a later edit of them.
func TestWatchReplacedDirectory(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := filepath.Join(t.TempDir(), "config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfgWrite(t, dir, map[string]string{"a.yaml": cfgRule("a", "k", 1)})
	var rec watchRecorder
	w, err := NewWatcher(dir, LoadOptions{}, rec.onLoad, rec.onError)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i, via := range []string{"removed and created", "renamed over"} {
		n := 10 * (i + 1)
		switch i {
		case 0:
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			cfgWrite(t, dir, map[string]string{"a.yaml": cfgRule("a", "k", n)})
		case 1:
			next := dir + ".new"
			if err := os.Mkdir(next, 0o755); err != nil {
				t.Fatal(err)
			}
			cfgWrite(t, next, map[string]string{"a.yaml": cfgRule("a", "k", n)})
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(next, dir); err != nil {
				t.Fatal(err)
			}
		}
		watchWaitFor(t, "the new directory ("+via+")", func() bool { return rec.lastDump() == watchDump("a", "k", n) })
		cfgWrite(t, dir, map[string]string{"a.yaml": cfgRule("a", "k", n+1)})
		watchWaitFor(t, "an edit in the new directory ("+via+")", func() bool { return rec.lastDump() == watchDump("a", "k", n+1) })
	}
}

// watchConfigMapSwapper returns a function that updates a ConfigMap mount
// as the kubelet does: a new timestamped directory holding sub/ratelimit.yaml,
// then a rename of the ..data symlink to it, then (removeOld) the removal of
// the previous directory.
func watchConfigMapSwapper(t *testing.T, mount, sub string, removeOld bool) func(content string) {
	version := 0
	return func(content string) {
		t.Helper()
		version++
		ts := "..2026_01_01_00_00_0" + strconv.Itoa(version)
		cfgWrite(t, mount, map[string]string{filepath.Join(ts, sub, "ratelimit.yaml"): content})
		cfgSymlink(t, ts, filepath.Join(mount, "..data_tmp"))
		if err := os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
		if removeOld && version > 1 {
			if err := os.RemoveAll(filepath.Join(mount, "..2026_01_01_00_00_0"+strconv.Itoa(version-1))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestWatchConfigMap swaps a Kubernetes ConfigMap mount atomically (a new
// timestamped directory, then a rename of the ..data symlink), watching the
// directory and, as a file, the symlinked config.
func TestWatchConfigMap(t *testing.T) {
	for _, asFile := range []bool{false, true} {
		name := "directory"
		if asFile {
			name = "file"
		}
		t.Run(name, func(t *testing.T) {
			defer goleak.VerifyNone(t)
			dir := t.TempDir()
			swap := watchConfigMapSwapper(t, dir, "", false)
			swap(cfgRule("cm", "k", 100))
			cfgSymlink(t, "..data/ratelimit.yaml", filepath.Join(dir, "ratelimit.yaml"))
			path := dir
			if asFile {
				path = filepath.Join(dir, "ratelimit.yaml")
			}
			watchSwaps(t, path, swap)
		})
	}
}

// TestWatchSymlinkedDirectory watches a config directory reached through
// symlinks that a swap replaces: a ConfigMap whose items sit under a
// subdirectory (config -> ..data/config), and the reference's layout, where
// current -> a release directory is swapped. Every swap must reload, not
// only the first (which the deletion of the old directory's files shows
// even without following the link).
func TestWatchSymlinkedDirectory(t *testing.T) {
	for _, removeOld := range []bool{false, true} {
		t.Run("configmap/removeOld="+strconv.FormatBool(removeOld), func(t *testing.T) {
			defer goleak.VerifyNone(t)
			mount := t.TempDir()
			swap := watchConfigMapSwapper(t, mount, "config", removeOld)
			swap(cfgRule("cm", "k", 100))
			cfgSymlink(t, filepath.Join("..data", "config"), filepath.Join(mount, "config"))
			watchSwaps(t, filepath.Join(mount, "config"), swap)
		})
	}
	t.Run("release symlink", func(t *testing.T) {
		defer goleak.VerifyNone(t)
		root := t.TempDir()
		version := 0
		swap := func(content string) {
			t.Helper()
			version++
			rel := "release-" + strconv.Itoa(version)
			cfgWrite(t, root, map[string]string{filepath.Join(rel, "ratelimit", "config", "ratelimit.yaml"): content})
			cfgSymlink(t, rel, filepath.Join(root, "current.tmp"))
			if err := os.Rename(filepath.Join(root, "current.tmp"), filepath.Join(root, "current")); err != nil {
				t.Fatal(err)
			}
		}
		swap(cfgRule("cm", "k", 100))
		watchSwaps(t, filepath.Join(root, "current", "ratelimit", "config"), swap)
	})
	t.Run("nested symlinks", func(t *testing.T) {
		// current -> a release, whose config -> a directory in it: the
		// first swaps replace the release, the later ones the inner link of
		// the release current then leads to.
		defer goleak.VerifyNone(t)
		root := t.TempDir()
		version := 0
		swapLink := func(dir, name, target string) {
			t.Helper()
			cfgSymlink(t, target, filepath.Join(dir, name+".tmp"))
			if err := os.Rename(filepath.Join(dir, name+".tmp"), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		swap := func(content string) {
			t.Helper()
			version++
			data := "data-" + strconv.Itoa(version)
			if version <= 2 {
				rel := "release-" + strconv.Itoa(version)
				cfgWrite(t, root, map[string]string{filepath.Join(rel, data, "ratelimit.yaml"): content})
				swapLink(filepath.Join(root, rel), "config", data)
				swapLink(root, "current", rel)
				return
			}
			rel := filepath.Join(root, "release-2")
			cfgWrite(t, rel, map[string]string{filepath.Join(data, "ratelimit.yaml"): content})
			swapLink(rel, "config", data)
		}
		swap(cfgRule("cm", "k", 100))
		watchSwaps(t, filepath.Join(root, "current", "config"), swap)
	})
}

// watchSwaps loads path (whose config swap has written with 100), watches
// it, and checks that three more swaps, one of them bad, each reload.
func watchSwaps(t *testing.T, path string, swap func(content string)) {
	t.Helper()
	c, err := Load(path, LoadOptions{})
	if err != nil || c.Dump() != watchDump("cm", "k", 100) {
		t.Fatalf("initial load: %v %q", err, c.Dump())
	}
	var rec watchRecorder
	w, err := NewWatcher(path, LoadOptions{}, rec.onLoad, rec.onError)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	swap(cfgRule("cm", "k", 200))
	watchWaitFor(t, "the first swap", func() bool { return rec.lastDump() == watchDump("cm", "k", 200) })
	swap("domain: cm\ndescriptors: [{key: k, rate_limit: {unit: fortnight}}]\n")
	watchWaitFor(t, "the bad swap", func() bool {
		return strings.Contains(rec.lastErr(), "invalid rate limit unit 'fortnight'")
	})
	swap(cfgRule("cm", "k", 300))
	watchWaitFor(t, "the third swap", func() bool { return rec.lastDump() == watchDump("cm", "k", 300) })
}

func TestWatchFilters(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"ratelimit.yaml", true},
		{"limits", true},
		{"..data", true},
		{"..data_tmp", false},
		{"..2026_01_01", false},
		{".ratelimit.yaml.swp", false},
	}
	for _, tt := range tests {
		if got := watchDirFilter(tt.name); got != tt.want {
			t.Errorf("watchDirFilter(%q) = %v", tt.name, got)
		}
	}
}

func TestNewWatcherErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	noop := func(*Config) {}
	if _, err := NewWatcher(dir, LoadOptions{}, nil, func(error) {}); err == nil {
		t.Error("nil onLoad accepted")
	}
	if _, err := NewWatcher(dir, LoadOptions{}, noop, nil); err == nil {
		t.Error("nil onError accepted")
	}
	if _, err := NewWatcher(filepath.Join(dir, "missing"), LoadOptions{}, noop, func(error) {}); err == nil ||
		!strings.HasPrefix(err.Error(), "rls: watch: ") {
		t.Errorf("missing path: %v", err)
	}
}

// TestFileWatcher watches a file in a Kubernetes Secret mount (the kubelet
// swaps ..data, removing the old directory) and then one rewritten in
// place: each change calls changed, after which the file reads as written.
func TestFileWatcher(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	swap := watchConfigMapSwapper(t, dir, "", true)
	swap("key-1")
	path := filepath.Join(dir, "ratelimit.yaml")
	cfgSymlink(t, "..data/ratelimit.yaml", path)
	var mu sync.Mutex
	var seen []string
	w, err := NewFileWatcher(path, func() {
		b, _ := os.ReadFile(path)
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(b))
	}, func(err error) { t.Errorf("watch error: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	read := func(want string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(seen) > 0 && seen[len(seen)-1] == want
		}
	}
	for _, k := range []string{"key-2", "key-3"} {
		swap(k)
		watchWaitFor(t, "a call after the swap to "+k, read(k))
	}

	plain := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(plain, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	changed := make(chan struct{}, 1)
	w2, err := NewFileWatcher(plain, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}, func(err error) { t.Errorf("watch error: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if err := os.WriteFile(plain, []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no call within 10s of rewriting the file in place")
	}

	if _, err := NewFileWatcher(plain, nil, func(error) {}); err == nil {
		t.Error("nil changed accepted")
	}
	if _, err := NewFileWatcher(plain, func() {}, nil); err == nil {
		t.Error("nil onError accepted")
	}
}
