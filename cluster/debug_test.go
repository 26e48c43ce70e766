package cluster

import (
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// /debug/cluster uses one key style (snake_case) and RFC 3339 for every
// time, for this node and its members.
func TestDebugHandlerKeysAndTimes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		nodes := sim.cluster([]string{"a", "b"}, nil)
		rec := httptest.NewRecorder()
		nodes[0].node.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/cluster", nil))
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%v\n%s", err, rec.Body.String())
		}
		snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, x := range v {
					if !snake.MatchString(k) {
						t.Errorf("%s.%s: key is not snake_case", path, k)
					}
					walk(path+"."+k, x)
				}
			case []any:
				for _, x := range v {
					walk(path+"[]", x)
				}
			}
		}
		walk("", out)
		times := []any{out["phase_since"], out["ring_built"], out["self"].(map[string]any)["started"]}
		members := out["members"].([]any)
		if len(members) != 2 {
			t.Fatalf("members %v", members)
		}
		for _, m := range members {
			m := m.(map[string]any)
			times = append(times, m["started"])
			if m["state"] != "alive" || m["ready"] != true || m["grpc_addr"] == "" || m["gossip_addr"] == "" || m["partitions"].(float64) <= 0 {
				t.Errorf("member %v", m)
			}
		}
		for _, tm := range times {
			s, _ := tm.(string)
			if ts, err := time.Parse(time.RFC3339Nano, s); err != nil || ts.Year() < 2000 {
				t.Errorf("time %v is not RFC 3339: %v", tm, err)
			}
		}
		if out["ready"] != true || out["not_ready"] != nil || out["phase"] != "serving" {
			t.Errorf("ready %v, not_ready %v, phase %v", out["ready"], out["not_ready"], out["phase"])
		}
	})
}

// A node whose seeds do not answer says it is joining, which seeds it
// tries and the last error.
func TestNotReadyReasonJoining(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		sim := newSimCluster(t)
		a := sim.start("a", nil, func(c *NodeConfig) { c.Membership.Join = []string{"10.0.0.99:7946"} })
		testkit.WaitFor(t, quick, "a failed join attempt", func() bool { return a.node.Membership().JoinError() != nil })
		got := a.node.NotReadyReason()
		if !strings.HasPrefix(got, "joining the cluster: no peer reached yet") || !strings.Contains(got, "last attempt: membership: join [10.0.0.99:7946]") {
			t.Errorf("NotReadyReason() = %q", got)
		}
		if a.node.Ready() {
			t.Error("ready without a peer")
		}
	})
}
