package main

import (
	"strings"
	"testing"
)

func TestParseTemplateAndFill(t *testing.T) {
	type entry struct{ k, v string }
	tests := []struct {
		name  string
		descs []string
		key   int
		want  [][]entry
	}{
		{"seed default, first key", []string{defaultBenchDescriptor}, 0,
			[][]entry{{{"remote_address", "10.0.0.1"}, {"PATH", "/login"}}}},
		{"ip carries into the third octet", []string{defaultBenchDescriptor}, 255,
			[][]entry{{{"remote_address", "10.0.1.0"}, {"PATH", "/login"}}}},
		{"last key", []string{"ip={ip}"}, maxBenchKeys - 1,
			[][]entry{{{"ip", "10.255.255.254"}}}},
		{"key placeholder with literals", []string{"user=u-{key}-x,plan=free"}, 42,
			[][]entry{{{"user", "u-42-x"}, {"plan", "free"}}}},
		{"two placeholders in one value", []string{"k={key}/{ip}"}, 1,
			[][]entry{{{"k", "1/10.0.0.2"}}}},
		{"several descriptors", []string{"remote_address={ip}", "PATH=/api,method=GET"}, 2,
			[][]entry{{{"remote_address", "10.0.0.3"}}, {{"PATH", "/api"}, {"method", "GET"}}}},
		{"bare key is an empty value; = in a value stays", []string{"a,b=x=y"}, 0,
			[][]entry{{{"a", ""}, {"b", "x=y"}}}},
		{"unclosed brace is literal", []string{"a={ip"}, 0,
			[][]entry{{{"a", "{ip"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := parseTemplate("ratelimit", 3, tc.descs)
			if err != nil {
				t.Fatal(err)
			}
			req := tmpl.newRequest()
			tmpl.fill(req, tc.key, nil)
			if req.Domain != "ratelimit" || req.HitsAddend != 3 {
				t.Fatalf("domain %q hits %d", req.Domain, req.HitsAddend)
			}
			if len(req.Descriptors) != len(tc.want) {
				t.Fatalf("%d descriptors, want %d", len(req.Descriptors), len(tc.want))
			}
			for i, d := range req.Descriptors {
				if len(d.Entries) != len(tc.want[i]) {
					t.Fatalf("descriptor %d: %v, want %v", i, d.Entries, tc.want[i])
				}
				for j, e := range d.Entries {
					if e.Key != tc.want[i][j].k || e.Value != tc.want[i][j].v {
						t.Errorf("descriptor %d entry %d = %s=%s, want %s=%s", i, j, e.Key, e.Value, tc.want[i][j].k, tc.want[i][j].v)
					}
				}
			}
		})
	}
}

// TestFillReusesRequest checks that refilling one request for another key
// replaces every placeholder value (workers reuse one request per call).
func TestFillReusesRequest(t *testing.T) {
	tmpl, err := parseTemplate("d", 0, []string{"a={key},b=fixed,c={ip}"})
	if err != nil {
		t.Fatal(err)
	}
	req := tmpl.newRequest()
	var buf []byte
	buf = tmpl.fill(req, 7, buf)
	first := req.Descriptors[0].Entries[0].Value
	tmpl.fill(req, 8, buf)
	e := req.Descriptors[0].Entries
	if first != "7" || e[0].Value != "8" || e[1].Value != "fixed" || e[2].Value != "10.0.0.9" {
		t.Fatalf("after refill: first %q, now %v", first, e)
	}
}

func TestParseTemplateErrors(t *testing.T) {
	tests := []struct {
		name   string
		domain string
		hits   uint
		descs  []string
		want   string
	}{
		{"no domain", "", 0, []string{"a=b"}, "bench: --domain: empty"},
		{"no descriptor", "d", 0, nil, "bench: --descriptor: none given"},
		{"empty key", "d", 0, []string{"a=b,=c"}, `bench: --descriptor[0] "a=b,=c": empty key`},
		{"unknown placeholder", "d", 0, []string{"a=b", "ip={addr}"}, `bench: --descriptor[1] "ip={addr}": unknown placeholder {addr} (use {ip} or {key})`},
		{"hits too big", "d", 1 << 32, []string{"a=b"}, "bench: --hits: 4294967296 does not fit in 32 bits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseTemplate(tc.domain, tc.hits, tc.descs)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestKeyChooserErrors(t *testing.T) {
	tests := []struct {
		dist string
		keys int
		s    float64
		want string
	}{
		{"uniform", 0, 1.1, "bench: --keys: 0 is not in [1, 16777214]"},
		{"uniform", maxBenchKeys + 1, 1.1, "bench: --keys: 16777215 is not in [1, 16777214]"},
		{"zipf", 10, 1, "bench: --zipf-s: 1 must be > 1"},
		{"pareto", 10, 1.1, `bench: --dist: unknown distribution "pareto" (uniform, zipf)`},
	}
	for _, tc := range tests {
		_, err := newKeyChooser(tc.dist, tc.keys, tc.s, 1, 0)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s keys=%d s=%v: err = %v, want %q", tc.dist, tc.keys, tc.s, err, tc.want)
		}
	}
}

// counts draws n keys and counts each.
func counts(t *testing.T, c keyChooser, keys, n int) []int {
	t.Helper()
	out := make([]int, keys)
	for range n {
		k := c.next()
		if k < 0 || k >= keys {
			t.Fatalf("key %d out of [0, %d)", k, keys)
		}
		out[k]++
	}
	return out
}

func TestUniformKeys(t *testing.T) {
	const keys, n = 100, 100000
	c, err := newKeyChooser("uniform", keys, 0, 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	for k, got := range counts(t, c, keys, n) {
		// Expected 1000 each; 5 standard deviations is about +-160.
		if got < 840 || got > 1160 {
			t.Errorf("key %d drawn %d times, want about %d", k, got, n/keys)
		}
	}
}

func TestZipfKeys(t *testing.T) {
	const keys, n = 1000, 100000
	c, err := newKeyChooser("zipf", keys, 1.1, 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := counts(t, c, keys, n)
	// Hottest first: each of the first keys is drawn more often than the next.
	for k := range 5 {
		if got[k] <= got[k+1] {
			t.Errorf("key %d drawn %d times, key %d %d: want decreasing", k, got[k], k+1, got[k+1])
		}
	}
	// Key 0 takes a large share; the cold half of the keys a small one.
	cold := 0
	for _, c := range got[keys/2:] {
		cold += c
	}
	if got[0] < n/10 || cold > n/10 {
		t.Errorf("key 0: %d of %d, keys %d..%d: %d: not zipf-shaped", got[0], n, keys/2, keys-1, cold)
	}
}

func TestKeyChooserDeterministic(t *testing.T) {
	for _, dist := range []string{"uniform", "zipf"} {
		a, _ := newKeyChooser(dist, 500, 1.2, 9, 3)
		b, _ := newKeyChooser(dist, 500, 1.2, 9, 3)
		other, _ := newKeyChooser(dist, 500, 1.2, 9, 4)
		same, differs := true, false
		for range 200 {
			x, y, z := a.next(), b.next(), other.next()
			same = same && x == y
			differs = differs || x != z
		}
		if !same || !differs {
			t.Errorf("%s: same seed and worker same stream: %v; another worker differs: %v", dist, same, differs)
		}
	}
	one, _ := newKeyChooser("zipf", 1, 1.5, 1, 0)
	if k := one.next(); k != 0 {
		t.Errorf("one key: got %d", k)
	}
}

func TestAppendKeyIP(t *testing.T) {
	for k, want := range map[int]string{0: "10.0.0.1", 254: "10.0.0.255", 65535: "10.1.0.0"} {
		if got := string(appendKeyIP(nil, k)); got != want {
			t.Errorf("key %d: %s, want %s", k, got, want)
		}
	}
	if !strings.HasPrefix(string(appendKeyIP([]byte("x"), 1)), "x10.") {
		t.Error("appendKeyIP must append")
	}
}
