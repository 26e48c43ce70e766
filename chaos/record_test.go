package chaos

import (
	"strings"
	"testing"
	"time"
)

// call is a shorthand for a Call that completes at end (ms) after a 1 ms
// latency.
func call(endMs int, node, key int, win int64, o Outcome) Call {
	return Call{Start: time.Duration(endMs-1) * time.Millisecond, Latency: time.Millisecond, Node: node, Key: key, Window: win, Outcome: o}
}

func TestTally(t *testing.T) {
	ms := time.Millisecond
	rec := &Record{
		Nodes: []string{"a", "b"},
		Marks: []Mark{{"prime", 0}, {"fault", 100 * ms}, {"after", 200 * ms}},
		Calls: []Call{
			// key 0, window 1: limit 2 reached in prime, one extra in the
			// fault, one more extra after it, then refused.
			call(10, 0, 0, 1, OutcomeOK),
			call(20, 1, 0, 1, OutcomeOK),
			call(30, 0, 0, 1, OutcomeOver),
			call(110, 1, 0, 1, OutcomeOK),
			call(210, 0, 0, 1, OutcomeOK),
			call(220, 0, 0, 1, OutcomeOver),
			// key 0, window 2: a new window has its own limit.
			call(230, 0, 0, 2, OutcomeOK),
			call(240, 0, 0, 2, OutcomeOK),
			// key 1: refused after one OK and no open call: 1 refused early.
			call(40, 0, 1, 1, OutcomeOK),
			call(50, 0, 1, 1, OutcomeOver),
			// key 2: one OK and one late call may both have counted: not early.
			call(60, 1, 2, 1, OutcomeOK),
			call(70, 1, 2, 1, OutcomeLate),
			call(80, 1, 2, 1, OutcomeOver),
			call(90, 1, 2, 1, OutcomeFailed),
			// key 3: refused at once, though it makes up for it later: 2 early.
			call(91, 1, 3, 1, OutcomeOver),
			call(92, 1, 3, 1, OutcomeOK),
			call(93, 1, 3, 1, OutcomeOK),
		},
	}
	// Calls must be ordered by completion, as Load.Stop leaves them.
	sortCalls(rec.Calls)
	c := rec.Tally(2)
	if got, want := len(c.Windows), 5; got != want {
		t.Fatalf("%d key-windows, want %d", got, want)
	}
	for _, tc := range []struct {
		name      string
		got, want int
	}{
		{"budget", c.Budget(), 10},
		{"allowed", c.Allowed(), 10},
		{"extra in prime", c.Extra["prime"], 0},
		{"extra in fault", c.Extra["fault"], 1},
		{"extra after", c.Extra["after"], 1},
		{"total extra", c.TotalExtra(), 2},
		{"max extra", c.MaxExtra(), 2},
		{"refused early", c.Early, 3},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	for _, w := range c.Windows {
		if w.Key == 2 && (w.OK != 1 || w.Over != 1 || w.Open != 2 || w.Short != 0) {
			t.Errorf("key 2: %+v, want 1 ok, 1 over, 2 open, not short", w)
		}
		if w.Key == 3 && w.Short != 2 {
			t.Errorf("key 3: %+v, want 2 short", w)
		}
	}

	extra := rec.PerKeyExtra(2, 100*ms, 200*ms)
	if len(extra) != 1 || extra[[2]int64{0, 1}] != 1 {
		t.Errorf("PerKeyExtra in the fault: %v, want key 0 window 1: 1", extra)
	}

	from, to, ok := rec.Phase("fault")
	if !ok || from != 100*ms || to != 200*ms {
		t.Errorf("Phase(fault) = %v, %v, %v", from, to, ok)
	}
	if _, _, ok := rec.Phase("nope"); ok {
		t.Error("Phase(nope) found")
	}
	if got := len(rec.Span(100*ms, 200*ms, nil)); got != 1 {
		t.Errorf("Span(fault) has %d calls, want 1", got)
	}
	if got := len(rec.Span(0, time.Second, func(id string) bool { return id == "b" })); got != 9 {
		t.Errorf("Span(all, node b) has %d calls, want 9", got)
	}
}

func TestSummarise(t *testing.T) {
	var calls []Call
	for i := 1; i <= 100; i++ {
		o := OutcomeOK
		switch {
		case i == 100:
			o = OutcomeLate
		case i == 99:
			o = OutcomeFailed
		case i%2 == 0:
			o = OutcomeOver
		}
		calls = append(calls, Call{Latency: time.Duration(i) * time.Millisecond, Outcome: o})
	}
	s := Summarise(calls)
	want := Stats{Calls: 100, OK: 49, Over: 49, Late: 1, Failed: 1, P50: 51 * time.Millisecond, P99: 100 * time.Millisecond, Max: 100 * time.Millisecond}
	if s != want {
		t.Errorf("Summarise = %+v\nwant        %+v", s, want)
	}
	if (Summarise(nil) != Stats{}) {
		t.Error("Summarise(nil) is not zero")
	}
}

func TestFormatTable(t *testing.T) {
	res := []*Result{
		{
			Name:   "kill",
			Total:  Row{Name: "kill", Stats: Stats{Calls: 10, OK: 5, Over: 5}, Allowed: 5, Budget: 5, P99Survivors: 1500 * time.Microsecond},
			Phases: []Row{{Name: "restart", Extra: 1, Overshoot: 20, Recover: 120 * time.Millisecond, RecoverWhat: "rejoined after"}},
		},
		{Name: "partition", Skipped: "not root"},
		{Name: "freeze", Failures: []string{"3 calls failed"}},
	}
	for _, md := range []bool{false, true} {
		out := FormatTable(res, md)
		for _, want := range []string{"5/5", "1.5 ms", "+1 (20.0%)", "120ms", "pass", "skipped: not root", "FAIL (1)", "freeze: FAILED: 3 calls failed", "recover = rejoined after 120ms"} {
			if !strings.Contains(out, want) {
				t.Errorf("markdown=%v: table lacks %q:\n%s", md, want, out)
			}
		}
		if md && !strings.HasPrefix(out, "| scenario |") {
			t.Errorf("markdown table starts with %q", strings.SplitN(out, "\n", 2)[0])
		}
	}
}

func TestLoadConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  LoadConfig
		err  string
	}{
		{"ok", LoadConfig{Domain: "d", DescriptorKey: "k", Keys: 1, Unit: time.Hour}, ""},
		{"no domain", LoadConfig{DescriptorKey: "k", Keys: 1, Unit: time.Hour}, "Domain and DescriptorKey"},
		{"no keys", LoadConfig{Domain: "d", DescriptorKey: "k", Unit: time.Hour}, "Keys must be positive"},
		{"no unit", LoadConfig{Domain: "d", DescriptorKey: "k", Keys: 1}, "Unit must be positive"},
		{"negative rate", LoadConfig{Domain: "d", DescriptorKey: "k", Keys: 1, Unit: time.Hour, Rate: -1}, "Rate must be >= 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate()
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c := tc.cfg; c.Deadline != 20*time.Millisecond || c.Workers != 8 || c.ConnsPerNode != 2 || c.KeyPrefix != "key-" {
					t.Errorf("defaults not applied: %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.HasPrefix(err.Error(), "chaos: ") {
				t.Errorf("err = %v, want one containing %q", err, tc.err)
			}
		})
	}
}
