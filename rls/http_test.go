package rls

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// svServe sends one request to handler and returns the response.
func svServe(handler http.Handler, method, target, body string) *http.Response {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(method, target, r))
	return rec.Result()
}

func svBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHTTPHealthcheck(t *testing.T) {
	tests := []struct {
		name     string
		notReady func() string
		wantCode int
		wantBody string
	}{
		{"no readiness check", nil, http.StatusOK, "OK"},
		{"ready", func() string { return "" }, http.StatusOK, "OK"},
		{"not ready: 500, as in the reference, and why", func() string { return "syncing" }, http.StatusInternalServerError, "NOT READY: syncing\n"},
	}
	h := svNew(t, svSeedConfig, Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := svServe(h.svc.HTTPHandler(tt.notReady), http.MethodGet, "/healthcheck", "")
			if body := svBody(t, resp); resp.StatusCode != tt.wantCode || body != tt.wantBody {
				t.Fatalf("GET /healthcheck = %d %q, want %d %q", resp.StatusCode, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

// TestHTTPJSON plays a timeline of /json calls at t0+5s against the seed
// config: camelCase and snake_case bodies in, protojson out, 200 when OK,
// 429 when over the limit, 400 for a bad body, whatever the method.
func TestHTTPJSON(t *testing.T) {
	const entries = `[{"key":"remote_address","value":"203.0.113.9"},{"key":"PATH","value":"GET /login"}]`
	seed := func(code pb.RateLimitResponse_Code, rem uint32) *pb.RateLimitResponse {
		return svResp(code, svSt(code, 100, svMinute, "", rem, 55))
	}
	tests := []struct {
		name     string
		method   string
		body     string
		wantCode int
		want     *pb.RateLimitResponse // for 200 and 429
		wantBody string                // else: a part of the body
	}{
		{"camelCase", http.MethodPost,
			`{"domain":"ratelimit","descriptors":[{"entries":` + entries + `}],"hitsAddend":1}`,
			http.StatusOK, seed(svOK, 99), ""},
		{"snake_case", http.MethodPost,
			`{"domain":"ratelimit","descriptors":[{"entries":` + entries + `}],"hits_addend":97}`,
			http.StatusOK, seed(svOK, 2), ""},
		{"descriptor hits_addend, camelCase, as a string", http.MethodPost,
			`{"domain":"ratelimit","descriptors":[{"entries":` + entries + `,"hitsAddend":"2"}],"hitsAddend":50}`,
			http.StatusOK, seed(svOK, 0), ""},
		{"descriptor hits_addend 0, snake_case: check only", http.MethodPost,
			`{"domain":"ratelimit","descriptors":[{"entries":` + entries + `,"hits_addend":0}]}`,
			http.StatusOK, seed(svOK, 0), ""},
		{"over the limit", http.MethodPost,
			`{"domain":"ratelimit","descriptors":[{"entries":` + entries + `}]}`,
			http.StatusTooManyRequests, seed(svOver, 0), ""},
		{"unknown domain", http.MethodPost,
			`{"domain":"other","descriptors":[{"entries":` + entries + `}]}`,
			http.StatusOK, svResp(svOK, svOKSt()), ""},
		{"bad JSON", http.MethodPost, `{"domain":`, http.StatusBadRequest, nil, "rls: bad request body"},
		{"unknown field", http.MethodPost, `{"domain":"ratelimit","burst":1}`, http.StatusBadRequest, nil, "rls: bad request body"},
		{"empty body", http.MethodPost, ``, http.StatusBadRequest, nil, "rls: bad request body"},
		{"empty domain", http.MethodPost, `{"descriptors":[{"entries":` + entries + `}]}`,
			http.StatusBadRequest, nil, "rls: invalid request: rate limit domain must not be empty"},
		{"no descriptors", http.MethodPost, `{"domain":"ratelimit"}`,
			http.StatusBadRequest, nil, "rate limit descriptor list must not be empty"},
		{"empty key: no rule, OK", http.MethodPost, `{"domain":"ratelimit","descriptors":[{"entries":[{"value":"v"}]}]}`,
			http.StatusOK, svResp(svOK, svOKSt()), ""},
		// The body bound is 8 times the request bound (256 KiB): a 1 MiB
		// body is read and refused by the request bound, one over 2 MiB by
		// the body bound, each naming its bound.
		{"body of 1 MiB", http.MethodPost,
			`{"domain":"` + strings.Repeat("d", 1<<20) + `"}`, http.StatusBadRequest, nil, "more than the bound of 262144"},
		{"body over 2 MiB", http.MethodPost,
			`{"domain":"` + strings.Repeat("d", 2<<20) + `"}`, http.StatusBadRequest, nil, "rls: request body is more than the bound of 2097152 bytes"},
		// Any method decides its body, as in the reference.
		{"GET with a body", http.MethodGet,
			`{"domain":"ratelimit","descriptors":[{"entries":` + entries + `}]}`,
			http.StatusTooManyRequests, seed(svOver, 0), ""},
		{"PUT with a body", http.MethodPut,
			`{"domain":"other","descriptors":[{"entries":` + entries + `}]}`,
			http.StatusOK, svResp(svOK, svOKSt()), ""},
		{"GET without a body", http.MethodGet, ``, http.StatusBadRequest, nil, "rls: bad request body"},
	}
	h := svNew(t, svSeedConfig, Options{})
	h.clock.Set(svT0 + 5*svSec)
	handler := h.svc.HTTPHandler(nil)
	for _, tt := range tests {
		resp := svServe(handler, tt.method, "/json", tt.body)
		body := svBody(t, resp)
		if resp.StatusCode != tt.wantCode {
			t.Fatalf("%s: %s /json = %d %q, want %d", tt.name, tt.method, resp.StatusCode, body, tt.wantCode)
		}
		if tt.want == nil {
			if !strings.Contains(body, tt.wantBody) {
				t.Fatalf("%s: body %q, want it to contain %q", tt.name, body, tt.wantBody)
			}
			continue
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s: Content-Type = %q", tt.name, ct)
		}
		var got pb.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("%s: body %q is not protojson: %v", tt.name, body, err)
		}
		if !proto.Equal(&got, tt.want) {
			t.Fatalf("%s: got %s, want %s", tt.name, svText(&got), svText(tt.want))
		}
		// protojson writes lowerCamelCase names, enums as names and
		// durations as strings.
		var raw map[string]any
		if err := json.Unmarshal([]byte(body), &raw); err != nil {
			t.Fatal(err)
		}
		if raw["overallCode"] != tt.want.OverallCode.String() {
			t.Fatalf("%s: overallCode in %s, want %q", tt.name, body, tt.want.OverallCode.String())
		}
		if st := tt.want.Statuses[0]; st.CurrentLimit != nil {
			s0 := raw["statuses"].([]any)[0].(map[string]any)
			if s0["durationUntilReset"] != "55s" || s0["currentLimit"].(map[string]any)["unit"] != "MINUTE" {
				t.Fatalf("%s: status %v", tt.name, s0)
			}
		}
	}
}

func TestHTTPRLConfig(t *testing.T) {
	h := svNew(t, svSeedConfig, Options{})
	resp := svServe(h.svc.ConfigHandler(), http.MethodGet, "/rlconfig", "")
	body := svBody(t, resp)
	const want = "ratelimit.remote_address.PATH: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false\n"
	if resp.StatusCode != http.StatusOK || body != want {
		t.Fatalf("GET /rlconfig = %d %q, want 200 %q", resp.StatusCode, body, want)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("Content-Type = %q", ct)
	}

	// Every rule, one per line, in Rules() order; it follows SetConfig.
	h = svNew(t, svConfig, Options{})
	body = svBody(t, svServe(h.svc.ConfigHandler(), http.MethodGet, "/rlconfig", ""))
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	rules := h.cfg.Rules()
	if len(lines) != len(rules) {
		t.Fatalf("/rlconfig has %d lines, config has %d rules:\n%s", len(lines), len(rules), body)
	}
	for i, r := range rules {
		if !strings.HasPrefix(lines[i], r.StatKey+": ") {
			t.Errorf("line %d = %q, want rule %s", i, lines[i], r.StatKey)
		}
	}
	for _, want := range []string{
		"shapes.unlimited: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
		"shapes.minute: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false",
		"shapes.shadow: unit=MINUTE requests_per_unit=2, shadow_mode: true, quota_mode: false",
		"shapes.path.user: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/rlconfig lacks %q:\n%s", want, body)
		}
	}
	h.svc.SetConfig(&Config{})
	if body := svBody(t, svServe(h.svc.ConfigHandler(), http.MethodGet, "/rlconfig", "")); body != "" {
		t.Fatalf("/rlconfig of an empty config = %q", body)
	}
}

// TestJSONInFlightBound: at most MaxJSONInFlight /json requests are read
// and decoded at once; one more gets 503 with Retry-After, and a slot freed
// serves again.
func TestJSONInFlightBound(t *testing.T) {
	h := svNew(t, svSeedConfig, Options{})
	handler := h.svc.HTTPHandler(nil)
	var (
		wg     sync.WaitGroup
		writer []*io.PipeWriter
	)
	for range MaxJSONInFlight {
		pr, pw := io.Pipe()
		writer = append(writer, pw)
		wg.Go(func() {
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", pr)) // reads until pw closes
		})
	}
	watchWaitFor(t, "every slot taken", func() bool { return len(h.svc.jsonSlots) == MaxJSONInFlight })
	resp := svServe(handler, http.MethodPost, "/json", `{"domain":"ratelimit"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("one more /json: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, pw := range writer {
		pw.Close()
	}
	wg.Wait()
	body := `{"domain":"ratelimit","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"},{"key":"PATH","value":"/"}]}]}`
	if resp := svServe(handler, http.MethodPost, "/json", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the slots are free: %d, want 200", resp.StatusCode)
	}
}
