package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// leaseConfig has limits large enough to be leased (an owner leases
// nothing once fewer than 4n hits are left), per day, so that exact counts
// taken over seconds of real time do not straddle a window edge. A request
// that carries "tenant" and "tier: gold, user" counts only the gold rule:
// gold replaces tenant, whose limit is ten times lower.
const leaseConfig = `domain: lease
descriptors:
  - key: plain
    rate_limit:
      unit: day
      requests_per_unit: 300
  - key: addend
    rate_limit:
      unit: day
      requests_per_unit: 300
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: day
      requests_per_unit: 300
  - key: tenant
    rate_limit:
      name: tenant
      unit: day
      requests_per_unit: 30
  - key: tier
    value: gold
    descriptors:
      - key: user
        rate_limit:
          name: gold
          unit: day
          requests_per_unit: 300
          replaces:
            - name: tenant
`

// leaseCase is one rule of leaseConfig (or a request-level override)
// driven past its limit.
type leaseCase struct {
	name  string
	limit int // hits the key allows in its window
	hits  int // hits each request adds
	// shadow: every answer is OK; what the key allowed is read from the
	// rule's within_limit stat.
	shadow bool
	// status is the index of the descriptor whose status is checked.
	status int
	req    func(tag string) *pb.RateLimitRequest
}

// leaseCases are the cases with keys suffixed by tag, so that each part of
// a test counts on fresh keys.
func leaseCases() []leaseCase {
	return []leaseCase{
		{name: "plain", limit: 300, hits: 1, req: func(tag string) *pb.RateLimitRequest {
			return Request("lease", "plain", tag)
		}},
		{name: "hits_addend=3", limit: 300, hits: 3, req: func(tag string) *pb.RateLimitRequest {
			r := Request("lease", "addend", tag)
			r.HitsAddend = 3
			return r
		}},
		{name: "override", limit: 240, hits: 1, req: func(tag string) *pb.RateLimitRequest {
			// A key no rule matches, limited by the request itself.
			r := Request("lease", "ov", tag)
			r.Descriptors[0].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 240, Unit: typev3.RateLimitUnit_DAY}
			return r
		}},
		{name: "shadow_mode", limit: 300, hits: 1, shadow: true, req: func(tag string) *pb.RateLimitRequest {
			return Request("lease", "shadow", tag)
		}},
		{name: "replaces", limit: 300, hits: 1, status: 1, req: func(tag string) *pb.RateLimitRequest {
			r := Request("lease", "tenant", tag)
			r.Descriptors = append(r.Descriptors, Request("lease", "tier", "gold", "user", tag).Descriptors[0])
			return r
		}},
	}
}

// requests is how many requests a case sends: twice what its limit allows,
// so that every node keeps sending (and spends what it leased) long after
// the key is over its limit.
func (lc *leaseCase) requests() int { return 2 * lc.limit / lc.hits }

// leaseTally is what one case's key was answered.
type leaseTally struct {
	mu       sync.Mutex
	allowed  int // hits of the requests answered OK (not for shadow cases)
	overs    int // OVER_LIMIT answers
	early    int // OVER_LIMIT answers before the key's last OK (sequential parts)
	failed   int // calls that returned an error
	problems []string
}

func (t *leaseTally) problem(format string, args ...any) {
	if len(t.problems) < 5 {
		t.problems = append(t.problems, fmt.Sprintf(format, args...))
	}
}

// record checks one answer of case lc and counts it.
func (t *leaseTally) record(lc *leaseCase, resp *pb.RateLimitResponse, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.failed++
		t.problem("call failed: %v", err)
		return
	}
	if len(resp.Statuses) != len(lc.req("x").Descriptors) {
		t.problem("%d statuses", len(resp.Statuses))
		return
	}
	if lc.status == 1 {
		// The replaced rule is dropped: OK and no limit.
		if s := resp.Statuses[0]; s.Code != pb.RateLimitResponse_OK || s.CurrentLimit != nil {
			t.problem("replaced descriptor answered %v", s)
		}
	}
	st := resp.Statuses[lc.status]
	if st.CurrentLimit == nil || int(st.CurrentLimit.RequestsPerUnit) != lc.limit || st.CurrentLimit.Unit != pb.RateLimitResponse_RateLimit_DAY {
		t.problem("status has limit %v, want %d per day", st.CurrentLimit, lc.limit)
	}
	if st.DurationUntilReset.GetSeconds() <= 0 {
		t.problem("status resets in %v", st.DurationUntilReset)
	}
	if st.Code != resp.OverallCode {
		t.problem("descriptor code %v, overall %v", st.Code, resp.OverallCode)
	}
	switch {
	case lc.shadow && resp.OverallCode != pb.RateLimitResponse_OK:
		t.problem("shadow_mode rule answered %v", resp.OverallCode)
	case resp.OverallCode == pb.RateLimitResponse_OK:
		if int(st.LimitRemaining) > lc.limit-lc.hits {
			t.problem("OK with %d remaining, at most %d possible", st.LimitRemaining, lc.limit-lc.hits)
		}
		if !lc.shadow {
			t.allowed += lc.hits
			t.early = t.overs
		}
	default:
		t.overs++
		if st.LimitRemaining != 0 {
			t.problem("OVER_LIMIT with %d remaining", st.LimitRemaining)
		}
	}
}

// leaseMetric sums a metric over nodes, 0 for a node that is not running.
func leaseMetric(t *testing.T, nodes []*Node, prefix string) float64 {
	t.Helper()
	var sum float64
	for _, n := range nodes {
		if !n.Running() {
			continue
		}
		v, err := n.Metric(prefix)
		if err != nil {
			t.Fatalf("%s: %v", n.ID, err)
		}
		sum += v
	}
	return sum
}

// shadowWithin is the hits the shadow_mode rule counted within its limit,
// summed over nodes.
func shadowWithin(t *testing.T, nodes []*Node) int {
	return int(leaseMetric(t, nodes, `ratelimit_service_rate_limit_within_limit{domain="lease",key="shadow"}`))
}

// leaseCall sends one request with a deadline far above any answer: only an
// error is a failure, never a slow machine's slow answer.
func leaseCall(cl pb.RateLimitServiceClient, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cl.ShouldRateLimit(ctx, req)
}

// runSequential sends every case's requests, the cases interleaved, each
// request to the next client in turn, and returns the tallies (the shadow
// case's allowed hits read from nodes' stats).
func runSequential(t *testing.T, nodes []*Node, cls []pb.RateLimitServiceClient, cases []leaseCase, tag string) []*leaseTally {
	t.Helper()
	tallies := make([]*leaseTally, len(cases))
	for i := range tallies {
		tallies[i] = new(leaseTally)
	}
	shadow0 := shadowWithin(t, nodes)
	most := 0
	for _, lc := range cases {
		most = max(most, lc.requests())
	}
	next := 0
	for i := 0; i < most; i++ {
		for ci := range cases {
			lc := &cases[ci]
			if i >= lc.requests() {
				continue
			}
			resp, err := leaseCall(cls[next%len(cls)], lc.req(tag))
			next++
			tallies[ci].record(lc, resp, err)
		}
	}
	for ci := range cases {
		if cases[ci].shadow {
			tallies[ci].allowed = shadowWithin(t, nodes) - shadow0
		}
	}
	return tallies
}

// runConcurrent sends the same requests as runSequential from workers
// goroutines, each sending its requests to the clients in turn.
func runConcurrent(t *testing.T, nodes []*Node, cls []pb.RateLimitServiceClient, cases []leaseCase, tag string, workers int) []*leaseTally {
	t.Helper()
	tallies := make([]*leaseTally, len(cases))
	for i := range tallies {
		tallies[i] = new(leaseTally)
	}
	shadow0 := shadowWithin(t, nodes)
	total := 0
	for _, lc := range cases {
		total += lc.requests()
	}
	work := make(chan int, total)
	most := 0
	for _, lc := range cases {
		most = max(most, lc.requests())
	}
	for i := 0; i < most; i++ {
		for ci, lc := range cases {
			if i < lc.requests() {
				work <- ci
			}
		}
	}
	close(work)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := w
			for ci := range work {
				lc := &cases[ci]
				resp, err := leaseCall(cls[next%len(cls)], lc.req(tag))
				next++
				tallies[ci].record(lc, resp, err)
			}
		}()
	}
	wg.Wait()
	for ci := range cases {
		if cases[ci].shadow {
			tallies[ci].allowed = shadowWithin(t, nodes) - shadow0
		}
	}
	return tallies
}

// startLeaseCluster starts three nodes serving leaseConfig and waits until
// none of them relays: a node that has just joined relays the ops for its
// keys to their previous owners for a while, and a relayed op is granted no
// lease.
func startLeaseCluster(t *testing.T) *Cluster {
	t.Helper()
	c := startCluster(t, 3, leaseConfig)
	client := &http.Client{Timeout: time.Second}
	relaying := func(n *Node) (bool, error) {
		resp, err := client.Get("http://" + n.Debug + "/debug/cluster")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		var v struct {
			Relaying bool `json:"relaying"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		return v.Relaying, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		busy := ""
		for _, n := range c.Nodes {
			if r, err := relaying(n); err != nil || r {
				busy = fmt.Sprintf("%s (relaying %v, %v)", n.ID, r, err)
				break
			}
		}
		if busy == "" {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node still relays after 30 s: %s", busy)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
}

// utcDay is the day window that holds now.
func utcDay() int64 { return time.Now().Unix() / 86400 }

// skipIfDayEnded skips a test whose counts crossed midnight UTC: its keys'
// day windows ended meanwhile and their counts restarted.
func skipIfDayEnded(t *testing.T, day int64) {
	t.Helper()
	if utcDay() != day {
		t.Skip("a day window ended during the test; its counts restarted")
	}
}

// TestClusterLeasesKeepRuleMeaning: with leases, each rule still allows
// exactly its limit per window, counted in hits, across three nodes that
// take turns: hits_addend, a request-level limit override, a shadow_mode
// rule (answers OK, counts as usual) and a rule that replaces another (the
// replaced one counts nothing). Past the limit every answer is OVER_LIMIT
// with nothing remaining. One node answering the same sequence allows the
// same totals, and the cluster decided some of the hits from leases.
func TestClusterLeasesKeepRuleMeaning(t *testing.T) {
	day := utcDay()
	cases := leaseCases()

	// One node alone serves without a ring.
	one := layoutCluster(t, 1, leaseConfig)
	if err := one.StartAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	ref := runSequential(t, one.Nodes, dialAll(t, one.Nodes), cases, "seq")
	one.Close()

	c := startLeaseCluster(t)
	cls := dialAll(t, c.Nodes)
	seq := runSequential(t, c.Nodes, cls, cases, "seq")
	usedSeq := leaseMetric(t, c.Nodes, `ringlimit_leased_hits_total{event="used"`)
	conc := runConcurrent(t, c.Nodes, cls, cases, "conc", 8)
	used := leaseMetric(t, c.Nodes, `ringlimit_leased_hits_total{event="used"`)

	// After both parts every key is over its limit at every node until its
	// window ends.
	for ci := range cases {
		lc := &cases[ci]
		for _, tag := range []string{"seq", "conc"} {
			for i, cl := range cls {
				resp, err := leaseCall(cl, lc.req(tag))
				if err != nil {
					t.Fatalf("%s %s at %s: %v", lc.name, tag, c.Nodes[i].ID, err)
				}
				want := pb.RateLimitResponse_OVER_LIMIT
				if lc.shadow {
					want = pb.RateLimitResponse_OK
				}
				if resp.OverallCode != want || resp.Statuses[lc.status].LimitRemaining != 0 {
					t.Errorf("%s %s at %s after the run: %v with %d remaining, want %v with none", lc.name, tag, c.Nodes[i].ID,
						resp.OverallCode, resp.Statuses[lc.status].LimitRemaining, want)
				}
			}
		}
	}
	// The replaced rule counted nothing: its key's first hit of its own
	// leaves all but one of its limit.
	for _, tag := range []string{"seq", "conc"} {
		resp, err := leaseCall(cls[0], Request("lease", "tenant", tag))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Statuses[0].LimitRemaining; resp.OverallCode != pb.RateLimitResponse_OK || got != 29 {
			t.Errorf("tenant %s alone: %v with %d remaining, want OK with 29 (the rule gold replaces counted nothing)", tag, resp.OverallCode, got)
		}
	}
	skipIfDayEnded(t, day)

	for _, n := range c.Nodes {
		g, _ := n.Metric(`ringlimit_leased_hits_total{event="granted"`)
		u, _ := n.Metric(`ringlimit_leased_hits_total{event="used"`)
		r, _ := n.Metric(`ringlimit_leased_hits_total{event="returned"`)
		e, _ := n.Metric(`ringlimit_leased_hits_total{event="expired"`)
		fw, _ := n.Metric("ringlimit_forwarded_decisions_total")
		d, _ := n.Metric("ringlimit_decisions_total")
		t.Logf("%s: leased hits granted %v used %v returned %v expired %v; %v of %v decisions forwarded", n.ID, g, u, r, e, fw, d)
	}
	if usedSeq == 0 || used <= usedSeq {
		t.Errorf("leased hits used: %v after the sequential part, %v after both: want some in each", usedSeq, used)
	}
	check := func(part string, got []*leaseTally) {
		for ci := range cases {
			lc, g := &cases[ci], got[ci]
			t.Logf("%s %s: %d allowed (one node: %d), %d OVER_LIMIT, %d of them before the last OK", part, lc.name, g.allowed, ref[ci].allowed, g.overs, g.early)
			for _, p := range g.problems {
				t.Errorf("%s %s: %s", part, lc.name, p)
			}
			// Leases are granted in whole requests' hits (hits_addend
			// included), so every key allows what one node allows.
			if g.allowed > lc.limit {
				t.Errorf("%s %s: %d hits allowed, over the limit of %d", part, lc.name, g.allowed, lc.limit)
			} else if g.allowed != ref[ci].allowed {
				t.Errorf("%s %s: %d hits allowed, one node allows %d", part, lc.name, g.allowed, ref[ci].allowed)
			}
		}
	}
	for ci := range cases {
		if ref[ci].allowed != cases[ci].limit || len(ref[ci].problems) > 0 {
			t.Errorf("one node, %s: %d allowed, want %d; %v", cases[ci].name, ref[ci].allowed, cases[ci].limit, ref[ci].problems)
		}
	}
	check("sequential", seq)
	check("concurrent", conc)
}

// leasedKey finds a value of key "plain" that holder does not own, by
// sending one hit of each candidate to holder until one is forwarded with
// a lease granted back; it returns the value and the hits allowed so far.
func leasedKey(t *testing.T, holder *Node, cl pb.RateLimitServiceClient, prefix string) (string, int) {
	t.Helper()
	for i := range 30 {
		v := fmt.Sprintf("%s-%d", prefix, i)
		before, err := holder.Metric(`ringlimit_leased_hits_total{event="granted"`)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := leaseCall(cl, Request("lease", "plain", v))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("plain %s: first hit answered %v", v, resp.OverallCode)
		}
		after, err := holder.Metric(`ringlimit_leased_hits_total{event="granted"`)
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return v, 1
		}
	}
	fw, _ := holder.Metric("ringlimit_forwarded_decisions_total")
	t.Fatalf("%s owns or was leased nothing for 30 keys (%v decisions forwarded); log %s:\n%s", holder.ID, fw, holder.LogPath, tail(holder.LogPath, 40))
	return "", 0
}

// fillLease sends hits of plain=v to cl and returns the hits allowed.
func fillLease(t *testing.T, cl pb.RateLimitServiceClient, v string, hits int) int {
	t.Helper()
	allowed := 0
	for range hits {
		resp, err := leaseCall(cl, Request("lease", "plain", v))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == pb.RateLimitResponse_OK {
			allowed++
		}
	}
	return allowed
}

// unusedLeased is the quota holder was leased and has neither used nor
// returned nor dropped, once some is: a lease renewed in the background
// arrives a little after the hits that asked for it, so it polls for up to
// 5 s before it reports 0.
func unusedLeased(t *testing.T, holder *Node) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := unusedLeasedNow(t, holder)
		if n > 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func unusedLeasedNow(t *testing.T, holder *Node) int {
	t.Helper()
	get := func(ev string) float64 {
		v, err := holder.Metric(`ringlimit_leased_hits_total{event="` + ev + `"`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return int(get("granted") - get("used") - get("returned") - get("expired"))
}

// sendPast sends n hits of plain=v, each to the next of cls in turn, and
// returns the hits allowed and the calls that failed.
func sendPast(cls []pb.RateLimitServiceClient, v string, n int) (allowed, failed int, firstErr error) {
	for i := range n {
		resp, err := leaseCall(cls[i%len(cls)], Request("lease", "plain", v))
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if resp.OverallCode == pb.RateLimitResponse_OK {
			allowed++
		}
	}
	return allowed, failed, firstErr
}

// TestClusterLeaseHolderKilled: a node that holds a lease on a key another
// node owns is killed with its quota unused. That quota stays counted as
// used: the survivors, sending past the limit, never let the key's total
// go over it, and they keep answering.
func TestClusterLeaseHolderKilled(t *testing.T) {
	day := utcDay()
	c := startLeaseCluster(t)
	cls := dialAll(t, c.Nodes)
	holder := c.Nodes[0]
	const limit = 300
	v, allowed := leasedKey(t, holder, cls[0], "kill")
	allowed += fillLease(t, cls[0], v, 40)
	lost := unusedLeased(t, holder)
	t.Logf("%s: %d allowed, %d leased and unused before the kill", holder.ID, allowed, lost)
	if lost <= 0 {
		t.Fatalf("%s holds no unused lease after %d hits", holder.ID, allowed)
	}
	if err := holder.Kill(); err != nil {
		t.Fatal(err)
	}
	after, failed, err := sendPast(cls[1:], v, 2*limit)
	skipIfDayEnded(t, day)
	total := allowed + after
	t.Logf("after the kill: %d allowed by the survivors, %d in all at limit %d (%d leased to the killed node, unused)", after, total, limit, lost)
	if failed > 0 {
		t.Errorf("%d of %d calls to the survivors failed, first: %v", failed, 2*limit, err)
	}
	if total > limit {
		t.Errorf("plain %s: %d hits allowed, over the limit of %d", v, total, limit)
	}
	if total < limit-lost {
		t.Errorf("plain %s: %d hits allowed, want at least %d (the limit less the killed node's unused lease of %d)", v, total, limit-lost, lost)
	}
	for _, n := range c.Nodes[1:] {
		if !n.Running() {
			t.Errorf("%s is not running", n.ID)
		}
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("unexpected exits: %v", cr)
	}
}

// TestClusterLeasesReturnedOnDrain: a node that holds a lease on a key another
// node owns is stopped gracefully (SIGTERM). Its drain gives the unused
// quota back to the owner, so the other nodes, sending past the limit,
// allow exactly the key's limit in all.
func TestClusterLeasesReturnedOnDrain(t *testing.T) {
	day := utcDay()
	c := startLeaseCluster(t)
	cls := dialAll(t, c.Nodes)
	holder, rest := c.Nodes[0], c.Nodes[1:]
	const limit = 300
	v, allowed := leasedKey(t, holder, cls[0], "drain")
	allowed += fillLease(t, cls[0], v, 40)
	unused := unusedLeased(t, holder)
	taken0 := leaseMetric(t, rest, `ringlimit_lease_releases_total{result="taken"`)
	t.Logf("%s: %d allowed, %d leased and unused before the SIGTERM", holder.ID, allowed, unused)
	if unused <= 0 {
		t.Fatalf("%s holds no unused lease after %d hits", holder.ID, allowed)
	}
	if err := holder.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := holder.ExitErr(); err != nil {
		t.Errorf("%s: exit after SIGTERM: %v", holder.ID, err)
	}
	taken := leaseMetric(t, rest, `ringlimit_lease_releases_total{result="taken"`) - taken0
	after, failed, err := sendPast(cls[1:], v, 2*limit)
	skipIfDayEnded(t, day)
	total := allowed + after
	t.Logf("after the drain: %v releases taken by the owner, %d allowed by the others, %d in all at limit %d", taken, after, total, limit)
	if failed > 0 {
		t.Errorf("%d of %d calls to the others failed, first: %v", failed, 2*limit, err)
	}
	if taken <= 0 {
		t.Errorf("no owner took a release from the draining %s", holder.ID)
	}
	if total != limit {
		t.Errorf("plain %s: %d hits allowed, want exactly the limit of %d (the drained node's unused lease of %d went back)", v, total, limit, unused)
		for _, n := range c.Nodes {
			t.Logf("log %s:\n%s", n.LogPath, grepLog(n.LogPath, "drain", "handed off", "release", "sync", "ring rebuilt", "lifecycle"))
		}
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("unexpected exits: %v", cr)
	}
}

// grepLog returns the lines of a log that contain any of words.
func grepLog(path string, words ...string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
