package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// ConfigMapDir lays out files the way a Kubernetes ConfigMap volume does:
// dir/..<timestamp>/<files>, dir/..data -> ..<timestamp>, and
// dir/<file> -> ..data/<file>. Calling it again swaps ..data atomically.
func ConfigMapDir(dir string, files map[string]string) error {
	stamp := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), time.Now().UnixNano())
	real := filepath.Join(dir, stamp)
	if err := os.MkdirAll(real, 0o755); err != nil {
		return err
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(real, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(stamp, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	if old != "" && old != stamp {
		os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}
