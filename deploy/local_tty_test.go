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
	runClusterOnTerminal(t, func(master *os.File, _ int) error {
		_, err := master.Write([]byte{3}) // Ctrl-C
		return err
	}, true)
}

// make sends SIGTERM to its recipe when it gets one (a supervisor or
// `kill` stopping it). On a terminal the script that gets it is the one
// waiting for the job that took the terminal, and it ends at once: the job
// notices and stops every node.
func TestRunClusterSIGTERMOnTerminal(t *testing.T) {
	runClusterOnTerminal(t, func(_ *os.File, makePID int) error {
		return syscall.Kill(makePID, syscall.SIGTERM)
	}, false)
}

// processOf returns the PID of the process in session sid whose parent is
// ppid, or 0.
func processOf(sid, ppid int) int {
	for _, p := range inSession(sid) {
		pid, _ := strconv.Atoi(strings.Fields(p)[0])
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			return pid
		}
	}
	return 0
}

// runClusterOnTerminal runs the script with two nodes under make on a
// pseudo-terminal, calls stop once the cluster is ready, and checks that
// every process make started ends and the nodes were stopped; with
// exitZero, that make exits 0 and prints no error. The terminal's session
// leader is a shell that outlives make, as a user's shell does (a session
// leader that exits hangs the terminal up, which would end the nodes
// whatever the script does).
func runClusterOnTerminal(t *testing.T, stop func(master *os.File, makePID int) error, exitZero bool) {
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
	// As the repository's Makefile: exec, so that make's SIGTERM reaches
	// the script and not a shell around it.
	recipe := fmt.Sprintf("run:\n\t@RUN_PORT_BASE=%d exec %s %s 2\n", base, script, bin)
	if err := os.WriteFile(mk, []byte(recipe), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `make -f "$1" run; echo "make exited $?"; exec sleep 600`, "sh", mk)
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	sid := cmd.Process.Pid
	defer syscall.Kill(sid, syscall.SIGKILL)

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
	makeExited := func() (string, bool) {
		o := output()
		i := strings.Index(o, "make exited ")
		if i < 0 {
			return "", false
		}
		code, _, _ := strings.Cut(o[i+len("make exited "):], "\r")
		return strings.TrimSpace(code), true
	}
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
	makePID := processOf(sid, sid)
	if makePID == 0 {
		cleanup()
		t.Fatal("make is not running")
	}
	if err := stop(master, makePID); err != nil {
		cleanup()
		t.Fatal(err)
	}
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if code, ok := makeExited(); ok {
			if code != "0" && exitZero {
				t.Errorf("make exited with %s, want 0:\n%s", code, output())
			}
			break
		}
		if time.Now().After(end) {
			cleanup()
			t.Fatalf("make still running 60 s after it was stopped:\n%s", output())
		}
	}
	// Everything but the session leader (now a sleep) ends; the script's
	// last processes may end just after make.
	others := func() []string {
		var out []string
		for _, p := range inSession(sid) {
			if !strings.HasPrefix(p, strconv.Itoa(sid)+" ") {
				out = append(out, p)
			}
		}
		return out
	}
	for end := time.Now().Add(30 * time.Second); len(others()) > 0 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if left := others(); len(left) > 0 {
		cleanup()
		t.Errorf("still running 30 s after make exited: %q", left)
	}
	syscall.Kill(sid, syscall.SIGKILL)
	<-exited
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
	if exitZero && (strings.Contains(got, "Error") || strings.Contains(got, "Interrupt")) {
		t.Errorf("make reported an error:\n%s", got)
	}
}
