// Package chaos starts real `ringlimit serve` processes on loopback (or in
// network namespaces it makes, as root), drives RLS load at them the way a
// fleet of Envoys does (Load), injects failures (kill, freeze, restart,
// rolling restart, scale out and in, partition) and checks per key per
// window how many hits were allowed (Record, Suite). Nothing imports it; its
// tests are the short suite and `make chaos` runs the full one.
//
// A Cluster, a Netns and a Suite are not safe for concurrent use, except
// the Node methods that signal or inspect a process; a Load's methods are.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// freeFixedPort returns a port on host, free for both TCP and UDP (gossip
// uses both), below the kernel's ephemeral range, so that no outgoing
// connection, of this test or any other process, takes it between a stop
// and a restart of the node that owns it. Ports in taken are skipped.
func freeFixedPort(rnd *rand.Rand, host string, taken map[int]bool) (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	const base = 10000
	if lo-base < 1000 {
		return FreePort(host) // an unusual range: fall back to any free port
	}
	for try := 0; try < 200; try++ {
		p := base + rnd.Intn(lo-base)
		if taken[p] {
			continue
		}
		addr := net.JoinHostPort(host, strconv.Itoa(p))
		t, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		t.Close()
		if err != nil {
			continue
		}
		u.Close()
		return p, nil
	}
	return 0, fmt.Errorf("chaos: no free port on %s below %d", host, lo)
}

// Node is one ringlimit process of a Cluster. Its addresses stay the same
// across restarts.
type Node struct {
	ID   string
	Host string
	// GRPC, HTTP and Debug are the addresses the harness dials; Gossip is
	// the memberlist address, bound and put in every join list.
	GRPC, HTTP, Debug, Gossip string
	// BindGRPC, BindHTTP and BindDebug, when set, are given as the listen
	// flags instead of GRPC, HTTP and Debug (e.g. "0.0.0.0:8081" inside a
	// network namespace reached through a second interface).
	BindGRPC, BindHTTP, BindDebug string
	// Advertise, when set, is passed as --advertise-addr.
	Advertise string
	// Wrap is a command prefix the binary is run under, e.g.
	// ["ip", "netns", "exec", "ns0"]; it must exec the binary so that
	// signals reach it.
	Wrap      []string
	Env       []string
	ExtraArgs []string
	LogPath   string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process exits
	exitErr error
	expect  bool // an exit of the current process is expected (we stopped it)
	retired bool // removed for good: left out of join lists
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

	ports map[int]bool // handed out by AddNode
	rnd   *rand.Rand
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

// AddNode lays out one more node (not started) on host with free ports
// below the ephemeral range and returns it. A node added after others have started joins through them:
// its join list holds every node laid out so far.
func (c *Cluster) AddNode(host string) (*Node, error) {
	if c.ports == nil {
		c.ports = map[int]bool{}
		c.rnd = rand.New(rand.NewSource(time.Now().UnixNano()))
	}
	var ports [4]int
	for i := range ports {
		p, err := freeFixedPort(c.rnd, host, c.ports)
		if err != nil {
			return nil, err
		}
		ports[i] = p
		c.ports[p] = true
	}
	n := c.NewNode(host)
	n.GRPC = net.JoinHostPort(host, fmt.Sprint(ports[0]))
	n.HTTP = net.JoinHostPort(host, fmt.Sprint(ports[1]))
	n.Debug = net.JoinHostPort(host, fmt.Sprint(ports[2]))
	n.Gossip = net.JoinHostPort(host, fmt.Sprint(ports[3]))
	c.Nodes = append(c.Nodes, n)
	return n, nil
}

// NewNode returns the next node's identity (ringlimit-<index>) and log path
// with no addresses, for a caller that lays them out itself (see
// NetnsCluster) and then appends it to c.Nodes.
func (c *Cluster) NewNode(host string) *Node {
	id := fmt.Sprintf("ringlimit-%d", len(c.Nodes))
	return &Node{ID: id, Host: host, LogPath: filepath.Join(c.Dir, id+".log")}
}

// JoinList is the gossip address of every node not retired, comma-separated.
func (c *Cluster) JoinList() string {
	var s []string
	for _, n := range c.Nodes {
		if !n.Retired() {
			s = append(s, n.Gossip)
		}
	}
	return strings.Join(s, ",")
}

// Retire stops n for good with SIGTERM (scale-in): it waits up to timeout
// for the exit and leaves n out of join lists from then on.
func (c *Cluster) Retire(n *Node, timeout time.Duration) error {
	n.mu.Lock()
	n.retired = true
	n.mu.Unlock()
	return n.Stop(timeout)
}

// Retired reports whether the node was removed for good.
func (n *Node) Retired() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.retired
}

// args returns the serve arguments of node n.
func (c *Cluster) args(n *Node) []string {
	or := func(a, b string) string {
		if a != "" {
			return a
		}
		return b
	}
	a := []string{"serve",
		"--node-name", n.ID,
		"--config", c.Config,
		"--grpc-addr", or(n.BindGRPC, n.GRPC),
		"--http-addr", or(n.BindHTTP, n.HTTP),
		"--debug-addr", or(n.BindDebug, n.Debug),
		"--gossip-addr", n.Gossip,
		"--log-level", "debug",
	}
	if n.Advertise != "" {
		a = append(a, "--advertise-addr", n.Advertise)
	}
	if len(c.Nodes) > 1 {
		a = append(a, "--join", c.JoinList())
	}
	a = append(a, c.Args...)
	return append(a, n.ExtraArgs...)
}

// Start starts node n's process (again, after a kill or stop).
func (c *Cluster) Start(n *Node) error {
	argv := append(append(append([]string(nil), n.Wrap...), c.Bin), c.args(n)...)
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
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), n.Env...)
	cmd.SysProcAttr = procAttr()
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

// PID is the process id of the node's current process, 0 if it was never
// started. The process may have exited since.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
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

// StopAll stops the running nodes one after the other with SIGTERM, as a
// scale-down to zero does (each graceful leave still has peers to tell),
// waiting up to timeout for each; a node that does not exit is killed. It
// returns the nodes that exited with an error or had to be killed.
func (c *Cluster) StopAll(timeout time.Duration) []string {
	var bad []string
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		n.Thaw()
		if err := n.Stop(timeout); err != nil {
			n.signal(syscall.SIGKILL, true)
			n.Wait(5 * time.Second)
			bad = append(bad, err.Error())
		} else if e := n.ExitErr(); e != nil {
			bad = append(bad, fmt.Sprintf("%s: exit after SIGTERM: %v", n.ID, e))
		}
	}
	return bad
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
