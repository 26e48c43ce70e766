//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDir takes an exclusive advisory lock (flock) on dir for as long as
// this process holds it, so that two processes never save into one
// --data-dir. The kernel drops the lock when the process exits, however it
// exits.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.New("in use by another process (give each node its own --data-dir)")
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	var done bool
	return func() {
		if !done {
			done = true
			f.Close() // closing the last descriptor releases the lock
		}
	}, nil
}
