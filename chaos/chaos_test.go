package chaos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	chaosFull   = flag.Bool("chaos.full", false, "run the full chaos suite (also RINGLIMIT_CHAOS=full)")
	chaosReport = flag.String("chaos.report", "", "write the suite's report as Markdown to this file (also RINGLIMIT_CHAOS_REPORT)")
	chaosArgs   = flag.String("chaos.args", "", "extra serve flags for every node, space-separated (also RINGLIMIT_CHAOS_ARGS)")
)

// chaosParams picks the short or the full suite from the flags and env.
func chaosParams() Params {
	p := ShortParams()
	if *chaosFull || os.Getenv("RINGLIMIT_CHAOS") == "full" {
		p = FullParams()
	}
	args := *chaosArgs
	if args == "" {
		args = os.Getenv("RINGLIMIT_CHAOS_ARGS")
	}
	p.Args = strings.Fields(args)
	p.DumpDir = os.Getenv("RINGLIMIT_CHAOS_DUMP")
	return p
}

// TestChaos runs every scenario of the suite against real processes and
// prints the report table. Plain `go test` runs the short version;
// `-chaos.full` (or RINGLIMIT_CHAOS=full) the full one.
func TestChaos(t *testing.T) {
	p := chaosParams()
	if testing.Short() && !p.Full {
		t.Skip("chaos suite skipped in -short mode")
	}
	start := time.Now()
	s := &Suite{Bin: testBin, P: p, Logf: t.Logf}
	var results []*Result
	for _, sc := range s.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			s := *s
			s.Logf = t.Logf
			res := sc.Run(&s, t.TempDir())
			results = append(results, res)
			if res.Skipped != "" {
				t.Skip(res.Skipped)
			}
			for _, f := range res.Failures {
				t.Error(f)
			}
		})
	}
	mode := "short"
	if p.Full {
		mode = "full"
	}
	table := FormatTable(results, false)
	fmt.Printf("\nchaos suite (%s, %v, serve args %q):\n%s", mode, time.Since(start).Round(time.Second), p.Args, table)
	path := *chaosReport
	if path == "" {
		path = os.Getenv("RINGLIMIT_CHAOS_REPORT")
	}
	if path != "" {
		md := fmt.Sprintf("Suite: %s, %d keys, limit %d/hour, %.0f calls/s from %d workers over %d connections per node, %v deadline; serve args %q; took %v.\n\n%s",
			mode, p.Keys, p.Limit, p.Rate, p.Workers, p.ConnsPerNode, p.Deadline, p.Args, time.Since(start).Round(time.Second), FormatTable(results, true))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// TestChaosDetectsLostCounters checks the checker: with replication off
// (--replicas 1) a SIGKILLed owner takes its keys' counts with it, and the
// kill scenario must fail on them. Before each fault took fresh, partly used
// keys, it passed, because exhausted keys are answered from the owner's
// remembered OVER_LIMIT.
func TestChaosDetectsLostCounters(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos suite skipped in -short mode")
	}
	p := ShortParams()
	p.Args = []string{"--replicas", "1"}
	s := &Suite{Bin: testBin, P: p, Logf: t.Logf}
	res := s.killRestartRoll(t.TempDir())
	for _, f := range res.Failures {
		if strings.Contains(f, "more than its limit") {
			return
		}
	}
	t.Fatalf("kill-restart-roll without replication: failures %q, want a key allowed more than its limit", res.Failures)
}
