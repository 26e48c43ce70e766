package membership

import (
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
	// Ready, Relaying and Draining are the process's lifecycle flags, from
	// its metadata (see Flags and Membership.SetFlags). A process starts
	// with none.
	Ready    bool
	Relaying bool
	Draining bool
}

// Flags are the lifecycle flags a process gossips about itself in its
// metadata (Member.Ready, Member.Relaying, Member.Draining).
type Flags struct {
	// Ready: the process has synced its counters and may be a ring member.
	Ready bool
	// Relaying: the process, ready, still relays the ops it is sent to the
	// keys' owners on the ring without it. Only with Ready.
	Relaying bool
	// Draining: the process hands its counters off before it leaves. Once
	// set it stays set.
	Draining bool
}

// MaxLabelLen bounds Config.Label: memberlist's limit.
const MaxLabelLen = memberlist.LabelMaxSize

// LeftGrace is how long Admitted keeps a member that left gracefully: while
// it drains it still relays ops and ships replication writes, on streams it
// may open after its peers have seen it leave.
const LeftGrace = time.Minute
