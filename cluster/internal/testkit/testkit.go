// Package testkit holds what the tests of the cluster packages share: a
// bounded wait, a log sink, and a loopback gRPC server that stops with the
// test. It is for tests only. Its functions are safe for concurrent use;
// a LogSink is too.
package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

// WaitFor polls cond every 5 ms until it holds, failing the test after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// Listen returns a TCP listener on a free loopback port.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// Serve serves srv on lis until the test ends, then stops srv and waits
// for Serve to return.
func Serve(t testing.TB, srv *grpc.Server, lis net.Listener) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
}

// LogSink is a slog.Handler that keeps records in memory (never t.Log:
// memberlist may log after a test has finished).
type LogSink struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (s *LogSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *LogSink) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *LogSink) WithGroup(string) slog.Handler            { return s }

func (s *LogSink) Handle(_ context.Context, r slog.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, r.Clone())
	return nil
}

// Records returns a copy of the records kept so far.
func (s *LogSink) Records() []slog.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]slog.Record(nil), s.recs...)
}

// Dump returns the records as text, for diagnosing a failed test.
func (s *LogSink) Dump() string {
	var b strings.Builder
	for _, r := range s.Records() {
		fmt.Fprintf(&b, "%s %v %s", r.Time.Format("15:04:05.000"), r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}

// Count returns how many records at level have a message containing msg.
func (s *LogSink) Count(level slog.Level, msg string) int {
	n := 0
	for _, r := range s.Records() {
		if r.Level == level && strings.Contains(r.Message, msg) {
			n++
		}
	}
	return n
}

// Main runs the tests of m and fails them if any goroutine is still running
// grace after they passed, then exits. A package whose code starts
// goroutines calls it from its TestMain. Nothing is ignored: memberlist's
// Shutdown does not join its own goroutines, and grace covers them (a
// probe in flight ends only when its probe interval, scaled by memberlist's
// health awareness to at most 8 x 1 s, runs out, later on a busy machine).
// Tests that run in testing/synctest bubbles leave nothing to wait for: a
// bubble ends only once all of its goroutines have (and fails its test if
// they cannot), so the grace is waited only for goroutines started outside
// one, and costs nothing when there are none.
func Main(m *testing.M, grace time.Duration) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(grace)
		tick := time.NewTicker(50 * time.Millisecond)
		for err := goleak.Find(); err != nil; err = goleak.Find() {
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: goroutines still running %v after the tests: %v\n", grace, err)
				code = 1
				break
			}
			<-tick.C
		}
		tick.Stop()
	}
	os.Exit(code)
}
