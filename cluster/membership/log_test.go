package membership

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/cluster/clock"
	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// setClock is a clock that tells the Unix time the test sets; its timers
// are the system's.
type setClock struct {
	clock.Clock // clock.Real()
	ns          atomic.Int64
}

func (c *setClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

func TestLogWriter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line, wantMsg, wantLevel string
	}{
		{"[WARN] memberlist: Refuting a dead message\n", "memberlist: Refuting a dead message", "WARN"},
		{"[DEBUG] memberlist: Stream connection from=1.2.3.4:5\n", "memberlist: Stream connection from=1.2.3.4:5", "DEBUG"},
		{"Err: Could not set the deadline\n", "Err: Could not set the deadline", ""},
	}
	for _, tt := range tests {
		sink := &testkit.LogSink{}
		w := newLogWriter(slog.New(sink), clock.Real())
		if n, err := w.Write([]byte(tt.line)); n != len(tt.line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		recs := sink.Records()
		if len(recs) != 1 {
			t.Fatalf("%q: %d records", tt.line, len(recs))
		}
		r := recs[0]
		var level string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "memberlist_level" {
				level = a.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelDebug || r.Message != tt.wantMsg || level != tt.wantLevel {
			t.Errorf("%q: got level %v msg %q memberlist_level %q", tt.line, r.Level, r.Message, level)
		}
	}
	// Below debug nothing is formatted or emitted.
	var out strings.Builder
	w := newLogWriter(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})), clock.Real())
	if _, err := w.Write([]byte("[ERR] memberlist: x\n")); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Fatalf("logged below the handler's level: %q", out.String())
	}
}

func TestLogWriterKeyWarning(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	clk := &setClock{Clock: clock.Real()}
	clk.ns.Store(int64(time.Hour))
	w := newLogWriter(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})), clk)
	write := func() {
		t.Helper()
		if _, err := w.Write([]byte("[ERR] memberlist: failed to receive: No installed keys could decrypt the message from=1.2.3.4:7946\n")); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 { // memberlist repeats it per packet: one warning
		write()
	}
	if n := strings.Count(out.String(), "level=WARN"); n != 1 || !strings.Contains(out.String(), "gossip-key-file") {
		t.Fatalf("want one warning naming --gossip-key-file, got %q", out.String())
	}
	// keyWarnEvery later on the writer's clock, the next one warns again.
	clk.ns.Add(int64(keyWarnEvery - 1))
	write()
	if n := strings.Count(out.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d warnings before keyWarnEvery passed, want 1", n)
	}
	clk.ns.Add(1)
	write()
	if n := strings.Count(out.String(), "level=WARN"); n != 2 {
		t.Fatalf("%d warnings once keyWarnEvery passed, want 2", n)
	}
}
