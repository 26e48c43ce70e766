package rls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Debounce timing of a Watcher: a reload runs watchDebounce after the last
// change of a burst, and no later than watchMaxDelay after its first change
// however long the burst lasts.
const (
	watchDebounce = 100 * time.Millisecond
	watchMaxDelay = time.Second
)

// Watcher reloads a config file or directory when it changes (NewWatcher),
// or calls a function when a file changes (NewFileWatcher). It owns one
// goroutine, stopped and joined by Close.
type Watcher struct {
	path    string
	opt     LoadOptions
	onLoad  func(*Config)
	changed func() // NewFileWatcher's callback; nil for a config
	onError func(error)
	fsw     *fsnotify.Watcher
	filter  func(name string) bool // relevant event base names in dir
	dir     string                 // the directory watched for the config's files
	// target is where dir resolves to, through symlinks, when it was
	// last watched; links maps the parent directory of each symlink on the
	// way to the name of that symlink: those directories are watched too,
	// for a swap of the link (see NewWatcher).
	target string
	// replaced is set by an event on dir itself (removed, renamed, created
	// again): its watch must be added again. (Not os.SameFile: a new
	// directory often gets the inode number of the one just removed.)
	replaced bool
	links    map[string]string
	// subs holds the subdirectories of a config directory that Load reads,
	// each watched for the files Load reads in it; nil for a config file.
	subs map[string]bool

	closeOnce sync.Once
	done      chan struct{} // closed by Close
	exited    chan struct{} // closed when the goroutine returns
}

// NewWatcher watches path (as given to Load) and, after each burst of
// changes, reloads it with Load(path, opt): on success it calls onLoad with
// the new Config, on failure onError (the caller keeps its last good
// Config). It does not load the config first: call Load before NewWatcher.
//
// For a directory it watches the directory itself, which also sees the
// atomic "..data" symlink swap of a Kubernetes ConfigMap mount; dotfile
// changes other than "..data" are ignored. Its subdirectories that Load reads
// are watched alike, and the set of them is updated before each reload. For
// a file it watches the parent directory and reacts to the file's name and
// "..data". When the watched directory is reached through symlinks (a
// ConfigMap item under a subdirectory, config -> ..data/config, or the
// reference's swapped /srv/runtime_data/current), the directory holding
// each symlink is watched too, for a swap of that link or of "..data", and
// after each reload the watch follows the links to their new target.
//
// The callbacks run on the Watcher's goroutine, one at a time; they must not
// call Close. Both must be non-nil.
func NewWatcher(path string, opt LoadOptions, onLoad func(*Config), onError func(error)) (*Watcher, error) {
	if onLoad == nil || onError == nil {
		return nil, errors.New("rls: watcher needs both onLoad and onError")
	}
	return newWatcher(&Watcher{path: path, opt: opt, onLoad: onLoad, onError: onError})
}

// NewFileWatcher watches the file at path as NewWatcher watches a config
// file (its directory, a Kubernetes "..data" swap, the symlinks on the way)
// and calls changed after each burst of changes, for other files the
// process reads (a key, say) to be read again. onError receives the
// watch's own errors. The callbacks run on the Watcher's goroutine, one at
// a time; they must not call Close. Both must be non-nil.
func NewFileWatcher(path string, changed func(), onError func(error)) (*Watcher, error) {
	if changed == nil || onError == nil {
		return nil, errors.New("rls: file watcher needs both changed and onError")
	}
	return newWatcher(&Watcher{path: path, changed: changed, onError: onError})
}

// newWatcher starts w, which has its path and callbacks set.
func newWatcher(w *Watcher) (*Watcher, error) {
	path := w.path
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rls: watch: %w", err)
	}
	dir, filter := path, watchDirFilter
	if !st.IsDir() {
		base := filepath.Base(path)
		dir = filepath.Dir(path)
		filter = func(name string) bool { return name == base || name == "..data" }
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("rls: watch: %w", err)
	}
	if err := fsw.Add(dir); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("rls: watch: %w", err)
	}
	w.fsw, w.filter, w.dir = fsw, filter, filepath.Clean(dir)
	w.done, w.exited = make(chan struct{}), make(chan struct{})
	w.target, _ = filepath.EvalSymlinks(dir)
	w.watchLinks()
	if st.IsDir() {
		w.subs = map[string]bool{}
		w.watchSubdirs()
	}
	go w.run()
	return w, nil
}

// watchLinks watches the directory holding dir, for dir being replaced
// (removed and created again, or renamed over), and the directory holding
// each symlink on the way to dir (again, since a swapped link higher up may
// have moved them), and stops watching those that no longer hold one. Best
// effort: dir itself is watched regardless.
func (w *Watcher) watchLinks() {
	next := map[string]string{}
	if parent := filepath.Dir(w.dir); parent != w.dir {
		next[parent] = filepath.Base(w.dir)
	}
	for p := w.dir; ; {
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			next[parent] = filepath.Base(p)
		}
		p = parent
	}
	for parent := range w.links {
		_ = w.fsw.Remove(parent) // added again below if still on the way: it may lead elsewhere now
	}
	for parent := range next {
		if err := w.fsw.Add(parent); err != nil {
			delete(next, parent)
		}
	}
	w.links = next
}

// watchSubdirs watches the subdirectories of the config directory that
// Load reads now, afresh (one may be a new directory under an old name, or
// reached through a link that was swapped), and stops watching those it no
// longer reads. Best effort, as watchLinks.
func (w *Watcher) watchSubdirs() {
	if w.subs == nil {
		return
	}
	for d := range w.subs {
		_ = w.fsw.Remove(d)
	}
	next := map[string]bool{}
	walkConfigDir(w.dir, func(string) {}, func(d string) {
		if d = filepath.Clean(d); d != w.dir && w.fsw.Add(d) == nil {
			next[d] = true
		}
	})
	w.subs = next
}

// relevant reports whether an event for name may change the config.
func (w *Watcher) relevant(name string) bool {
	dir, base := filepath.Dir(name), filepath.Base(name)
	if dir == w.dir || w.subs[dir] {
		return w.filter(base)
	}
	if link, ok := w.links[dir]; ok {
		return base == link || base == "..data"
	}
	return false
}

// follow re-watches dir when its symlinks now lead elsewhere, or when it
// was replaced by a new directory, so that the next change is seen too.
func (w *Watcher) follow() {
	t, err := filepath.EvalSymlinks(w.dir)
	if err != nil || (t == w.target && !w.replaced) {
		return
	}
	w.replaced = false
	_ = w.fsw.Remove(w.dir) // gone with its target, possibly
	if err := w.fsw.Add(w.dir); err != nil {
		w.onError(fmt.Errorf("rls: watch %s: %w", w.path, err))
		return
	}
	w.target = t
	w.watchLinks()
}

// watchDirFilter accepts the files Load reads and the ConfigMap swap.
func watchDirFilter(name string) bool {
	return !strings.HasPrefix(name, ".") || name == "..data"
}

// Close stops watching and waits for the goroutine to return (including a
// callback in progress). It is safe to call more than once.
func (w *Watcher) Close() error {
	var err error
	w.closeOnce.Do(func() {
		close(w.done)
		err = w.fsw.Close()
	})
	<-w.exited
	return err
}

func (w *Watcher) run() {
	defer close(w.exited)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var pending bool
	var first time.Time
	for {
		select {
		case <-w.done:
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if ev.Op == fsnotify.Chmod || !w.relevant(ev.Name) {
				continue
			}
			if filepath.Clean(ev.Name) == w.dir {
				w.replaced = true
			}
			now := time.Now()
			if !pending {
				pending, first = true, now
				timer.Reset(watchDebounce)
			} else if now.Sub(first) < watchMaxDelay-watchDebounce {
				timer.Reset(watchDebounce)
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			w.onError(fmt.Errorf("rls: watch %s: %w", w.path, err))
		case <-timer.C:
			pending = false
			w.follow()
			w.watchSubdirs() // before Load: a change after it is seen
			if w.changed != nil {
				w.changed()
				continue
			}
			cfg, err := Load(w.path, w.opt)
			select {
			case <-w.done:
				return // closed while loading: no callback after Close
			default:
			}
			if err != nil {
				w.onError(err)
				continue
			}
			w.onLoad(cfg)
		}
	}
}
