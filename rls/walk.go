package rls

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// walkMaxDepth bounds how deep walkConfigDir descends below the config
// directory: deep enough for any layout people use, and a stop for
// directory trees that go on without end.
const walkMaxDepth = 32

// walkConfigDir visits the config directory root as Load reads it: every
// entry whose name does not start with "." (so a ConfigMap's "..data" and
// "..2026_..." and editor swap files are skipped), in name order, following
// symlinks; each regular file goes to file, and each directory, root
// included, to dir before its entries, which are visited depth first, as
// envoyproxy/ratelimit reads the files of subdirectories. A directory
// reached twice (through a symlink, or a symlink loop) is visited once, and
// one deeper than walkMaxDepth is an error. A dangling symlink is skipped
// (Kubernetes removes the link of a deleted key just after swapping ..data);
// other errors are returned, and the walk goes on. dir may be nil.
func walkConfigDir(root string, file func(path string), dir func(path string)) []error {
	w := &configWalk{file: file, dir: dir}
	fi, err := os.Stat(root)
	if err != nil {
		return []error{fmt.Errorf("rls: %w", err)}
	}
	w.walk(root, fi, 0)
	return w.errs
}

// configWalk is the state of one walkConfigDir.
type configWalk struct {
	file, dir func(string)
	seen      []os.FileInfo // directories visited
	errs      []error
}

func (w *configWalk) walk(path string, fi os.FileInfo, depth int) {
	for _, s := range w.seen {
		if os.SameFile(s, fi) {
			return
		}
	}
	if depth > walkMaxDepth {
		w.errs = append(w.errs, fmt.Errorf("rls: %s: directories nested deeper than %d levels below the config directory", path, walkMaxDepth))
		return
	}
	w.seen = append(w.seen, fi)
	if w.dir != nil {
		w.dir(path)
	}
	ents, err := os.ReadDir(path) // sorted by name
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("rls: %w", err))
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		full := filepath.Join(path, e.Name())
		fi, err := os.Stat(full) // follows symlinks
		if err != nil {
			if !(errors.Is(err, fs.ErrNotExist) && e.Type()&fs.ModeSymlink != 0) {
				w.errs = append(w.errs, fmt.Errorf("rls: %w", err))
			}
			continue
		}
		switch {
		case fi.IsDir():
			w.walk(full, fi, depth+1)
		case fi.Mode().IsRegular(): // no FIFO that would block a read
			w.file(full)
		}
	}
}
