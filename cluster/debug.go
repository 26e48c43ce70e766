package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/ringlimit/ringlimit/cluster/lifecycle"
	"github.com/ringlimit/ringlimit/cluster/membership"
)

// Status is where a node is in its life and what it routes by.
type Status struct {
	Phase     lifecycle.Phase
	Since     time.Time // when the phase began
	Ready     bool      // see Node.Ready
	Route     lifecycle.Route
	Ring      []string // the members of the ring that owns keys, sorted
	RingBuilt time.Time
}

// Status returns the node's status from its current view.
func (n *Node) Status() Status {
	v := n.view.Load()
	return Status{Phase: v.phase, Since: v.since, Ready: n.Ready(), Route: v.route, Ring: v.ring.Members(), RingBuilt: v.built}
}

// NotReadyReason says in plain words why the node is not ready (see
// Ready), or returns "" when it is: loading its saved counters, joining
// (with the last join error, which names the seeds), syncing, resyncing
// after a pause, draining or leaving.
func (n *Node) NotReadyReason() string {
	if n.Ready() {
		return ""
	}
	v := n.view.Load()
	dur := ""
	if !v.since.IsZero() {
		dur = fmt.Sprintf(" (for %s)", n.clock.Now().Sub(v.since).Round(time.Second))
	}
	switch v.phase {
	case lifecycle.Loading:
		return "loading the counters saved on disk" + dur
	case lifecycle.Joining:
		reason := "joining the cluster: no peer reached yet" + dur
		if err := n.m.JoinError(); err != nil {
			reason += "; last attempt: " + err.Error()
		}
		return reason
	case lifecycle.Syncing:
		return "syncing: pulling the counters it will hold from its peers" + dur
	case lifecycle.Resyncing:
		return "resyncing: it was paused (frozen) and is pulling its counters again" + dur
	case lifecycle.Draining:
		return "draining: handing its counters to the other nodes before it leaves" + dur
	case lifecycle.Leaving, lifecycle.Left:
		return "leaving the cluster" + dur
	}
	return "waiting to be placed in its own ring (phase " + v.phase.String() + ")" + dur
}

// memberJSON is a member in /debug/cluster.
type memberJSON struct {
	ID         string `json:"id"`
	Name       string `json:"name"` // the process: ID + "/" + a per-process suffix
	GRPCAddr   string `json:"grpc_addr"`
	GossipAddr string `json:"gossip_addr"`
	Started    string `json:"started"` // RFC 3339
	State      string `json:"state"`   // alive, dead or left
	Ready      bool   `json:"ready"`
	Relaying   bool   `json:"relaying"`
	Draining   bool   `json:"draining"`
}

func toMemberJSON(m membership.Member) memberJSON {
	return memberJSON{ID: m.ID, Name: m.Name, GRPCAddr: m.GRPCAddr, GossipAddr: m.Addr,
		Started: rfc3339(time.Unix(0, m.Started)), State: m.State, Ready: m.Ready, Relaying: m.Relaying, Draining: m.Draining}
}

// rfc3339 formats t in UTC, to the nanosecond.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// DebugHandler serves /debug/cluster: this node and its lifecycle phase,
// the fingerprints of its gossip keys (primary first), every member with
// its state and addresses, and how many ring partitions each owns. Keys are
// snake_case, times RFC 3339 (UTC).
func (n *Node) DebugHandler() http.Handler {
	type member struct {
		memberJSON
		Partitions int  `json:"partitions"`
		Suspect    bool `json:"suspect,omitempty"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := n.view.Load()
		parts := v.ring.Partitions()
		suspects := map[string]bool{}
		for _, id := range n.fwd.Suspects() {
			suspects[id] = true
		}
		all := n.m.All()
		sort.Slice(all, func(i, j int) bool {
			if all[i].ID != all[j].ID {
				return all[i].ID < all[j].ID
			}
			return all[i].Started > all[j].Started
		})
		ms := []member{}
		for _, m := range all {
			p := 0
			if m.State == membership.MemberAlive && v.addrs[m.ID] == m.GRPCAddr {
				p = parts[m.ID]
			}
			ms = append(ms, member{memberJSON: toMemberJSON(m), Partitions: p, Suspect: suspects[m.ID]})
		}
		out := struct {
			Self       memberJSON `json:"self"`
			Joined     bool       `json:"joined"`
			Phase      string     `json:"phase"`
			PhaseSince string     `json:"phase_since"`
			Ready      bool       `json:"ready"`
			NotReady   string     `json:"not_ready,omitempty"` // why not, as /healthcheck says
			Serving    bool       `json:"serving"`
			Draining   bool       `json:"draining,omitempty"`
			Relaying   bool       `json:"relaying,omitempty"`
			Replicas   int        `json:"replicas"`
			GossipKeys []string   `json:"gossip_keys,omitempty"`
			Ring       []string   `json:"ring"`
			RingBuilt  string     `json:"ring_built"`
			Members    []member   `json:"members"`
		}{toMemberJSON(n.m.Self()), n.m.Joined(), v.phase.String(), rfc3339(v.since), n.Ready(), n.NotReadyReason(), v.route.Serve,
			v.route.Departing, v.route.Relay != lifecycle.RelayNone, n.replicas, n.m.KeyFingerprints(), v.ring.Members(), rfc3339(v.built), ms}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	})
}
