package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// RingMembers reads a node's current ring from /debug/cluster.
func (n *Node) RingMembers() ([]string, error) {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + n.Debug + "/debug/cluster")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v struct {
		Ring []string `json:"ring"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, err
	}
	sort.Strings(v.Ring)
	return v.Ring, nil
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
