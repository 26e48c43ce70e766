package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// seedConfig is the seed scenario's ConfigMap, verbatim.
const seedConfig = `domain: ratelimit
descriptors:
  - key: remote_address
    descriptors:
      - key: PATH
        rate_limit:
          unit: minute
          requests_per_unit: 100
`

// startOne starts a single node serving files laid out like a ConfigMap.
func startOne(t *testing.T, files map[string]string) (*Cluster, *Node, string) {
	t.Helper()
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ConfigMapDir(cfgDir, files); err != nil {
		t.Fatal(err)
	}
	c, err := NewCluster(testBin, dir, cfgDir, "127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.StartAll(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c, c.Nodes[0], cfgDir
}

// windowSafe waits, if needed, so a test that must finish inside one minute
// window does not straddle a window edge.
func windowSafe(t *testing.T, need time.Duration) {
	t.Helper()
	into := time.Duration(time.Now().UnixNano() % int64(time.Minute))
	if into+need > time.Minute {
		time.Sleep(time.Minute - into + 50*time.Millisecond) // wait out the window edge, not a sync
	}
}

// minuteNow is the number of the current minute window (Unix minutes). The
// nodes read the same clock: hits made between two equal readings all
// counted in that one window.
func minuteNow() int64 { return time.Now().UnixNano() / int64(time.Minute) }

// inOneMinute makes hits count in one minute window: should a run of hits
// straddle a window edge despite windowSafe (a very slow run), it runs them
// once more, in the window that has just begun; a second straddle fails the
// test. hits gets the attempt number (to pick new keys) and returns the
// checks to run on a run that stayed in one window, and what to log of one
// that did not.
func inOneMinute(t *testing.T, hits func(attempt int) (check func(), what string)) {
	t.Helper()
	for attempt := range 2 {
		w := minuteNow()
		check, what := hits(attempt)
		if minuteNow() == w {
			check()
			return
		}
		t.Logf("the minute window rolled over during the hits (%s); once more on new keys", what)
	}
	t.Fatal("the minute window rolled over twice during the hits")
}

// seedHits plays the seed scenario's hits against the 100-a-minute limit
// with client addresses ipPrefix+"1".."4" and returns what went wrong.
func seedHits(ctx context.Context, cl pb.RateLimitServiceClient, ipPrefix string) []string {
	var (
		mu   sync.Mutex
		errs []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, fmt.Sprintf(format, args...))
	}
	parallel := func(ip string, count int) (ok, over int64) {
		var wg sync.WaitGroup
		for i := 0; i < count; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := cl.ShouldRateLimit(ctx, Request("ratelimit", "remote_address", ip, "PATH", "GET/login"))
				if err != nil {
					fail("%s: %v", ip, err)
					return
				}
				if resp.OverallCode == pb.RateLimitResponse_OK {
					atomic.AddInt64(&ok, 1)
				} else {
					atomic.AddInt64(&over, 1)
				}
			}()
		}
		wg.Wait()
		return
	}
	// Two client IPs, 95 parallel requests each: all pass.
	var wg sync.WaitGroup
	for _, ip := range []string{ipPrefix + "1", ipPrefix + "2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, over := parallel(ip, 95); ok != 95 || over != 0 {
				fail("%s: %d ok, %d over; want 95 ok", ip, ok, over)
			}
		}()
	}
	wg.Wait()
	// One IP, 180 parallel: exactly 100 pass.
	if ok, over := parallel(ipPrefix+"3", 180); ok != 100 || over != 80 {
		fail("%s: %d ok, %d over; want 100 ok, 80 over", ipPrefix+"3", ok, over)
	}
	// Sequential: remaining 99..0, then OVER_LIMIT with remaining 0.
	for i := 0; i < 102; i++ {
		resp, err := cl.ShouldRateLimit(ctx, Request("ratelimit", "remote_address", ipPrefix+"4", "PATH", "GET/login"))
		if err != nil {
			fail("hit %d: %v", i+1, err)
			break
		}
		st := resp.Statuses[0]
		wantCode, wantRem := pb.RateLimitResponse_OK, uint32(99-i)
		if i >= 100 {
			wantCode, wantRem = pb.RateLimitResponse_OVER_LIMIT, 0
		}
		if st.Code != wantCode || st.LimitRemaining != wantRem || resp.OverallCode != wantCode {
			fail("hit %d: code %v remaining %d; want %v %d", i+1, st.Code, st.LimitRemaining, wantCode, wantRem)
			break
		}
		if l := st.CurrentLimit; l == nil || l.RequestsPerUnit != 100 || l.Unit != pb.RateLimitResponse_RateLimit_MINUTE {
			fail("hit %d: current_limit %v", i+1, l)
			break
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
			fail("hit %d: duration_until_reset %v", i+1, d)
			break
		}
	}
	return errs
}

func TestEndToEndSeedScenario(t *testing.T) {
	_, n, _ := startOne(t, map[string]string{"config.yaml": seedConfig})
	conn, cl, err := Dial(n.GRPC)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	// The counts must fall in one minute window: windowSafe makes that
	// likely, inOneMinute sure.
	windowSafe(t, 20*time.Second)
	ipPrefix := ""
	inOneMinute(t, func(attempt int) (func(), string) {
		ipPrefix = fmt.Sprintf("10.0.%d.", attempt)
		errs := seedHits(ctx, cl, ipPrefix)
		return func() {
			for _, e := range errs {
				t.Error(e)
			}
		}, fmt.Sprintf("%d errors: %v", len(errs), errs)
	})
	// A deeper descriptor has no limit; an unknown domain is OK.
	for _, req := range []*pb.RateLimitRequest{
		Request("ratelimit", "remote_address", ipPrefix+"4", "PATH", "GET/login", "extra", "x"),
		Request("ratelimit", "remote_address", ipPrefix+"4"),
		Request("no-such-domain", "remote_address", ipPrefix+"4", "PATH", "GET/login"),
	} {
		resp, err := cl.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != pb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("%v: got %v, want OK with no limit", req, resp)
		}
	}
	// An empty domain is an error.
	_, err = cl.ShouldRateLimit(ctx, Request("", "remote_address", ipPrefix+"4"))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty domain: %v, want InvalidArgument", err)
	}
	// gRPC health for "ratelimit" and "": it follows readiness within
	// serve's 100 ms health tick, which a fast run may beat.
	for _, svc := range []string{"", "ratelimit"} {
		waitFor(t, 5*time.Second, fmt.Sprintf("gRPC health %q SERVING", svc), func() bool {
			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			return err == nil && h.Status == healthpb.HealthCheckResponse_SERVING
		})
	}
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndToEndHTTPAndReload(t *testing.T) {
	c, n, cfgDir := startOne(t, map[string]string{"config.yaml": seedConfig})
	windowSafe(t, 20*time.Second)
	code, body := httpDo(t, "GET", "http://"+n.HTTP+"/healthcheck", "")
	if code != 200 || body != "OK" {
		t.Fatalf("/healthcheck: %d %q", code, body)
	}
	js := func(ip string) string {
		return fmt.Sprintf(`{"domain":"ratelimit","descriptors":[{"entries":[{"key":"remote_address","value":"%s"},{"key":"PATH","value":"/x"}]}]}`, ip)
	}
	code, body = httpDo(t, "POST", "http://"+n.HTTP+"/json", js("10.1.0.1"))
	if code != 200 || !strings.Contains(body, `"limitRemaining":99`) {
		t.Fatalf("/json: %d %s", code, body)
	}
	// snake_case is accepted too.
	code, body = httpDo(t, "POST", "http://"+n.HTTP+"/json", `{"domain":"ratelimit","hits_addend":100,"descriptors":[{"entries":[{"key":"remote_address","value":"10.1.0.1"},{"key":"PATH","value":"/x"}]}]}`)
	if code != 429 || !strings.Contains(body, "OVER_LIMIT") {
		t.Fatalf("/json over limit: %d %s", code, body)
	}
	for _, bad := range []string{`{`, `{"domain":""}`, `{"domain":"ratelimit","descriptors":[]}`, `{"nope":1}`} {
		if code, body = httpDo(t, "POST", "http://"+n.HTTP+"/json", bad); code != 400 {
			t.Errorf("/json %s: %d %s, want 400", bad, code, body)
		}
	}
	code, body = httpDo(t, "GET", "http://"+n.Debug+"/rlconfig", "")
	if code != 200 || !strings.Contains(body, "ratelimit.remote_address.PATH") {
		t.Fatalf("/rlconfig: %d %q", code, body)
	}

	// Reload: an atomic ConfigMap swap to a limit of 5 per minute.
	five := strings.Replace(seedConfig, "requests_per_unit: 100", "requests_per_unit: 5", 1)
	if err := ConfigMapDir(cfgDir, map[string]string{"config.yaml": five}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "reload to 5/minute", func() bool {
		_, body := httpDo(t, "GET", "http://"+n.Debug+"/rlconfig", "")
		return strings.Contains(body, "requests_per_unit=5")
	})
	// A bad reload keeps the last good config and is counted.
	if err := ConfigMapDir(cfgDir, map[string]string{"config.yaml": "domain: ratelimit\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "config_load_error counted", func() bool {
		_, body := httpDo(t, "GET", "http://"+n.Debug+"/metrics", "")
		return strings.Contains(body, "ratelimit_service_config_load_error 1")
	})
	if _, body := httpDo(t, "GET", "http://"+n.Debug+"/rlconfig", ""); !strings.Contains(body, "requests_per_unit=5") {
		t.Errorf("after a bad reload the last good config should stay: %q", body)
	}
	_, metrics := httpDo(t, "GET", "http://"+n.Debug+"/metrics", "")
	for _, want := range []string{`ratelimit_service_rate_limit_total_hits{domain="ratelimit",key="remote_address.PATH"}`, "ringlimit_request_duration_seconds_bucket"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// SIGTERM drains and exits 0.
	if err := n.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n.ExitErr(); err != nil {
		t.Errorf("exit after SIGTERM: %v, want status 0", err)
	}
	if cr := c.Crashes(); len(cr) > 0 {
		t.Errorf("crashes: %v", cr)
	}
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a bounded wait
	}
}
