package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Params sizes one run of the suite: the full one (`make chaos`) or the
// short one that runs inside `go test ./chaos/`.
type Params struct {
	Full         bool
	Keys         int           // distinct descriptor values hit
	Limit        int           // requests per hour of each value
	Rate         float64       // steady load, calls per second over every node
	PrimeRate    float64       // load while the keys are being exhausted
	Workers      int           // concurrent callers of the load driver
	ConnsPerNode int           // long-lived connections of the fleet to each node
	Deadline     time.Duration // per call (Envoy's ratelimit timeout)
	Hold         time.Duration // steady load after each step of a scenario
	Freeze       time.Duration // how long an owner stays SIGSTOPped
	Partition    time.Duration // how long a node stays cut off
	Tolerance    float64       // allowed overshoot, as a fraction of the budget
	// Timing bounds. The full suite checks the targets; the short
	// one, which runs on a loaded machine under -race, only generous bounds
	// and reports the numbers.
	P99Bound    time.Duration // survivors' p99 while an owner is frozen
	RejoinBound time.Duration // restart with the same identity until every ring has it
	MergeBound  time.Duration // heal until every ring is whole again
	// SplitAnswered is the least fraction of each side's calls during a
	// partition that must be answered in time.
	SplitAnswered float64
	// Algorithm is the rule's algorithm ("" is the default fixed window;
	// sliding_window and token_bucket are ringlimit's extensions). With an
	// hour unit and burst = limit, none of them allows more than the limit
	// per key in one hour window over a run this short, so the same checks
	// hold.
	Algorithm string
	// Args are extra serve flags for every node (e.g. --replicas 2).
	Args []string
	// DumpDir, when set, receives each scenario's calls as <name>.csv.
	DumpDir string
}

// ShortParams is the version plain `go test` runs: fewer keys, shorter
// faults, generous timing bounds.
func ShortParams() Params {
	return Params{
		Keys: 12, Limit: 50, Rate: 400, PrimeRate: 800, Workers: 8, ConnsPerNode: 2, Deadline: 20 * time.Millisecond,
		Hold: time.Second, Freeze: 3 * time.Second, Partition: 8 * time.Second,
		Tolerance: 0.05,
		P99Bound:  250 * time.Millisecond, RejoinBound: 20 * time.Second, MergeBound: 45 * time.Second,
		SplitAnswered: 0.5,
	}
}

// FullParams is the suite of the chaos report.
func FullParams() Params {
	return Params{
		Full: true,
		Keys: 30, Limit: 50, Rate: 1500, PrimeRate: 1500, Workers: 16, ConnsPerNode: 4, Deadline: 20 * time.Millisecond,
		Hold: 5 * time.Second, Freeze: 10 * time.Second, Partition: 30 * time.Second,
		Tolerance: 0.05,
		P99Bound:  20 * time.Millisecond, RejoinBound: 2 * time.Second, MergeBound: 5 * time.Second,
		SplitAnswered: 0.99,
	}
}

// Suite runs chaos scenarios against a ringlimit binary.
type Suite struct {
	Bin  string
	P    Params
	Logf func(format string, args ...any) // progress; nil is silent
}

// Scenario is one fault story with its checks.
type Scenario struct {
	Name string
	// NeedsNetns is set when the scenario runs in network namespaces.
	NeedsNetns bool
	Run        func(s *Suite, dir string) *Result
}

// Scenarios lists the suite in the order of the report.
// The full suite also runs kill-restart-roll with a token_bucket and a
// sliding_window rule, whose state replicates and hands off like a fixed
// window's.
func (s *Suite) Scenarios() []Scenario {
	scs := []Scenario{
		{Name: "kill-restart-roll", Run: (*Suite).killRestartRoll},
		{Name: "freeze-owner", Run: (*Suite).freezeOwner},
		{Name: "scale-out-in", Run: (*Suite).scaleOutIn},
		{Name: "partition", NeedsNetns: true, Run: (*Suite).partition},
	}
	if s.P.Full {
		for _, alg := range []string{"token_bucket", "sliding_window"} {
			scs = append(scs, Scenario{Name: "kill-restart-roll-" + alg, Run: func(s *Suite, dir string) *Result {
				c := *s
				c.P.Algorithm = alg
				return c.killRestartRoll(dir)
			}})
		}
	}
	return scs
}

// Result is the outcome of one scenario: a total row, one row per phase,
// and the checks that failed.
type Result struct {
	Name     string
	Skipped  string // why it did not run
	Total    Row
	Phases   []Row
	Failures []string
	Notes    []string
}

// Row is one line of the report.
type Row struct {
	Name         string
	Stats        Stats // every call
	Allowed      int   // OK answers (total row only)
	Budget       int   // limit x key-windows (total row only)
	Extra        int   // OK answers beyond the limit
	Overshoot    float64
	Early        int           // hits refused before the limit (total row only)
	Recover      time.Duration // see RecoverWhat; 0 if not measured
	RecoverWhat  string
	P99Survivors time.Duration // p99 of calls to nodes not under a fault
	Crashes      int
}

// hourConfigFor is the rate limit config of every scenario: limit per hour
// for each value of key k, with algorithm ("" is the default).
func hourConfigFor(limit int, algorithm string) string {
	cfg := fmt.Sprintf("domain: chaos\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: %d\n", limit)
	if algorithm != "" {
		cfg += "      algorithm: " + algorithm + "\n"
	}
	return cfg
}

// run is the state of one scenario while it runs.
type run struct {
	s      *Suite
	res    *Result
	c      *Cluster
	load   *Load
	faulty map[string]map[string]bool // phase -> node IDs under a fault
	recov  map[string]time.Duration
	what   map[string]string
	after  []func(rec *Record, counts Counts) // checks that need the record
	began  time.Time
}

// logf reports progress, prefixed with the scenario and its elapsed time.
func (r *run) logf(format string, args ...any) {
	r.s.logf("%6.2fs %s: %s", time.Since(r.began).Seconds(), r.res.Name, fmt.Sprintf(format, args...))
}

func (s *Suite) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// newRun lays out a cluster of n nodes in dir (through place, or on
// loopback when place is nil), starts it and waits for one ring.
func (s *Suite) newRun(name, dir string, n int, place func(*Cluster) (*Node, error)) (*run, error) {
	r := &run{s: s, res: &Result{Name: name}, began: time.Now(), faulty: map[string]map[string]bool{}, recov: map[string]time.Duration{}, what: map[string]string{}}
	cfgDir := filepath.Join(dir, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, err
	}
	if err := ConfigMapDir(cfgDir, map[string]string{"config.yaml": hourConfigFor(s.P.Limit, s.P.Algorithm)}); err != nil {
		return nil, err
	}
	// A port taken by another process between the layout and the start is
	// a reason to lay the cluster out again, not a failure of ringlimit.
	for attempt := 1; ; attempt++ {
		err := r.startCluster(dir, cfgDir, n, place, attempt)
		if err == nil {
			r.logf("%d nodes up, one ring", n)
			return r, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		r.logf("setup attempt %d: a port was taken; laying the cluster out again", attempt)
	}
}

// startCluster lays out n nodes, starts them and waits for one ring; on an
// error every process is stopped.
func (r *run) startCluster(dir, cfgDir string, n int, place func(*Cluster) (*Node, error), attempt int) error {
	logs := filepath.Join(dir, fmt.Sprintf("logs-%d", attempt))
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	r.c = &Cluster{Bin: r.s.Bin, Dir: logs, Config: cfgDir, Args: r.s.P.Args}
	for i := 0; i < n; i++ {
		if _, err := r.addNode(place); err != nil {
			return err
		}
	}
	if err := r.c.StartAll(30 * time.Second); err != nil {
		r.c.Close()
		return err
	}
	if err := WaitRing(30*time.Second, r.c.Nodes, r.c.Nodes); err != nil {
		r.c.Close()
		return err
	}
	return nil
}

func (r *run) addNode(place func(*Cluster) (*Node, error)) (*Node, error) {
	if place != nil {
		return place(r.c)
	}
	return r.c.AddNode("127.0.0.1")
}

// primeFraction is how far a scenario uses its keys before a fault: enough
// that a counter lost with its owner shows, once the keys are exhausted,
// as overshoot far over the tolerance, and far enough from the limit that
// no key is exhausted (and its OVER_LIMIT remembered) when the fault
// strikes.
const primeFraction = 0.6

// startLoad warms the peer connections up, then starts the fleet on every
// node and uses every key of the first generation to primeFraction of its
// limit.
func (r *run) startLoad() error {
	p := r.s.P
	cfg := LoadConfig{
		Domain: "chaos", DescriptorKey: "k", Keys: p.Keys, Unit: time.Hour, ClockWindows: p.Algorithm != "",
		ConnsPerNode: p.ConnsPerNode, Workers: p.Workers, Deadline: p.Deadline, Rate: p.PrimeRate,
		MaxCalls: int64(p.Rate*600) + 100_000, MaxDuration: 10 * time.Minute, Seed: 1,
	}
	// Warm-up on other keys: every node dials its peers on first use, and a
	// cold dial inside a 20 ms deadline is a startup artefact, not a fault.
	warm := cfg
	warm.KeyPrefix, warm.Keys, warm.MaxCalls, warm.ConnsPerNode, warm.Rate = "warm-", 64, 300, 1, p.Rate
	w, err := StartLoad(warm, r.c.Nodes)
	if err != nil {
		return err
	}
	err = poll(30*time.Second, func() (bool, string) {
		return w.Calls() >= warm.MaxCalls, fmt.Sprintf("warm-up made %d of %d calls", w.Calls(), warm.MaxCalls)
	})
	ws := Summarise(w.Stop().Calls)
	if err != nil {
		return err
	}
	r.logf("warm-up: %d calls, %d late, %d failed, p99 %v", ws.Calls, ws.Late, ws.Failed, ws.P99)
	l, err := StartLoad(cfg, r.c.Nodes)
	if err != nil {
		return err
	}
	r.load = l
	l.Mark("prime")
	return r.prime()
}

// prime hits the current keys at the priming rate until they are used to
// primeFraction of their limit on average, then returns to the steady rate.
func (r *run) prime() error {
	p := r.s.P
	r.load.SetRate(p.PrimeRate)
	defer r.load.SetRate(p.Rate)
	if err := r.load.WaitUsed(primeFraction*float64(p.Limit), 60*time.Second); err != nil {
		return err
	}
	r.logf("keys used to %.0f%% after %d calls", 100*primeFraction, r.load.Calls())
	return nil
}

// freshKeys readies the next fault: it waits until the keys hit so far are
// exhausted (so their overshoot, if any, is in the record), then moves the
// load to fresh keys and primes them.
func (r *run) freshKeys() error {
	if err := r.exhaust(); err != nil {
		return err
	}
	if err := r.load.NextKeys(); err != nil {
		return err
	}
	return r.prime()
}

// exhaust waits until every current key has been refused at least once.
func (r *run) exhaust() error {
	return r.load.WaitExhausted(60 * time.Second)
}

// phase starts a phase; the nodes given are under a fault during it.
func (r *run) phase(name string, faulty ...*Node) {
	r.load.Mark(name)
	m := map[string]bool{}
	for _, n := range faulty {
		m[n.ID] = true
	}
	r.faulty[name] = m
	r.logf("phase %s", name)
}

// recovered records a phase's time to recover.
func (r *run) recovered(phase, what string, d time.Duration) {
	r.recov[phase], r.what[phase] = d, what
	r.logf("%s: %s %v", phase, what, d.Round(time.Millisecond))
}

func (r *run) failf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.res.Failures = append(r.res.Failures, msg)
	r.logf("FAIL: %s", msg)
}

func (r *run) notef(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.res.Notes = append(r.res.Notes, msg)
	r.logf("%s", msg)
}

// hold keeps the load running for d, a step of the scenario's timeline,
// polling for a process that died on its own.
func (r *run) hold(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if len(r.c.Crashes()) > 0 {
			return
		}
		time.Sleep(min(100*time.Millisecond, time.Until(end))) // the timeline, not a sync
	}
}

// waitRing waits until every node of nodes sees exactly want, and returns
// how long it took from since.
func (r *run) waitRing(since time.Time, timeout time.Duration, nodes, want []*Node) (time.Duration, error) {
	err := WaitRing(timeout, nodes, want)
	return time.Since(since), err
}

// stopNode takes n out of the fleet's targets, lets its calls drain and
// stops it gracefully (SIGTERM); the exit must be clean.
func (r *run) stopNode(n *Node, targets []*Node, retire bool) error {
	if err := r.load.SetTargets(targets); err != nil {
		return err
	}
	if err := r.load.Drain(n, 5*time.Second); err != nil {
		return err
	}
	timeout := 30 * time.Second
	var err error
	if retire {
		err = r.c.Retire(n, timeout)
	} else {
		err = n.Stop(timeout)
	}
	if err != nil {
		return err
	}
	if e := n.ExitErr(); e != nil {
		r.failf("%s: exit after SIGTERM: %v (want status 0)", n.ID, e)
	}
	return nil
}

// finish stops the load and the cluster and computes the rows and the
// checks common to every scenario.
func (r *run) finish() *Result {
	var rec *Record
	if r.load != nil {
		if len(r.res.Failures) == 0 && len(r.c.Crashes()) == 0 {
			if err := r.exhaust(); err != nil {
				r.failf("the last keys: %v", err)
			}
		}
		rec = r.load.Stop()
	}
	crashes := r.c.Crashes()
	if dd := r.s.P.DumpDir; dd != "" && rec != nil {
		if f, err := os.Create(filepath.Join(dd, r.res.Name+".csv")); err == nil {
			rec.WriteCSV(f)
			f.Close()
		}
	}
	r.logf("load stopped; stopping the cluster")
	for _, e := range r.c.StopAll(30 * time.Second) {
		r.failf("stopping the cluster: %s", e)
	}
	r.c.Close()
	r.logf("cluster stopped")
	if rec == nil {
		return r.res
	}
	p := r.s.P
	counts := rec.Tally(p.Limit)
	total := Summarise(rec.Calls)
	r.res.Total = Row{
		Name: r.res.Name, Stats: total,
		Allowed: counts.Allowed(), Budget: counts.Budget(), Extra: counts.TotalExtra(),
		Early: counts.Early, Crashes: len(crashes),
		P99Survivors: Summarise(r.survivorCalls(rec, 0, rec.Duration+time.Hour)).P99,
	}
	r.res.Total.Overshoot = pct(r.res.Total.Extra, r.res.Total.Budget)
	for _, m := range rec.Marks {
		from, to, _ := rec.Phase(m.Name)
		row := Row{
			Name: m.Name, Stats: Summarise(rec.Span(from, to, nil)),
			Extra: counts.Extra[m.Name], Recover: r.recov[m.Name], RecoverWhat: r.what[m.Name],
			P99Survivors: Summarise(r.survivorCalls(rec, from, to)).P99,
		}
		row.Overshoot = pct(row.Extra, r.res.Total.Budget)
		r.res.Phases = append(r.res.Phases, row)
	}
	for _, rec := range r.recov {
		r.res.Total.Recover = max(r.res.Total.Recover, rec)
	}
	if f := total.Failed; f > 0 {
		codes := map[string]int{}
		for _, c := range rec.Calls {
			if c.Outcome == OutcomeFailed {
				codes[c.Code.String()+" from "+rec.Nodes[c.Node]]++
			}
		}
		r.failf("%d calls failed (errors other than the deadline): %v", f, codes)
	}
	if len(crashes) > 0 {
		r.failf("processes died on their own: %v", crashes)
	}
	if r.res.Total.Overshoot > 100*p.Tolerance && !r.splitAllowed() {
		r.failf("overshoot %.1f%% (%d extra of %d allowed) is over the %.0f%% tolerance", r.res.Total.Overshoot, r.res.Total.Extra, r.res.Total.Budget, 100*p.Tolerance)
	}
	if m, bound := counts.MaxExtra(), maxKeyExtra(p.Limit); m > bound && !r.splitAllowed() {
		r.failf("a key was allowed %d more than its limit of %d in one window (bound %d): its counter was lost or split", m, p.Limit, bound)
	}
	if e := pct(counts.Early, counts.Budget()); e > 100*p.Tolerance {
		r.failf("%d hits (%.1f%%) were refused before their key reached the limit", counts.Early, e)
	}
	if counts.Allowed() < counts.Budget()*95/100 {
		r.notef("only %d of %d allowed: some key-windows were not exhausted", counts.Allowed(), counts.Budget())
	}
	for _, f := range r.after {
		f(rec, counts)
	}
	return r.res
}

// maxKeyExtra is the most one key may be allowed beyond its limit in one
// window outside a partition: the hits of one replication interval lost
// with a killed owner, a token bucket's refill over the run, calls in
// flight together, and the smaller part of the hits counted on two nodes
// while a joining or leaving node's ring change spreads (merged by
// maximum; see docs/consistency.md). A counter lost or reset at
// primeFraction of its limit shows as three times this bound.
func maxKeyExtra(limit int) int { return max(3, limit/5) }

// splitAllowed reports whether the scenario partitions the cluster, where
// each side may allow a key's limit once more.
func (r *run) splitAllowed() bool { _, ok := r.faulty["split"]; return ok }

// survivorCalls are the calls in [from, to) to nodes not under a fault in
// the phase the call completed in.
func (r *run) survivorCalls(rec *Record, from, to time.Duration) []Call {
	var out []Call
	for _, c := range rec.Span(from, to, nil) {
		ph := ""
		for _, m := range rec.Marks {
			if m.At <= c.End() {
				ph = m.Name
			}
		}
		if !r.faulty[ph][rec.Nodes[c.Node]] {
			out = append(out, c)
		}
	}
	return out
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// debugView is the part of /debug/cluster the suite reads.
type debugView struct {
	Ring    []string `json:"ring"`
	Members []struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Suspect bool   `json:"suspect"`
	} `json:"members"`
}

func (n *Node) debugView() (debugView, error) {
	var v debugView
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + n.Debug + "/debug/cluster")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v, err
}

// suspects reports whether n currently sees id as suspect, not alive, or
// off its ring.
func (n *Node) suspects(id string) bool {
	v, err := n.debugView()
	if err != nil {
		return false
	}
	in := false
	for _, m := range v.Ring {
		in = in || m == id
	}
	if !in {
		return true
	}
	for _, m := range v.Members {
		if m.ID == id && (m.Suspect || m.State != "alive") {
			return true
		}
	}
	return false
}

// ringOf returns n's ring as a sorted, comma-joined string.
func ringOf(n *Node) string {
	got, err := n.RingMembers()
	if err != nil {
		return "unreachable"
	}
	sort.Strings(got)
	return strings.Join(got, ",")
}

func ids(nodes []*Node) string {
	var s []string
	for _, n := range nodes {
		s = append(s, n.ID)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

func without(nodes []*Node, drop *Node) []*Node {
	var out []*Node
	for _, n := range nodes {
		if n != drop {
			out = append(out, n)
		}
	}
	return out
}
