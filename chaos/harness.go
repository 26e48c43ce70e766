// Package chaos starts real `ringlimit serve` processes on loopback, drives
// RLS load at them the way a fleet of Envoys does, injects failures (kill,
// freeze, restart, partition) and checks invariants. Nothing imports it; its
// tests and the `make chaos` suite use it.
//
// A Cluster is not safe for concurrent use except where a method says so;
// load generators run concurrently with fault injection.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles ./cmd/ringlimit of the module at root into dir and returns
// the binary's path.
func Build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "ringlimit")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/ringlimit")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("chaos: go build: %v\n%s", err, out)
	}
	return bin, nil
}

// ModuleRoot finds the directory holding go.mod above dir.
func ModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("chaos: no go.mod above " + dir)
		}
	}
}

// FreePort returns a TCP port on host that was free a moment ago.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Node is one ringlimit process of a Cluster. Its addresses stay the same
// across restarts.
type Node struct {
	ID                        string
	Host                      string
	GRPC, HTTP, Debug, Gossip string
	Env                       []string
	ExtraArgs                 []string
	LogPath                   string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process exits
	exitErr error
	expect  bool // an exit of the current process is expected (we stopped it)
	crashes []string
}

// Cluster is a set of ringlimit processes sharing one config and join list.
type Cluster struct {
	Bin    string
	Dir    string // logs, config
	Config string // config path given to every node
	Nodes  []*Node
	// Args are added to every node's serve flags.
	Args []string
}

// NewCluster lays out n nodes on host (e.g. "127.0.0.1") with free ports.
// Nothing is started.
func NewCluster(bin, dir, config, host string, n int) (*Cluster, error) {
	c := &Cluster{Bin: bin, Dir: dir, Config: config}
	for i := 0; i < n; i++ {
		if _, err := c.AddNode(host); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// AddNode lays out one more node (not started) and returns it.
func (c *Cluster) AddNode(host string) (*Node, error) {
	var ports [4]int
	for i := range ports {
		p, err := FreePort(host)
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	id := fmt.Sprintf("ringlimit-%d", len(c.Nodes))
	n := &Node{
		ID:      id,
		Host:    host,
		GRPC:    net.JoinHostPort(host, fmt.Sprint(ports[0])),
		HTTP:    net.JoinHostPort(host, fmt.Sprint(ports[1])),
		Debug:   net.JoinHostPort(host, fmt.Sprint(ports[2])),
		Gossip:  net.JoinHostPort(host, fmt.Sprint(ports[3])),
		LogPath: filepath.Join(c.Dir, id+".log"),
	}
	c.Nodes = append(c.Nodes, n)
	return n, nil
}

// JoinList is every node's gossip address, comma-separated.
func (c *Cluster) JoinList() string {
	var s []string
	for _, n := range c.Nodes {
		s = append(s, n.Gossip)
	}
	return strings.Join(s, ",")
}

// Args returns the serve arguments of node i.
func (c *Cluster) args(n *Node) []string {
	a := []string{"serve",
		"--node-name", n.ID,
		"--config", c.Config,
		"--grpc-addr", n.GRPC,
		"--http-addr", n.HTTP,
		"--debug-addr", n.Debug,
		"--gossip-addr", n.Gossip,
		"--log-level", "debug",
	}
	if len(c.Nodes) > 1 {
		a = append(a, "--join", c.JoinList())
	}
	a = append(a, c.Args...)
	return append(a, n.ExtraArgs...)
}

// Start starts node n's process (again, after a kill or stop).
func (c *Cluster) Start(n *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.done:
		default:
			return fmt.Errorf("chaos: %s is already running", n.ID)
		}
	}
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.Bin, c.args(n)...)
	cmd.Env = append(os.Environ(), n.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	n.cmd, n.done, n.expect, n.exitErr = cmd, done, false, nil
	go func() {
		err := cmd.Wait()
		logf.Close()
		n.mu.Lock()
		n.exitErr = err
		if !n.expect {
			n.crashes = append(n.crashes, fmt.Sprintf("%s exited on its own: %v", n.ID, err))
		}
		n.mu.Unlock()
		close(done)
	}()
	return nil
}

// StartAll starts every node and waits until each is ready.
func (c *Cluster) StartAll(timeout time.Duration) error {
	for _, n := range c.Nodes {
		if err := c.Start(n); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(timeout); err != nil {
			return err
		}
	}
	return nil
}

// signal sends sig to the node's current process; expectExit marks an exit
// caused by it as wanted.
func (n *Node) signal(sig syscall.Signal, expectExit bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return fmt.Errorf("chaos: %s was never started", n.ID)
	}
	if expectExit {
		n.expect = true
	}
	return n.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL and waits for the process to exit.
func (n *Node) Kill() error {
	if err := n.signal(syscall.SIGKILL, true); err != nil {
		return err
	}
	n.Thaw() // a frozen process cannot die until it runs again
	return n.Wait(10 * time.Second)
}

// Stop sends SIGTERM (graceful) and waits up to timeout for the exit.
func (n *Node) Stop(timeout time.Duration) error {
	if err := n.signal(syscall.SIGTERM, true); err != nil {
		return err
	}
	return n.Wait(timeout)
}

// Freeze sends SIGSTOP.
func (n *Node) Freeze() error { return n.signal(syscall.SIGSTOP, false) }

// Thaw sends SIGCONT.
func (n *Node) Thaw() error { return n.signal(syscall.SIGCONT, false) }

// Wait waits up to timeout for the current process to exit.
func (n *Node) Wait(timeout time.Duration) error {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("chaos: %s did not exit within %v", n.ID, timeout)
	}
}

// Running reports whether the node's process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// ExitErr is the error of the last exit (nil for exit status 0).
func (n *Node) ExitErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exitErr
}

// Crashes lists exits the harness did not cause.
func (n *Node) Crashes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.crashes...)
}

// WaitReady polls /healthcheck until it answers 200 or timeout passes.
func (n *Node) WaitReady(timeout time.Duration) error {
	client := &http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := client.Get("http://" + n.HTTP + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !n.Running() {
			return fmt.Errorf("chaos: %s exited before it was ready (%v); log %s:\n%s", n.ID, n.ExitErr(), n.LogPath, tail(n.LogPath, 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s not ready within %v; log %s:\n%s", n.ID, timeout, n.LogPath, tail(n.LogPath, 30))
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
}

// Close stops every running node: SIGTERM, then SIGKILL after a few seconds.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		if n.Running() {
			n.Thaw()
			n.signal(syscall.SIGTERM, true)
		}
	}
	for _, n := range c.Nodes {
		if n.Wait(10*time.Second) != nil {
			n.signal(syscall.SIGKILL, true)
			n.Wait(5 * time.Second)
		}
	}
}

// Crashes lists unexpected exits of every node.
func (c *Cluster) Crashes() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Crashes()...)
	}
	return out
}

// tail returns the last lines of a file, for error messages.
func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	s := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(s) > lines {
		s = s[len(s)-lines:]
	}
	return strings.Join(s, "\n")
}
