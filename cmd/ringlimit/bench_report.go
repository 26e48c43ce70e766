package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// benchPercentiles are the latency distribution's lines, as hey prints
// them, plus 99.9.
var benchPercentiles = [...]float64{10, 25, 50, 75, 90, 95, 99, 99.9}

// histLines is how many lines the response-time histogram has (hey: 11).
const histLines = 11

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pctLabel prints 99.9 as "99.9" and 50 as "50".
func pctLabel(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) }

// writeBenchText prints r in the shape of hey's report: summary, response
// time histogram, latency distribution, status and error distributions.
func writeBenchText(w io.Writer, r *benchResult) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	title := "Summary:"
	if r.Label != "" {
		title = "Summary (" + r.Label + "):"
	}
	p("\n%s\n", title)
	writeBenchLoad(w, r.Load)
	p("  Total:\t%.4f secs\n", r.Total.Seconds())
	p("  Slowest:\t%.3f ms\n", ms(r.hist.slowest()))
	p("  Fastest:\t%.3f ms\n", ms(r.hist.fastest()))
	p("  Average:\t%.3f ms\n", ms(r.hist.mean()))
	p("  Requests/sec:\t%.2f\n", r.callsPerSec())
	p("  Calls:\t%d to %d target(s) over %d connection(s), %d concurrent", r.calls(), len(r.Targets), r.Connections, r.Concurrency)
	if r.Interrupted {
		p(" (interrupted)")
	}
	p("\n")
	if len(r.ServerPIDs) > 0 {
		p("  Server CPU:\t%.1f us per call (user + system of %d process(es), %.2f s)\n", r.serverCPUPerCall(), len(r.ServerPIDs), r.ServerCPU.Seconds())
		p("  Load tool CPU:\t%.1f us per call (%.2f s)\n", perCallUS(r.ClientCPU, r.calls()), r.ClientCPU.Seconds())
	}

	p("\nResponse time histogram (ms):\n")
	bars := r.hist.linear(histLines)
	var top uint64
	for _, b := range bars {
		top = max(top, b.Count)
	}
	width := 0
	for _, b := range bars {
		width = max(width, len(strconv.FormatUint(b.Count, 10)))
	}
	for _, b := range bars {
		n := 0
		if top > 0 {
			n = int((b.Count*40 + top - 1) / top)
		}
		p("  %8.3f [%*d]\t|%s\n", ms(b.Mark), width, b.Count, strings.Repeat("■", n))
	}

	p("\nLatency distribution:\n")
	for _, q := range benchPercentiles {
		p("  %s%% in %.3f ms\n", pctLabel(q), ms(r.hist.quantile(q/100)))
	}

	p("\nStatus distribution:\n")
	line := func(name string, n uint64, note string) { p("  %-21s %d responses%s\n", "["+name+"]", n, note) }
	line("OK", r.OK, "")
	line("OVER_LIMIT", r.OverLimit, "")
	if r.Unknown > 0 {
		line("UNKNOWN", r.Unknown, "")
	}
	line("errors", r.Errors, "")
	note := ""
	if r.Deadline > 0 {
		note = fmt.Sprintf(" (no answer within %v: Envoy fails open)", r.Deadline)
	}
	line("deadline exceeded", r.DeadlineExceeded, note)
	if l := r.Limits; l != nil {
		p("\nLimits (per key and window, warmup included):\n")
		p("  Key-windows:\t%d\n", l.KeyWindows)
		p("  Budget:\t%d hits (answered hits up to each window's limit)\n", l.Budget)
		p("  Early refusals:\t%d hits (%.2f%% of the budget: refused before their window reached its limit)\n", l.Early, 100*l.earlyShare())
		p("  Over the limit:\t%d hits (allowed beyond their window's limit)\n", l.Over)
	}
	if len(r.ErrorCodes) > 0 {
		p("\nError distribution:\n")
		for _, e := range r.ErrorCodes {
			p("  [%d]\t%s: %s\n", e.Count, e.Code, e.Message)
		}
	}
	if len(r.Targets) > 1 {
		p("\nTargets:\n")
		for i, t := range r.Targets {
			p("  %s\t%d calls\n", t, r.PerTarget[i])
		}
	}
}

// writeBenchLoad prints what the run sent, at the top of the summary.
func writeBenchLoad(w io.Writer, l benchLoad) {
	fmt.Fprintf(w, "  Domain:\t%s\n", l.Domain)
	for _, d := range l.Descriptors {
		fmt.Fprintf(w, "  Descriptor:\t%s\n", d)
	}
	hits := "1 (hits_addend 0)"
	if l.HitsAddend > 0 {
		hits = strconv.FormatUint(uint64(l.HitsAddend), 10)
	}
	fmt.Fprintf(w, "  Hits/call:\t%s\n", hits)
	dist := l.Dist
	if l.Dist == "zipf" {
		dist = fmt.Sprintf("zipf (s=%g, key 0 the hottest)", l.ZipfS)
	}
	fmt.Fprintf(w, "  Keys:\t%d, %s, seed %d ({ip} and {key} take one per call)\n", l.Keys, dist, l.Seed)
}

// benchJSON is the --json report. Times are in milliseconds unless the
// name says seconds; every counted call is in exactly one status field.
type benchJSON struct {
	Label       string         `json:"label,omitempty"`
	Load        benchLoad      `json:"load"`
	Targets     []targetJSON   `json:"targets"`
	Concurrency int            `json:"concurrency"`
	Connections int            `json:"connections"`
	DeadlineMS  float64        `json:"deadline_ms"`
	Interrupted bool           `json:"interrupted,omitempty"`
	Summary     summaryJSON    `json:"summary"`
	Status      statusJSON     `json:"status"`
	Errors      []errorJSON    `json:"errors,omitempty"`
	Histogram   []histBarJSON  `json:"histogram"`
	Latency     []latencyJSON  `json:"latency"`
	Limits      *limitsJSON    `json:"limits,omitempty"`     // with --limits
	ServerCPU   *serverCPUJSON `json:"server_cpu,omitempty"` // with --server-pids
}

// limitsJSON is --limits' accounting; hits, summed over key-windows.
type limitsJSON struct {
	KeyWindows    uint64  `json:"key_windows"`
	BudgetHits    uint64  `json:"budget_hits"`    // min(limit, answered hits) per key-window
	EarlyRefusals uint64  `json:"early_refusals"` // refused before the key-window reached its limit
	EarlyShare    float64 `json:"early_share"`    // early_refusals / budget_hits
	OverLimitHits uint64  `json:"over_limit_hits"`
}

// serverCPUJSON is the servers' CPU time during the measured calls, and
// the load tool's own beside it.
type serverCPUJSON struct {
	PIDs              []int   `json:"pids"`
	Seconds           float64 `json:"seconds"`
	USPerCall         float64 `json:"us_per_call"`
	LoadToolUSPerCall float64 `json:"load_tool_us_per_call"`
}

type targetJSON struct {
	Addr  string `json:"addr"`
	Calls uint64 `json:"calls"`
}

type summaryJSON struct {
	Calls        uint64  `json:"calls"`
	TotalSeconds float64 `json:"total_seconds"`
	SlowestMS    float64 `json:"slowest_ms"`
	FastestMS    float64 `json:"fastest_ms"`
	AverageMS    float64 `json:"average_ms"`
	CallsPerSec  float64 `json:"calls_per_sec"`
}

type statusJSON struct {
	OK               uint64 `json:"ok"`
	OverLimit        uint64 `json:"over_limit"`
	Unknown          uint64 `json:"unknown"`
	Errors           uint64 `json:"errors"`
	DeadlineExceeded uint64 `json:"deadline_exceeded"`
}

type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Count   uint64 `json:"count"`
}

type histBarJSON struct {
	MarkMS float64 `json:"mark_ms"`
	Count  uint64  `json:"count"`
}

type latencyJSON struct {
	Percentile float64 `json:"percentile"`
	MS         float64 `json:"ms"`
}

// toJSON is r's --json report.
func (r *benchResult) toJSON() benchJSON {
	j := benchJSON{
		Label: r.Label, Load: r.Load, Concurrency: r.Concurrency, Connections: r.Connections,
		DeadlineMS: ms(r.Deadline), Interrupted: r.Interrupted,
		Summary: summaryJSON{
			Calls: r.calls(), TotalSeconds: r.Total.Seconds(),
			SlowestMS: ms(r.hist.slowest()), FastestMS: ms(r.hist.fastest()), AverageMS: ms(r.hist.mean()),
			CallsPerSec: r.callsPerSec(),
		},
		Status:    statusJSON{OK: r.OK, OverLimit: r.OverLimit, Unknown: r.Unknown, Errors: r.Errors, DeadlineExceeded: r.DeadlineExceeded},
		Histogram: []histBarJSON{},
	}
	for i, t := range r.Targets {
		j.Targets = append(j.Targets, targetJSON{Addr: t, Calls: r.PerTarget[i]})
	}
	for _, e := range r.ErrorCodes {
		j.Errors = append(j.Errors, errorJSON{Code: e.Code.String(), Message: e.Message, Count: e.Count})
	}
	for _, b := range r.hist.linear(histLines) {
		j.Histogram = append(j.Histogram, histBarJSON{MarkMS: ms(b.Mark), Count: b.Count})
	}
	for _, q := range benchPercentiles {
		j.Latency = append(j.Latency, latencyJSON{Percentile: q, MS: ms(r.hist.quantile(q / 100))})
	}
	if l := r.Limits; l != nil {
		j.Limits = &limitsJSON{KeyWindows: l.KeyWindows, BudgetHits: l.Budget, EarlyRefusals: l.Early, EarlyShare: l.earlyShare(), OverLimitHits: l.Over}
	}
	if len(r.ServerPIDs) > 0 {
		j.ServerCPU = &serverCPUJSON{PIDs: r.ServerPIDs, Seconds: r.ServerCPU.Seconds(), USPerCall: r.serverCPUPerCall(),
			LoadToolUSPerCall: perCallUS(r.ClientCPU, r.calls())}
	}
	return j
}

// serverCPUPerCall is the servers' CPU time per counted call, in
// microseconds.
func (r *benchResult) serverCPUPerCall() float64 { return perCallUS(r.ServerCPU, r.calls()) }

// perCallUS is d over calls, in microseconds (0 without calls).
func perCallUS(d time.Duration, calls uint64) float64 {
	if calls == 0 {
		return 0
	}
	return float64(d) / float64(time.Microsecond) / float64(calls)
}

// writeBenchJSON prints r's --json report, indented, with a final newline.
func writeBenchJSON(w io.Writer, r *benchResult) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r.toJSON())
}

// percentileMS is the latency at percentile p of a --json report, or NaN.
func (j *benchJSON) percentileMS(p float64) float64 {
	for _, l := range j.Latency {
		if l.Percentile == p {
			return l.MS
		}
	}
	return math.NaN()
}

// compareRow is one setup in a --compare table: the median of its runs.
type compareRow struct {
	Label               string
	Runs                int
	CallsPerSec         float64
	P50, P99, P999      float64     // ms
	Errors, DeadlineExc uint64      // summed over runs
	Calls               uint64      // summed over runs
	CPUPerCall          float64     // us, median over the runs that report it; NaN: none does
	Limits              *limitCount // summed over the runs that report it; nil: none does
}

// median of xs (NaN when empty); xs is sorted in place.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// compareRows groups reports by label, in order of first appearance, and
// takes the median of each number over a label's runs (medians taken one
// number at a time, as the seed's "medians of three runs").
func compareRows(reports []benchJSON) []compareRow {
	var order []string
	groups := map[string][]benchJSON{}
	for _, r := range reports {
		if _, ok := groups[r.Label]; !ok {
			order = append(order, r.Label)
		}
		groups[r.Label] = append(groups[r.Label], r)
	}
	var rows []compareRow
	for _, label := range order {
		g := groups[label]
		row := compareRow{Label: label, Runs: len(g)}
		var cps, p50, p99, p999, cpu []float64
		for _, r := range g {
			if r.ServerCPU != nil {
				cpu = append(cpu, r.ServerCPU.USPerCall)
			}
			if l := r.Limits; l != nil && l.KeyWindows > 0 { // a server that states no limits has nothing to count
				if row.Limits == nil {
					row.Limits = new(limitCount)
				}
				row.Limits.add(limitCount{KeyWindows: l.KeyWindows, Budget: l.BudgetHits, Early: l.EarlyRefusals, Over: l.OverLimitHits})
			}
			cps = append(cps, r.Summary.CallsPerSec)
			p50 = append(p50, r.percentileMS(50))
			p99 = append(p99, r.percentileMS(99))
			p999 = append(p999, r.percentileMS(99.9))
			row.Errors += r.Status.Errors + r.Status.Unknown
			row.DeadlineExc += r.Status.DeadlineExceeded
			row.Calls += r.Summary.Calls
		}
		row.CallsPerSec, row.P50, row.P99, row.P999 = median(cps), median(p50), median(p99), median(p999)
		row.CPUPerCall = median(cpu)
		rows = append(rows, row)
	}
	return rows
}

// writeCompare prints rows as a table with ratios to the first row (the
// floor; the ratio column says "x first" when the first label does not
// start with "floor"). When any row has them, the servers' CPU per call
// and the limit accounting (early refusals summed over the runs, as a
// share of their budget, and hits over the limit) are added as columns.
func writeCompare(w io.Writer, rows []compareRow) {
	if len(rows) == 0 {
		return
	}
	base := rows[0]
	xname := "x floor"
	if !strings.HasPrefix(base.Label, "floor") {
		xname = "x first"
	}
	var withCPU, withLimits bool
	for _, r := range rows {
		withCPU = withCPU || !math.IsNaN(r.CPUPerCall)
		withLimits = withLimits || r.Limits != nil
	}
	ratio := func(a, b float64) string {
		if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	lw := len("setup")
	for _, r := range rows {
		lw = max(lw, len(r.Label))
	}
	fmt.Fprintf(w, "%-*s %4s %10s %8s %9s %9s %9s %8s %9s %9s", lw, "setup", "runs", "calls/s", xname, "p50 ms", "p99 ms", "p99.9 ms", "p99 x", "fail-open", "errors")
	if withCPU {
		fmt.Fprintf(w, " %11s", "cpu us/call")
	}
	if withLimits {
		fmt.Fprintf(w, " %8s %8s %8s", "early", "early %", "over")
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "%-*s %4d %10.0f %8s %9.3f %9.3f %9.3f %8s %9d %9d", lw, r.Label, r.Runs, r.CallsPerSec,
			ratio(r.CallsPerSec, base.CallsPerSec), r.P50, r.P99, r.P999, ratio(r.P99, base.P99), r.DeadlineExc, r.Errors)
		if withCPU {
			if math.IsNaN(r.CPUPerCall) {
				fmt.Fprintf(w, " %11s", "-")
			} else {
				fmt.Fprintf(w, " %11.1f", r.CPUPerCall)
			}
		}
		if withLimits {
			if l := r.Limits; l != nil {
				fmt.Fprintf(w, " %8d %7.2f%% %8d", l.Early, 100*l.earlyShare(), l.Over)
			} else {
				fmt.Fprintf(w, " %8s %8s %8s", "-", "-", "-")
			}
		}
		fmt.Fprintln(w)
	}
}

// readReports reads --json reports from files.
func readReports(paths []string) ([]benchJSON, error) {
	var out []benchJSON
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("bench: --compare: %w", err)
		}
		var j benchJSON
		if err := json.Unmarshal(b, &j); err != nil {
			return nil, fmt.Errorf("bench: --compare: %s: %w", p, err)
		}
		out = append(out, j)
	}
	return out, nil
}
