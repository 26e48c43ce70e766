// Package membership owns how ringlimit processes find each other: gossip
// on hashicorp/memberlist, the metadata each process gossips about itself
// (its stable ID, gRPC address, start time and lifecycle flags), the member
// table built from it, joining, re-joining and leaving the cluster, and the
// keyring that encrypts gossip (replaced on a live node by SetKeys). It
// imports nothing else from ringlimit but package clock, the time it is
// given. A Membership is safe for concurrent use.
package membership

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/cluster/clock"
)

// Membership is this process's view of the ringlimit cluster. It is safe for
// concurrent use. Create it with New and stop it with Close.
type Membership struct {
	name     string // memberlist name of this process
	started  int64
	join     []string
	rejoin   time.Duration
	clock    clock.Clock
	logger   *slog.Logger
	onChange func(alive []Member)
	ml       *memberlist.Memberlist
	keyring  *memberlist.Keyring // gossip keys; nil when unencrypted

	meta atomic.Pointer[[]byte] // current NodeMeta payload

	mu      sync.Mutex
	nodes   map[string]*row     // by memberlist name, self included
	badMeta map[string]struct{} // names whose undecodable metadata was logged
	joinErr error               // result of the last join attempt

	joined  atomic.Bool
	changed chan struct{} // capacity 1: "the table changed", coalesced

	joinStop     chan struct{} // closed by Leave or Close: stop (re)joining
	contacting   atomic.Bool   // a contactDead is running
	joinStopOnce sync.Once
	done         chan struct{} // closed by Close
	wg           sync.WaitGroup

	life      sync.Mutex // serialises Leave and Close around memberlist
	left      bool       // under life
	closed    bool       // under life
	closeOnce sync.Once
	closeErr  error
}

// row is one row of the member table.
type row struct {
	member Member
	since  time.Time // last change of member.State, on Membership.clock
}

// New validates cfg, starts memberlist and returns at once; joining
// Join happens in the background with backoff (see Joined and JoinError).
//
// onChange, if not nil, is called from a single goroutine owned by the
// Membership: first with just Self, then with Alive whenever the alive set
// or a member's metadata changes. Bursts are coalesced; calls never overlap
// and never run inside memberlist. onChange must not call Close.
func New(cfg Config, onChange func(alive []Member)) (*Membership, error) {
	mlc, err := memberlistConfig(&cfg)
	if err != nil {
		return nil, err
	}
	suffix := make([]byte, 8)
	if _, err := rand.Read(suffix); err != nil {
		return nil, fmt.Errorf("membership: membership: random name suffix: %w", err)
	}
	started := cfg.Clock.Now().UnixNano()
	meta, err := encodeMeta(nodeMeta{ID: cfg.ID, GRPCAddr: cfg.GRPCAddr, Started: started})
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
		clock:    cfg.Clock,
		logger:   logger,
		onChange: onChange,
		keyring:  mlc.Keyring,
		nodes:    make(map[string]*row),
		badMeta:  make(map[string]struct{}),
		changed:  make(chan struct{}, 1),
		joinStop: make(chan struct{}),
		done:     make(chan struct{}),
	}
	m.meta.Store(&meta)
	mlc.Name = m.name
	mlc.Delegate = delegate{m}
	mlc.Events = events{m}
	mlc.Logger = log.New(newLogWriter(logger, cfg.Clock), "", 0)

	ml, err := create(mlc)
	if err != nil {
		return nil, fmt.Errorf("membership: membership: start memberlist: %w", err)
	}
	m.ml = ml

	if len(m.join) == 0 {
		m.joined.Store(true)
	} else {
		m.wg.Add(1)
		go m.joinLoop()
	}
	if onChange != nil {
		m.wg.Add(1)
		go m.notifyLoop()
	}
	self := m.Self()
	logger.Info("membership: membership started", "id", self.ID, "name", self.Name, "gossip_addr", self.Addr, "grpc_addr", self.GRPCAddr)
	return m, nil
}

func create(c *memberlist.Config) (ml *memberlist.Memberlist, err error) {
	defer recoverPanic(&err)
	return memberlist.Create(c)
}

// recoverPanic turns a panic inside memberlist into an error.
func recoverPanic(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("memberlist panic: %v", r)
	}
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
	d, _ := decodeMeta(meta)
	return Member{ID: d.ID, Name: m.name, GRPCAddr: d.GRPCAddr, Started: m.started, State: MemberAlive, Ready: d.Ready, Relaying: d.Relaying, Draining: d.Draining}
}

// Alive returns the live ring members sorted by ID, self included until Leave.
// There is one entry per ID: when two processes share an ID (a restart seen
// before the old process is declared dead, or a second process started by
// mistake under a name in use) a ready one wins over one that is not, then
// the one with the newest Started, ties going to the greater Name. So a
// process that has not synced never displaces a ready one in the rings; a
// restarted one takes the ID over once it is ready, and a duplicate refuses
// to get ready at all (see cluster.Node). Nodes that announced a leave or
// whose metadata does not decode are left out. The slice is the caller's.
func (m *Membership) Alive() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	return pickAlive(m.nodes)
}

func pickAlive(nodes map[string]*row) []Member {
	best := make(map[string]Member, len(nodes))
	for _, n := range nodes {
		mb := n.member
		if mb.State != MemberAlive {
			continue
		}
		if cur, ok := best[mb.ID]; !ok || newer(mb, cur) {
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

// newer reports whether a wins over b, two live processes with one ID.
func newer(a, b Member) bool {
	if a.Ready != b.Ready {
		return a.Ready
	}
	return a.Started > b.Started || (a.Started == b.Started && a.Name > b.Name)
}

// Admitted returns the processes whose calls a peer-access check should
// admit: every live one (also a restarted process that has not synced yet,
// which Alive may not list under its ID), plus those that left gracefully
// less than LeftGrace ago (not the dead: a crashed process sends nothing),
// sorted by ID then Name. The slice is the caller's.
func (m *Membership) Admitted() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Member
	now := m.clock.Now()
	for _, n := range m.nodes {
		if st := n.member.State; st == MemberAlive || (st == MemberLeft && now.Sub(n.since) < LeftGrace) {
			out = append(out, n.member)
		}
	}
	sortMembers(out)
	return out
}

// sortMembers sorts ms by ID, then Name.
func sortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int {
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// All returns every memberlist node this process knows with its state, sorted
// by ID then Name, for diagnostics (/debug/cluster). Dead and left nodes are
// kept for about two minutes; nodes with undecodable metadata are omitted.
func (m *Membership) All() []Member {
	m.mu.Lock()
	m.forgetGoneLocked(m.clock.Now()) // a quiet cluster has no event to do it
	out := make([]Member, 0, len(m.nodes))
	for _, n := range m.nodes {
		out = append(out, n.member)
	}
	m.mu.Unlock()
	sortMembers(out)
	return out
}

// Joined reports whether this node is part of a cluster: true once a join
// reached at least one node (itself included), once another node has joined
// it, or from the start when Join is empty.
func (m *Membership) Joined() bool { return m.joined.Load() }

// JoinError returns the error of the latest join attempt, which names the
// seeds, or nil if it succeeded or none has finished yet.
func (m *Membership) JoinError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.joinErr
}

// numMembers returns how many memberlist processes (self included) are alive
// or suspect. It can exceed len(Alive()) while a restarted ID's old process is
// still being detected, or when a node's metadata does not decode.
func (m *Membership) numMembers() int { return m.ml.NumMembers() }
