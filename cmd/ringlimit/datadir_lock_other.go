//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

// lockDir does not lock on this platform: nothing stops two processes from
// sharing a --data-dir, and a snapshot written by another node is then
// refused at start.
func lockDir(string) (unlock func(), err error) { return func() {}, nil }
