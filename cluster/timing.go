package cluster

import (
	"cmp"
	"fmt"
	"time"
)

// Timing is how fast a node notices and reacts: memberlist's gossip
// profile and the node's own periods. Start from a preset, LAN or Local,
// and change what a test or a deployment needs; a zero field takes the
// LAN value.
type Timing struct {
	// Gossip is memberlist's profile: "lan" (memberlist.DefaultLANConfig)
	// or "local" (DefaultLocalConfig: faster failure detection, for nodes
	// on one machine).
	Gossip string
	// ForwardTimeout is how long a forwarded op waits for its owner when
	// the caller's context has no deadline.
	ForwardTimeout time.Duration
	// SuspectFor is how long a peer that failed to answer is bypassed,
	// unless a probe answers sooner.
	SuspectFor time.Duration
	// ReplicateInterval is how often recorded writes are sent to the
	// replicas: the most an owner crash can lose.
	ReplicateInterval time.Duration
	// SyncTimeout bounds one peer's Sync when a node (re)joins.
	SyncTimeout time.Duration
	// JoinRelay is how long a node that has just gone ready relays the
	// ops for its keys to their previous owners while its readiness
	// spreads (see lifecycle.Relaying); negative: never.
	JoinRelay time.Duration
	// PauseThreshold is the gap between two ticks of the pause detector
	// (every PauseThreshold/10) that means this process was frozen;
	// negative: no detection.
	PauseThreshold time.Duration
}

// LAN is the timing for a cluster on a LAN or in Kubernetes: memberlist's
// LAN profile (failures detected in 5-7 s), forwards that wait 10 ms
// without a deadline, replication every 5 ms, a 2 s join relay (readiness
// spreads in well under a second) and a pause detector that notices a
// freeze of a second.
func LAN() Timing {
	return Timing{
		Gossip:            "lan",
		ForwardTimeout:    10 * time.Millisecond,
		SuspectFor:        2 * time.Second,
		ReplicateInterval: 5 * time.Millisecond,
		SyncTimeout:       1500 * time.Millisecond,
		JoinRelay:         2 * time.Second,
		PauseThreshold:    time.Second,
	}
}

// Local is LAN with memberlist's local profile, for nodes on one machine
// (tests on loopback): failures are detected in about 5 s, and readiness
// spreads in a few hundred milliseconds, so the join relay lasts 1 s.
func Local() Timing {
	t := LAN()
	t.Gossip = "local"
	t.JoinRelay = time.Second
	return t
}

// withDefaults fills t's zero fields from LAN and checks it.
func (t Timing) withDefaults() (Timing, error) {
	d := LAN()
	t.Gossip = cmp.Or(t.Gossip, d.Gossip)
	t.ForwardTimeout = cmp.Or(t.ForwardTimeout, d.ForwardTimeout)
	t.SuspectFor = cmp.Or(t.SuspectFor, d.SuspectFor)
	t.ReplicateInterval = cmp.Or(t.ReplicateInterval, d.ReplicateInterval)
	t.SyncTimeout = cmp.Or(t.SyncTimeout, d.SyncTimeout)
	t.JoinRelay = cmp.Or(t.JoinRelay, d.JoinRelay)
	t.PauseThreshold = cmp.Or(t.PauseThreshold, d.PauseThreshold)
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"ForwardTimeout", t.ForwardTimeout}, {"SuspectFor", t.SuspectFor}, {"ReplicateInterval", t.ReplicateInterval}, {"SyncTimeout", t.SyncTimeout}} {
		if f.d < 0 {
			return t, fmt.Errorf("cluster: node: Timing.%s must be >= 0, got %v", f.name, f.d)
		}
	}
	if t.Gossip != "lan" && t.Gossip != "local" {
		return t, fmt.Errorf("cluster: node: Timing.Gossip: unknown profile %q (want \"lan\" or \"local\")", t.Gossip)
	}
	return t, nil
}
