// Package cluster owns how ringlimit processes find each other and talk to each
// other: gossip membership on hashicorp/memberlist (membership*.go, meta.go,
// events.go), request forwarding between peers (forward.go, peer*.go,
// suspect.go), and keeping counts when nodes come and go: replication of
// every write to the key's replicas (replog.go, replicate.go), handoff on
// ring changes and on a graceful leave (handoff.go), sync before a node is
// ready and re-sync after a freeze (sync.go, ready.go). node.go glues them to
// the ring. Every exported type is safe for concurrent use unless its
// documentation says otherwise.
package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// States a Member can be in, as reported by Membership.All.
//
// memberlist v0.7.0 does not expose suspicion through its public API, so a
// suspected node is reported as MemberAlive until it is declared dead.
const (
	MemberAlive   = "alive"   // a ring member (memberlist alive or suspect)
	MemberSuspect = "suspect" // reserved: not produced with memberlist v0.7.0
	MemberDead    = "dead"    // declared failed (crash, freeze, partition)
	MemberLeft    = "left"    // announced a graceful leave
)

// Member is one ringlimit process as this node sees it.
type Member struct {
	ID       string // stable identity (StatefulSet pod name); the ring is keyed on it
	Name     string // unique memberlist name of this process (ID + "/" + a per-process random suffix)
	GRPCAddr string // host:port where its gRPC (RLS + peer) service listens
	Addr     string // gossip host:port
	Started  int64  // process start, Unix ns (from metadata)
	State    string // MemberAlive, MemberDead or MemberLeft (see MemberSuspect)
	// Ready reports that the process has synced its counters and may be a
	// ring member (from metadata; see Membership.SetReady). A process
	// starts not ready.
	Ready bool
	// Relaying reports that the process, ready, still relays the ops it
	// is sent to the keys' owners on the ring without it (from metadata;
	// see Membership.SetReady and NodeConfig.JoinRelay).
	Relaying bool
	// Draining reports that the process hands its counters off before it
	// leaves (from metadata; see Membership.SetDraining).
	Draining bool
}

// MaxLabelLen bounds MembershipConfig.Label: memberlist's limit.
const MaxLabelLen = memberlist.LabelMaxSize

// MembershipConfig configures NewMembership. Zero values of optional fields
// select the documented defaults.
type MembershipConfig struct {
	// ID is the stable identity of this process (required). Processes that
	// share an ID are one ring member; the newest one wins.
	ID string
	// GRPCAddr is the host:port peers dial for this process's gRPC service
	// (required; the host must not be empty).
	GRPCAddr string
	// BindAddr is the gossip (UDP and TCP) listen address, an IP literal and
	// port; default ":7946", an empty host means all interfaces. Port 0
	// picks a free port; Self().Addr reports the real one. Ignored when
	// Transport is set, except that its port is the default port for Join
	// entries that have none.
	BindAddr string
	// AdvertiseAddr is the IP (optionally IP:port) other nodes use to reach
	// this one; in Kubernetes the pod IP. Empty: memberlist picks the bound
	// address, or a private address when bound to all interfaces. Without a
	// port the bind port is advertised. With BindAddr port 0 the picked port
	// is advertised whatever port is given here.
	AdvertiseAddr string
	// Join lists host:port or DNS names of nodes to join; a name resolving
	// to several IPs joins them all. Empty: this node starts a cluster alone
	// and only joins when others join it.
	Join []string
	// RejoinInterval is how often Join is contacted again after the first
	// successful join, so that healed partitions merge. Zero means 15s;
	// negative is an error.
	RejoinInterval time.Duration
	// Label, if set, names the cluster on every gossip packet and stream
	// (memberlist's label, at most MaxLabelLen bytes): nodes with another
	// label, or none, ignore each other and cannot merge.
	Label string
	// SecretKey, if set, is the AES key (16, 24 or 32 bytes) that encrypts
	// and authenticates all gossip. Nodes with a different key cannot join.
	SecretKey []byte
	// Logger receives this package's logs and, at debug level, memberlist's
	// own log lines. Nil discards everything.
	Logger *slog.Logger
	// Transport replaces memberlist's UDP/TCP transport (tests only). Nil
	// uses memberlist's network transport on BindAddr.
	Transport memberlist.Transport
	// Preset selects memberlist's timing: "lan" (default,
	// memberlist.DefaultLANConfig) or "local" (memberlist.DefaultLocalConfig:
	// faster failure detection, for tests on loopback).
	Preset string
}

const (
	mshipDefaultBind    = ":7946"
	mshipDefaultRejoin  = 15 * time.Second
	mshipJoinBackoffMin = 100 * time.Millisecond
	mshipJoinBackoffMax = 5 * time.Second
	mshipFollowUpJoin   = time.Second // first re-join after joining
	mshipDefaultLeave   = 5 * time.Second
	// mshipLeaveBroadcastWait bounds the wait for memberlist's own leave
	// broadcast, which goes out within a few gossip intervals while any
	// node takes gossip. Peers already know of the leave from the leaving
	// flag; when every peer leaves at the same time, the broadcast finds
	// nobody to go to and would otherwise hold Leave for its whole timeout.
	mshipLeaveBroadcastWait = time.Second
	// mshipSettle lets a burst of events (a push/pull merging many nodes)
	// land before onChange is computed.
	mshipSettle = 20 * time.Millisecond
	// mshipForgetGone is how long All keeps reporting dead and left nodes.
	mshipForgetGone = 2 * time.Minute
	// mshipDeadRetry is how often a member that failed (not left) is
	// contacted directly, for mshipForgetGone after it failed: if it was cut
	// off rather than dead, the first contact after the heal merges the two
	// sides, within about this long instead of a RejoinInterval.
	mshipDeadRetry = time.Second
	// mshipUpdateWait bounds how long SetReady waits for its broadcast.
	mshipUpdateWait = time.Second
)

// Membership is this process's view of the ringlimit cluster. It is safe for
// concurrent use. Create it with NewMembership and stop it with Close.
type Membership struct {
	name     string // memberlist name of this process
	started  int64
	join     []string
	rejoin   time.Duration
	logger   *slog.Logger
	onChange func(alive []Member)
	ml       *memberlist.Memberlist

	meta atomic.Pointer[[]byte] // current NodeMeta payload

	mu      sync.Mutex
	nodes   map[string]*mshipNode // by memberlist name, self included
	badMeta map[string]struct{}   // names whose undecodable metadata was logged
	joinErr error                 // result of the last join attempt

	joined  atomic.Bool
	changed chan struct{} // capacity 1: "the table changed", coalesced

	joinStop     chan struct{} // closed by Leave or Close: stop (re)joining
	contacting   atomic.Bool   // a mshipContactDead is running
	joinStopOnce sync.Once
	done         chan struct{} // closed by Close
	wg           sync.WaitGroup

	life      sync.Mutex // serialises Leave and Close around memberlist
	left      bool       // under life
	closed    bool       // under life
	closeOnce sync.Once
	closeErr  error
}

// mshipNode is one row of the member table.
type mshipNode struct {
	member Member
	since  time.Time // last change of member.State
}

// NewMembership validates cfg, starts memberlist and returns at once; joining
// Join happens in the background with backoff (see Joined and JoinError).
//
// onChange, if not nil, is called from a single goroutine owned by the
// Membership: first with just Self, then with Alive whenever the alive set
// or a member's metadata changes. Bursts are coalesced; calls never overlap
// and never run inside memberlist. onChange must not call Close.
func NewMembership(cfg MembershipConfig, onChange func(alive []Member)) (*Membership, error) {
	mlc, err := mshipMemberlistConfig(&cfg)
	if err != nil {
		return nil, err
	}
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return nil, fmt.Errorf("cluster: membership: random name suffix: %w", err)
	}
	started := time.Now().UnixNano()
	meta, err := mshipEncodeMeta(mshipMeta{ID: cfg.ID, GRPCAddr: cfg.GRPCAddr, Started: started})
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := &Membership{
		name:     cfg.ID + "/" + hex.EncodeToString(suffix),
		started:  started,
		join:     slices.Clone(cfg.Join),
		rejoin:   cfg.RejoinInterval,
		logger:   logger,
		onChange: onChange,
		nodes:    make(map[string]*mshipNode),
		badMeta:  make(map[string]struct{}),
		changed:  make(chan struct{}, 1),
		joinStop: make(chan struct{}),
		done:     make(chan struct{}),
	}
	m.meta.Store(&meta)
	mlc.Name = m.name
	mlc.Delegate = mshipDelegate{m}
	mlc.Events = mshipEvents{m}
	mlc.Logger = log.New(newMshipLogWriter(logger), "", 0)

	ml, err := mshipCreate(mlc)
	if err != nil {
		return nil, fmt.Errorf("cluster: membership: start memberlist: %w", err)
	}
	m.ml = ml

	if len(m.join) == 0 {
		m.joined.Store(true)
	} else {
		m.wg.Add(1)
		go m.mshipJoinLoop()
	}
	if onChange != nil {
		m.wg.Add(1)
		go m.mshipNotifyLoop()
	}
	self := m.Self()
	logger.Info("cluster: membership started", "id", self.ID, "name", self.Name, "gossip_addr", self.Addr, "grpc_addr", self.GRPCAddr)
	return m, nil
}

func mshipCreate(c *memberlist.Config) (ml *memberlist.Memberlist, err error) {
	defer mshipRecover(&err)
	return memberlist.Create(c)
}

// mshipRecover turns a panic inside memberlist into an error.
func mshipRecover(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("memberlist panic: %v", r)
	}
}

// mshipMemberlistConfig validates cfg, fills its defaults in place and
// returns the memberlist configuration (without name, delegates or logger).
func mshipMemberlistConfig(cfg *MembershipConfig) (*memberlist.Config, error) {
	if cfg.ID == "" {
		return nil, errors.New("cluster: MembershipConfig.ID: required")
	}
	if host, _, err := mshipSplitPort(cfg.GRPCAddr); err != nil || host == "" {
		return nil, fmt.Errorf("cluster: MembershipConfig.GRPCAddr: %q is not host:port", cfg.GRPCAddr)
	}
	if _, err := mshipEncodeMeta(mshipMeta{ID: cfg.ID, GRPCAddr: cfg.GRPCAddr, Started: time.Now().UnixNano()}); err != nil {
		return nil, err
	}

	var mlc *memberlist.Config
	switch cfg.Preset {
	case "", "lan":
		mlc = memberlist.DefaultLANConfig()
	case "local":
		mlc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("cluster: MembershipConfig.Preset: unknown preset %q (want \"lan\" or \"local\")", cfg.Preset)
	}

	if cfg.BindAddr == "" {
		cfg.BindAddr = mshipDefaultBind
	}
	bindHost, bindPort, err := mshipSplitPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("cluster: MembershipConfig.BindAddr: %q is not ip:port", cfg.BindAddr)
	}
	if bindHost == "" {
		bindHost = "0.0.0.0"
	}
	if net.ParseIP(bindHost) == nil {
		return nil, fmt.Errorf("cluster: MembershipConfig.BindAddr: %q: host must be an IP address", cfg.BindAddr)
	}
	mlc.BindAddr, mlc.BindPort = bindHost, bindPort
	mlc.AdvertiseAddr, mlc.AdvertisePort = "", bindPort

	if a := cfg.AdvertiseAddr; a != "" {
		host, port := a, bindPort
		if net.ParseIP(a) == nil {
			if host, port, err = mshipSplitPort(a); err != nil || net.ParseIP(host) == nil {
				return nil, fmt.Errorf("cluster: MembershipConfig.AdvertiseAddr: %q is not an IP or ip:port", a)
			}
		}
		mlc.AdvertiseAddr, mlc.AdvertisePort = host, port
	}

	for i, j := range cfg.Join {
		if strings.TrimSpace(j) == "" {
			return nil, fmt.Errorf("cluster: MembershipConfig.Join[%d]: empty address", i)
		}
	}
	switch {
	case cfg.RejoinInterval < 0:
		return nil, fmt.Errorf("cluster: MembershipConfig.RejoinInterval: %v is negative", cfg.RejoinInterval)
	case cfg.RejoinInterval == 0:
		cfg.RejoinInterval = mshipDefaultRejoin
	}
	switch len(cfg.SecretKey) {
	case 0:
	case 16, 24, 32:
		mlc.SecretKey = slices.Clone(cfg.SecretKey)
	default:
		return nil, fmt.Errorf("cluster: MembershipConfig.SecretKey: %d bytes (want 16, 24 or 32)", len(cfg.SecretKey))
	}
	if len(cfg.Label) > MaxLabelLen {
		return nil, fmt.Errorf("cluster: MembershipConfig.Label: %d bytes (at most %d)", len(cfg.Label), MaxLabelLen)
	}
	mlc.Label = cfg.Label
	mlc.Transport = cfg.Transport
	return mlc, nil
}

// mshipSplitPort splits host:port and parses the port (0-65535).
func mshipSplitPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, err
	}
	return host, int(port), nil
}

// Self returns this process as the cluster sees it. Its Addr carries the real
// gossip port even when BindAddr asked for port 0.
func (m *Membership) Self() Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.nodes[m.name]; ok {
		return n.member
	}
	// Not reached: memberlist reports the local node during Create.
	meta := *m.meta.Load()
	d, _ := mshipDecodeMeta(meta)
	return Member{ID: d.ID, Name: m.name, GRPCAddr: d.GRPCAddr, Started: m.started, State: MemberAlive, Ready: d.Ready, Relaying: d.Relaying, Draining: d.Draining}
}

// Alive returns the live ring members sorted by ID, self included until Leave.
// There is one entry per ID: when two processes share an ID (a restart seen
// before the old process is declared dead) the one with the newest Started
// wins, ties going to the greater Name. Nodes that announced a leave or whose
// metadata does not decode are left out. The slice is the caller's.
func (m *Membership) Alive() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	return mshipPickAlive(m.nodes)
}

func mshipPickAlive(nodes map[string]*mshipNode) []Member {
	best := make(map[string]Member, len(nodes))
	for _, n := range nodes {
		mb := n.member
		if mb.State != MemberAlive {
			continue
		}
		cur, ok := best[mb.ID]
		if !ok || mb.Started > cur.Started || (mb.Started == cur.Started && mb.Name > cur.Name) {
			best[mb.ID] = mb
		}
	}
	out := make([]Member, 0, len(best))
	for _, mb := range best {
		out = append(out, mb)
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// LeftGrace is how long Admitted keeps a member that left gracefully: while
// it drains it still relays ops and ships replication writes, on streams it
// may open after its peers have seen it leave.
const LeftGrace = time.Minute

// Admitted returns the members whose calls a peer-access check should
// admit: Alive, plus the members that left gracefully less than LeftGrace
// ago (not the dead: a crashed process sends nothing). The slice is the
// caller's.
func (m *Membership) Admitted() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := mshipPickAlive(m.nodes)
	now := time.Now()
	for _, n := range m.nodes {
		if n.member.State == MemberLeft && now.Sub(n.since) < LeftGrace {
			out = append(out, n.member)
		}
	}
	return out
}

// All returns every memberlist node this process knows with its state, sorted
// by ID then Name, for diagnostics (/debug/cluster). Dead and left nodes are
// kept for about two minutes; nodes with undecodable metadata are omitted.
func (m *Membership) All() []Member {
	m.mu.Lock()
	m.forgetGoneLocked(time.Now()) // a quiet cluster has no event to do it
	out := make([]Member, 0, len(m.nodes))
	for _, n := range m.nodes {
		out = append(out, n.member)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int {
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// Joined reports whether this node is part of a cluster: true once a join
// reached at least one node (itself included), once another node has joined
// it, or from the start when Join is empty.
func (m *Membership) Joined() bool { return m.joined.Load() }

// JoinError returns the error of the latest join attempt, or nil if it
// succeeded or none has finished yet.
func (m *Membership) JoinError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.joinErr
}

// NumMembers returns how many memberlist processes (self included) are alive
// or suspect. It can exceed len(Alive()) while a restarted ID's old process is
// still being detected, or when a node's metadata does not decode.
func (m *Membership) NumMembers() int { return m.ml.NumMembers() }

// Leave announces a graceful departure and stops re-joining: other nodes drop
// this one from their Alive set at once instead of waiting for failure
// detection, and report it as MemberLeft. It waits up to timeout (<= 0 means
// 5s) for the announcements to be gossiped, and does not wait for the second
// (memberlist's own leave) when no other node stays. Calling it again returns nil;
// after Close it returns an error. Close must still be called.
func (m *Membership) Leave(timeout time.Duration) (err error) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return errors.New("cluster: leave: membership is closed")
	}
	if m.left {
		return nil
	}
	m.left = true
	m.mshipStopJoining()
	defer mshipRecover(&err)
	if timeout <= 0 {
		timeout = mshipDefaultLeave
	}
	deadline := time.Now().Add(timeout)

	cur, _ := mshipDecodeMeta(*m.meta.Load())
	cur.Leaving = true
	if meta, err := mshipEncodeMeta(cur); err == nil {
		m.meta.Store(&meta)
	}
	m.mu.Lock()
	if n, ok := m.nodes[m.name]; ok && n.member.State != MemberLeft {
		n.member.State, n.since = MemberLeft, time.Now()
	}
	m.mu.Unlock()
	m.mshipSignal()

	// First gossip the leaving flag, so that peers can tell this leave from
	// a crash (memberlist's leave message is queued under the same name and
	// would replace it), with half the budget, then memberlist's own leave,
	// with the rest up to mshipLeaveBroadcastWait.
	// memberlist's UpdateNode can miss the end of its broadcast (its notify
	// channel is unbuffered) and then waits out its timeout: that costs
	// time, never correctness, so its error is only logged.
	if err := m.ml.UpdateNode(max(timeout/2, time.Millisecond)); err != nil {
		m.logger.Debug("cluster: leave: announcing the leaving flag", "err", err)
	}
	if !m.othersStay() {
		// Every other node has left, is leaving or is dead (the whole
		// cluster stops): nobody would take memberlist's leave broadcast,
		// and it would wait out its whole timeout. Close shuts it down.
		m.logger.Info("cluster: left the cluster; no other member stays", "name", m.name)
		return nil
	}
	// Its only error is that timeout: logged, like the flag's, since peers
	// that got neither announcement still find this node gone by failure
	// detection, and its counters were handed off before Leave.
	rest := min(max(time.Until(deadline), time.Millisecond), mshipLeaveBroadcastWait)
	if err := m.ml.Leave(rest); err != nil {
		m.logger.Debug("cluster: leave: memberlist's leave broadcast", "err", err)
	}
	m.logger.Info("cluster: left the cluster", "name", m.name)
	return nil
}

// othersStay reports whether a node other than this one is alive and not
// leaving.
func (m *Membership) othersStay() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, n := range m.nodes {
		if name != m.name && n.member.State == MemberAlive {
			return true
		}
	}
	return false
}

// SetReady gossips whether this process is ready (Member.Ready) and, when
// it is, whether it still relays (Member.Relaying): it updates the node
// metadata and waits, at most about a second, until memberlist has
// broadcast it (the update is gossiped anyway after that wait). Other nodes
// see the change through their onChange. A process starts not ready; a
// process that is not ready does not relay. After Leave or Close it returns
// an error and changes nothing.
func (m *Membership) SetReady(ready, relaying bool) error {
	relaying = relaying && ready
	return m.updateMeta("set ready", func(cur *mshipMeta) bool {
		if cur.Ready == ready && cur.Relaying == relaying {
			return false
		}
		cur.Ready, cur.Relaying = ready, relaying
		return true
	})
}

// SetDraining gossips that this process has started to hand its counters
// off before it leaves (Member.Draining), waiting as SetReady does. It
// cannot be undone. After Leave or Close it returns an error.
func (m *Membership) SetDraining() error {
	return m.updateMeta("set draining", func(cur *mshipMeta) bool {
		changed := !cur.Draining
		cur.Draining = true
		return changed
	})
}

// updateMeta applies change to this process's metadata and, if it reports
// a change, gossips the result, waiting at most about a second for the
// broadcast. what names the caller in errors and logs.
func (m *Membership) updateMeta(what string, change func(*mshipMeta) bool) (err error) {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed || m.left {
		return fmt.Errorf("cluster: %s: membership has left or is closed", what)
	}
	defer mshipRecover(&err)
	cur, err := mshipDecodeMeta(*m.meta.Load())
	if err != nil {
		return fmt.Errorf("cluster: %s: %w", what, err)
	}
	if !change(&cur) {
		return nil
	}
	meta, err := mshipEncodeMeta(cur)
	if err != nil {
		return fmt.Errorf("cluster: %s: %w", what, err)
	}
	m.meta.Store(&meta)
	// UpdateNode's only error is the end of its wait, which it can miss
	// (see Leave): the new metadata is already memberlist's and is gossiped.
	if err := m.ml.UpdateNode(mshipUpdateWait); err != nil {
		m.logger.Debug("cluster: "+what+": broadcast not confirmed", "err", err)
	}
	return nil
}

// Close shuts memberlist down without a leave (peers detect it as failed
// unless Leave was called first), stops and joins this Membership's
// goroutines and returns memberlist's shutdown error. It is idempotent. It
// waits for a Leave in progress (bounded by its timeout) and for an in-flight
// join attempt (bounded by memberlist's TCP timeout: 10s for "lan", 1s for
// "local"). memberlist's own goroutines are told to stop but not joined;
// they end within about a probe interval.
func (m *Membership) Close() error {
	m.closeOnce.Do(func() {
		m.life.Lock()
		m.closed = true
		m.mshipStopJoining()
		close(m.done)
		m.closeErr = m.ml.Shutdown()
		m.life.Unlock()
		m.wg.Wait()
		if m.closeErr != nil {
			m.closeErr = fmt.Errorf("cluster: close: %w", m.closeErr)
		}
	})
	return m.closeErr
}

func (m *Membership) mshipStopJoining() {
	m.joinStopOnce.Do(func() { close(m.joinStop) })
}
