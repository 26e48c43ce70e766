package chaos

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strings"
)

// Netns is a private test network of hosts, one network namespace each,
// made with `ip` (root only). Every host has two interfaces:
//
//   - a cluster interface on a bridge of its own (198.18.X.0/24), carrying
//     gossip and peer RPCs; Isolate takes a host's port on it down, which
//     partitions the host from the others;
//   - a client interface on a second bridge (198.19.X.0/24) whose root-side
//     address (198.19.X.1) the load driver sends from, so a partitioned
//     host still answers its Envoys.
//
// 198.18.0.0/15 is the range reserved for benchmarking; X is picked at
// random among the values no interface uses. Every namespace, link and
// bridge is named with a unique prefix (rlc + 4 hex digits), and Close
// deletes exactly those. A Netns is not safe for concurrent use.
type Netns struct {
	Prefix string
	octet  int
	hosts  int
	bridge [2]string // cluster, client
}

// NetnsUnavailable says why namespaces cannot be used here, or "" if they
// can: it needs root, the ip command and permission to add a namespace.
func NetnsUnavailable() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root (euid is not 0)"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no `ip` command (Debian package iproute2)"
	}
	probe := "rlcprobe" + randHex(2)
	if err := ipCmd("netns", "add", probe); err != nil {
		return "cannot add a network namespace: " + err.Error()
	}
	ipCmd("netns", "del", probe)
	return ""
}

// NewNetns makes the two bridges and hosts namespaces.
func NewNetns(hosts int) (*Netns, error) {
	x := &Netns{Prefix: "rlc" + randHex(2)}
	out, err := exec.Command("ip", "-o", "addr", "show").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("chaos: netns: ip addr: %v: %s", err, out)
	}
	for tries := 0; ; tries++ {
		o := 1 + mrand.IntN(254)
		if !strings.Contains(string(out), fmt.Sprintf("198.18.%d.", o)) && !strings.Contains(string(out), fmt.Sprintf("198.19.%d.", o)) {
			x.octet = o
			break
		}
		if tries > 100 {
			return nil, errors.New("chaos: netns: no free 198.18.X.0/24")
		}
	}
	x.bridge = [2]string{x.Prefix + "-cbr", x.Prefix + "-dbr"}
	steps := [][]string{
		{"link", "add", x.bridge[0], "type", "bridge"},
		{"link", "set", x.bridge[0], "up"},
		{"link", "add", x.bridge[1], "type", "bridge"},
		{"addr", "add", fmt.Sprintf("198.19.%d.1/24", x.octet), "dev", x.bridge[1]},
		{"link", "set", x.bridge[1], "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			x.Close()
			return nil, err
		}
	}
	for i := 0; i < hosts; i++ {
		if _, err := x.AddHost(); err != nil {
			x.Close()
			return nil, err
		}
	}
	return x, nil
}

// Hosts is how many hosts were made.
func (x *Netns) Hosts() int { return x.hosts }

// Name is host i's namespace.
func (x *Netns) Name(i int) string { return fmt.Sprintf("%s-n%d", x.Prefix, i) }

// ClusterIP is host i's address on the cluster network.
func (x *Netns) ClusterIP(i int) string { return fmt.Sprintf("198.18.%d.%d", x.octet, 10+i) }

// ClientIP is host i's address on the client network.
func (x *Netns) ClientIP(i int) string { return fmt.Sprintf("198.19.%d.%d", x.octet, 10+i) }

// link names host i's root-side veth on network net (0 cluster, 1 client)
// and its namespace-side peer.
func (x *Netns) link(i, net int) (root, inside string) {
	c := "cd"[net : net+1]
	return fmt.Sprintf("%s-%sa%d", x.Prefix, c, i), fmt.Sprintf("%s-%sb%d", x.Prefix, c, i)
}

// AddHost makes one more namespace with its two interfaces and returns its
// index.
func (x *Netns) AddHost() (int, error) {
	i := x.hosts
	if i >= 200 {
		return 0, errors.New("chaos: netns: at most 200 hosts")
	}
	ns := x.Name(i)
	if err := ipCmd("netns", "add", ns); err != nil {
		return 0, err
	}
	x.hosts++
	steps := [][]string{{"-n", ns, "link", "set", "lo", "up"}}
	for net, ip := range []string{x.ClusterIP(i), x.ClientIP(i)} {
		root, inside := x.link(i, net)
		steps = append(steps,
			[]string{"link", "add", root, "type", "veth", "peer", "name", inside},
			[]string{"link", "set", inside, "netns", ns},
			[]string{"link", "set", root, "master", x.bridge[net]},
			[]string{"link", "set", root, "up"},
			[]string{"-n", ns, "addr", "add", ip + "/24", "dev", inside},
			[]string{"-n", ns, "link", "set", inside, "up"},
		)
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return 0, err
		}
	}
	return i, nil
}

// Place lays out the next node of c on the next host (made if needed): the
// process runs in the host's namespace, gossips and takes peer RPCs on the
// cluster address, and is dialed by the harness on the client address.
func (x *Netns) Place(c *Cluster) (*Node, error) {
	i := len(c.Nodes)
	for i >= x.hosts {
		if _, err := x.AddHost(); err != nil {
			return nil, err
		}
	}
	cl, cli := x.ClusterIP(i), x.ClientIP(i)
	n := c.NewNode(cli)
	n.GRPC, n.BindGRPC = cli+":8081", "0.0.0.0:8081"
	n.HTTP, n.BindHTTP = cli+":8080", "0.0.0.0:8080"
	n.Debug, n.BindDebug = cli+":6070", "0.0.0.0:6070"
	n.Gossip = cl + ":7946"
	n.Advertise = cl
	n.Wrap = []string{"ip", "netns", "exec", x.Name(i)}
	c.Nodes = append(c.Nodes, n)
	return n, nil
}

// Isolate cuts host i off the cluster network: its bridge port goes down,
// so every packet between it and the other hosts is lost. Its client
// interface stays up.
func (x *Netns) Isolate(i int) error {
	root, _ := x.link(i, 0)
	return ipCmd("link", "set", root, "down")
}

// Heal undoes Isolate.
func (x *Netns) Heal(i int) error {
	root, _ := x.link(i, 0)
	return ipCmd("link", "set", root, "up")
}

// Close deletes every link, bridge and namespace made, and returns the
// first error. Processes still running in a namespace keep it alive until
// they exit: stop them first.
func (x *Netns) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for i := 0; i < x.hosts; i++ {
		for net := 0; net < 2; net++ {
			root, _ := x.link(i, net)
			if linkExists(root) {
				keep(ipCmd("link", "del", root))
			}
		}
		keep(ipCmd("netns", "del", x.Name(i)))
	}
	for _, b := range x.bridge {
		if b != "" && linkExists(b) {
			keep(ipCmd("link", "del", b))
		}
	}
	x.hosts = 0
	return first
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

// ipCmd runs `ip args...`.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chaos: ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
