package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// sampleResult is a small run with every status and two targets.
func sampleResult() *benchResult {
	h := newLatencyHist()
	for _, v := range []time.Duration{1, 1, 1, 1, 2, 2, 3, 4, 5, 10} {
		h.record(v * time.Millisecond)
	}
	return &benchResult{
		Label: "one node", Load: benchLoad{Domain: "ratelimit", Descriptors: []string{"remote_address={ip},PATH=/login", "user={key}"},
			Keys: 10000, Dist: "zipf", ZipfS: 1.1, Seed: 7}, Targets: []string{"127.0.0.1:1", "127.0.0.1:2"}, Concurrency: 4, Connections: 2,
		Deadline: 20 * time.Millisecond, Total: 2 * time.Second, hist: h,
		OK: 5, OverLimit: 2, Unknown: 0, Errors: 2, DeadlineExceeded: 1,
		ErrorCodes: []errorCount{{Code: codes.Unavailable, Message: "connection refused", Count: 2}},
		PerTarget:  []uint64{6, 4},
	}
}

func TestWriteBenchText(t *testing.T) {
	var b bytes.Buffer
	writeBenchText(&b, sampleResult())
	want := `
Summary (one node):
  Domain:	ratelimit
  Descriptor:	remote_address={ip},PATH=/login
  Descriptor:	user={key}
  Hits/call:	1 (hits_addend 0)
  Keys:	10000, zipf (s=1.1, key 0 the hottest), seed 7 ({ip} and {key} take one per call)
  Total:	2.0000 secs
  Slowest:	10.000 ms
  Fastest:	1.000 ms
  Average:	3.000 ms
  Requests/sec:	5.00
  Calls:	10 to 2 target(s) over 2 connection(s), 4 concurrent

Response time histogram (ms):
     1.000 [4]	|■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■■
     1.900 [0]	|
     2.800 [2]	|■■■■■■■■■■■■■■■■■■■■
     3.700 [1]	|■■■■■■■■■■
     4.600 [1]	|■■■■■■■■■■
     5.500 [1]	|■■■■■■■■■■
     6.400 [0]	|
     7.300 [0]	|
     8.200 [0]	|
     9.100 [0]	|
    10.000 [1]	|■■■■■■■■■■

Latency distribution:
  10% in 1.000 ms
  25% in 1.004 ms
  50% in 2.007 ms
  75% in 4.014 ms
  90% in 5.014 ms
  95% in 10.000 ms
  99% in 10.000 ms
  99.9% in 10.000 ms

Status distribution:
  [OK]                  5 responses
  [OVER_LIMIT]          2 responses
  [errors]              2 responses
  [deadline exceeded]   1 responses (no answer within 20ms: Envoy fails open)

Error distribution:
  [2]	Unavailable: connection refused

Targets:
  127.0.0.1:1	6 calls
  127.0.0.1:2	4 calls
`
	if got := b.String(); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestBenchJSONShape(t *testing.T) {
	var b bytes.Buffer
	if err := writeBenchJSON(&b, sampleResult()); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{"concurrency", "connections", "deadline_ms", "errors", "histogram", "label", "latency", "load", "status", "summary", "targets"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("top-level keys %v, want %v", keys, want)
	}
	var j benchJSON
	if err := json.Unmarshal(b.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	st := j.Status
	if sum := st.OK + st.OverLimit + st.Unknown + st.Errors + st.DeadlineExceeded; sum != j.Summary.Calls || sum != 10 {
		t.Errorf("statuses add to %d, calls %d, want 10", sum, j.Summary.Calls)
	}
	var perTarget, inHist uint64
	for _, tg := range j.Targets {
		perTarget += tg.Calls
	}
	for _, h := range j.Histogram {
		inHist += h.Count
	}
	if perTarget != 10 || inHist != 10 {
		t.Errorf("targets hold %d calls, histogram %d, want 10", perTarget, inHist)
	}
	if len(j.Latency) != len(benchPercentiles) || j.percentileMS(99.9) != 10 || j.percentileMS(50) != 2.007039 {
		t.Errorf("latency %+v", j.Latency)
	}
	if j.Summary.CallsPerSec != 5 || j.Summary.AverageMS != 3 || j.DeadlineMS != 20 {
		t.Errorf("summary %+v deadline %v", j.Summary, j.DeadlineMS)
	}
	if len(j.Errors) != 1 || j.Errors[0] != (errorJSON{Code: "Unavailable", Message: "connection refused", Count: 2}) {
		t.Errorf("errors %+v", j.Errors)
	}
}

// report is a --json report with the numbers a table reads.
func report(label string, cps, p50, p99, p999 float64, errs, dl uint64) benchJSON {
	return benchJSON{
		Label:   label,
		Summary: summaryJSON{Calls: 1000, CallsPerSec: cps},
		Status:  statusJSON{Errors: errs, DeadlineExceeded: dl},
		Latency: []latencyJSON{{50, p50}, {99, p99}, {99.9, p999}},
	}
}

func TestCompareRows(t *testing.T) {
	reports := []benchJSON{
		report("floor", 100, 1, 4, 8, 0, 0),
		report("one", 95, 1.1, 4.4, 9, 0, 1),
		report("floor", 90, 2, 5, 6, 0, 0),
		report("one", 85, 1.2, 4.2, 7, 1, 0),
		report("floor", 110, 3, 3, 7, 0, 0),
	}
	rows := compareRows(reports)
	want := []compareRow{
		{Label: "floor", Runs: 3, CallsPerSec: 100, P50: 2, P99: 4, P999: 7, Calls: 3000},
		{Label: "one", Runs: 2, CallsPerSec: 90, P50: 1.15, P99: 4.3, P999: 8, Errors: 1, DeadlineExc: 1, Calls: 2000},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows %+v", rows)
	}
	for i := range want {
		g, w := rows[i], want[i]
		close := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
		if g.Label != w.Label || g.Runs != w.Runs || !close(g.CallsPerSec, w.CallsPerSec) || !close(g.P50, w.P50) ||
			!close(g.P99, w.P99) || !close(g.P999, w.P999) || g.Errors != w.Errors || g.DeadlineExc != w.DeadlineExc || g.Calls != w.Calls {
			t.Errorf("row %d = %+v, want %+v", i, g, w)
		}
	}
	var b bytes.Buffer
	writeCompare(&b, rows)
	wantTable := `setup runs    calls/s  x floor    p50 ms    p99 ms  p99.9 ms    p99 x fail-open    errors
floor    3        100    1.00x     2.000     4.000     7.000    1.00x         0         0
one      2         90    0.90x     1.150     4.300     8.000    1.08x         1         1
`
	if b.String() != wantTable {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), wantTable)
	}
}

func TestCompareReadsFiles(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i, r := range []*benchResult{sampleResult(), sampleResult()} {
		r.Label = []string{"floor", "one node"}[i]
		var b bytes.Buffer
		if err := writeBenchJSON(&b, r); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, r.Label+".json")
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	var out, errOut bytes.Buffer
	if code := benchCmd(t.Context(), []string{"--compare", strings.Join(paths, ",")}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "floor ") || !strings.HasPrefix(lines[2], "one node ") || !strings.Contains(lines[2], " 1.00x ") {
		t.Fatalf("table:\n%s", out.String())
	}
	if code := benchCmd(t.Context(), []string{"--compare", filepath.Join(dir, "missing.json")}, &out, &errOut); code != 1 {
		t.Fatalf("missing file: exit %d", code)
	}
}
