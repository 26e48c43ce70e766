//go:build linux

package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// openPTY opens a pseudo-terminal pair: the master and its slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	var unlock int32
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		m.Close()
		t.Skipf("unlockpt: %v", e)
	}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		m.Close()
		t.Skipf("ptsname: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Skipf("open pts: %v", err)
	}
	return m, s
}

// inSession lists the processes of session sid still running.
func inSession(sid int) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 3 && f[3] == strconv.Itoa(sid) && f[0] != "Z" {
			out = append(out, e.Name()+" "+string(b[:i+1]))
		}
	}
	return out
}

// Ctrl-C typed at a terminal signals its whole foreground process group;
// make, in that group, exits 130 on SIGINT whatever its recipe does. The
// script takes the terminal for a process group of its own, so Ctrl-C on
// `make run` (here: make running the script, on a pseudo-terminal) stops
// every node and make exits 0, printing no error.
func TestRunClusterCtrlCOnTerminal(t *testing.T) {
	bin := needBinary(t)
	for _, tool := range []string{"make", "curl", "ps"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	master, slave := openPTY(t)
	defer master.Close()
	script, err := filepath.Abs(filepath.Join(repoRoot, "deploy/local/run-cluster.sh"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mk := filepath.Join(dir, "Makefile")
	base := freeRunPortBase(t, 2)
	recipe := fmt.Sprintf("run:\n\t@RUN_PORT_BASE=%d %s %s 2\n", base, script, bin)
	if err := os.WriteFile(mk, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-f", mk, "run")
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	sid := cmd.Process.Pid

	var mu sync.Mutex
	var out bytes.Buffer
	read := make(chan struct{})
	go func() { // until the terminal closes (EIO once every process left it)
		defer close(read)
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			mu.Lock()
			out.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	output := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	cleanup := func() {
		for _, p := range inSession(sid) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}

	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(output(), "Ctrl-C stops all nodes") {
		select {
		case err := <-exited:
			t.Fatalf("make ended (%v) before the cluster was ready:\n%s", err, output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cleanup()
			t.Fatalf("cluster not ready within 60 s:\n%s", output())
		}
	}
	if _, err := master.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("make exited with %v after Ctrl-C, want 0:\n%s", err, output())
		}
	case <-time.After(60 * time.Second):
		cleanup()
		t.Fatalf("make still running 60 s after Ctrl-C:\n%s", output())
	}
	if left := inSession(sid); len(left) > 0 {
		cleanup()
		t.Errorf("still running after make exited: %q", left)
	}
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Error("terminal still open 10 s after make exited")
	}
	got := output()
	for _, w := range []string{"stopping 2 node(s)...", "stopped; logs kept in"} {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
	if strings.Contains(got, "Error") || strings.Contains(got, "Interrupt") {
		t.Errorf("make reported an error:\n%s", got)
	}
}
