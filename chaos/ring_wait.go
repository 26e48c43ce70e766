package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// clusterStatus is the part of /debug/cluster the harness reads.
type clusterStatus struct {
	Ring       []string `json:"ring"`
	GossipKeys []string `json:"gossip_keys"`
}

// debugCluster reads a node's /debug/cluster.
func (n *Node) debugCluster() (clusterStatus, error) {
	var v clusterStatus
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + n.Debug + "/debug/cluster")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v, err
}

// RingMembers reads a node's current ring from /debug/cluster.
func (n *Node) RingMembers() ([]string, error) {
	v, err := n.debugCluster()
	if err != nil {
		return nil, err
	}
	sort.Strings(v.Ring)
	return v.Ring, nil
}

// GossipKeys reads the fingerprints of a node's gossip keys, the primary
// first, from /debug/cluster.
func (n *Node) GossipKeys() ([]string, error) {
	v, err := n.debugCluster()
	return v.GossipKeys, err
}

// WaitRing polls until every listed node's ring is exactly the IDs of want.
func WaitRing(timeout time.Duration, nodes []*Node, want []*Node) error {
	var ids []string
	for _, n := range want {
		ids = append(ids, n.ID)
	}
	sort.Strings(ids)
	wantS := strings.Join(ids, ",")
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		var last string
		for _, n := range nodes {
			got, err := n.RingMembers()
			if err != nil || strings.Join(got, ",") != wantS {
				ok = false
				last = fmt.Sprintf("%s sees %v (%v)", n.ID, got, err)
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: ring did not settle on [%s] within %v: %s", wantS, timeout, last)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
}
