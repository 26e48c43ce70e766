package cluster

import (
	"encoding/json"
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

// DebugHandler serves /debug/cluster: this node and its lifecycle phase,
// the fingerprints of its gossip keys (primary first), every member with
// its state and addresses, and how many ring partitions each owns.
func (n *Node) DebugHandler() http.Handler {
	type member struct {
		membership.Member
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
		var ms []member
		for _, m := range n.m.All() {
			p := 0
			if m.State == membership.MemberAlive && v.addrs[m.ID] == m.GRPCAddr {
				p = parts[m.ID]
			}
			ms = append(ms, member{Member: m, Partitions: p, Suspect: suspects[m.ID]})
		}
		sort.Slice(ms, func(i, j int) bool {
			if ms[i].ID != ms[j].ID {
				return ms[i].ID < ms[j].ID
			}
			return ms[i].Started > ms[j].Started
		})
		out := struct {
			Self       membership.Member `json:"self"`
			Joined     bool              `json:"joined"`
			Phase      string            `json:"phase"`
			PhaseSince string            `json:"phase_since"`
			Ready      bool              `json:"ready"`
			Serving    bool              `json:"serving"`
			Draining   bool              `json:"draining,omitempty"`
			Relaying   bool              `json:"relaying,omitempty"`
			Replicas   int               `json:"replicas"`
			GossipKeys []string          `json:"gossip_keys,omitempty"`
			Ring       []string          `json:"ring"`
			RingBuilt  string            `json:"ring_built"`
			Members    []member          `json:"members"`
		}{n.m.Self(), n.m.Joined(), v.phase.String(), v.since.UTC().Format(time.RFC3339Nano), n.Ready(), v.route.Serve,
			v.route.Departing, v.route.Relay != lifecycle.RelayNone, n.replicas, n.m.KeyFingerprints(), v.ring.Members(), v.built.UTC().Format(time.RFC3339Nano), ms}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	})
}
