package rls

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ringlimit/ringlimit/bucket"
)

// cfgErrLines flattens a joined error into its lines.
func cfgErrLines(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

// TestParseErrors is the reference's validation list, one case per error it
// reports, plus the YAML-level errors; every error of a file is reported.
func TestParseErrors(t *testing.T) {
	const f = "rls: ratelimit.yaml: "
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown key at the top", "domain: d\nfoo: 1\n",
			[]string{f + "foo: unknown key 'foo' (line 2)"}},
		{"unknown key in a descriptor", "domain: d\ndescriptors:\n  - key: k\n    valu: v\n",
			[]string{f + "descriptors[0].valu: unknown key 'valu' (line 4)"}},
		{"unknown key in rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, brust: 2}\n",
			[]string{f + "descriptors[0].rate_limit.brust: unknown key 'brust' (line 4)"}},
		{"unknown key in replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, replaces: [{name: a, id: 1}]}\n",
			[]string{f + "descriptors[0].rate_limit.replaces[0].id: unknown key 'id' (line 4)"}},
		{"misplaced key is unknown at its level", "domain: d\ndescriptors:\n  - key: k\n    unit: second\n",
			[]string{f + "descriptors[0].unit: unknown key 'unit' (line 4)"}},
		{"missing domain", "descriptors: []\n",
			[]string{f + "domain: config file cannot have empty domain"}},
		{"empty domain", "domain: \"\"\n",
			[]string{f + "domain: config file cannot have empty domain"}},
		{"empty file", "",
			[]string{f + "domain: config file cannot have empty domain"}},
		{"comments only", "# nothing\n",
			[]string{f + "domain: config file cannot have empty domain"}},
		{"descriptor has empty key", "domain: d\ndescriptors:\n  - value: v\n",
			[]string{f + "descriptors[0]: descriptor has empty key"}},
		{"duplicate composite key", "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
			[]string{f + "descriptors[1]: duplicate descriptor composite key 'd.k_v'"}},
		{"duplicate bare key", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
			[]string{f + "descriptors[1]: duplicate descriptor composite key 'd.k'"}},
		{"duplicate nested key", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n",
			[]string{f + "descriptors[0].descriptors[1]: duplicate descriptor composite key 'd.a.b'"}},
		{"composite keys collide as in the reference", "domain: d\ndescriptors:\n  - key: a_b\n  - {key: a, value: b}\n",
			[]string{f + "descriptors[1]: duplicate descriptor composite key 'd.a_b'"}},
		{"invalid unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			[]string{f + "descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"}},
		{"missing unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
			[]string{f + "descriptors[0].rate_limit.unit: invalid rate limit unit ''"}},
		{"unit unknown is invalid", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown}\n",
			[]string{f + "descriptors[0].rate_limit.unit: invalid rate limit unit 'unknown'"}},
		{"empty rate_limit mapping", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n",
			[]string{f + "descriptors[0].rate_limit.unit: invalid rate limit unit ''"}},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unlimited: true}\n",
			[]string{f + "descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited"}},
		{"empty replaces name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, name: a, replaces: [{name: \"\"}]}\n",
			[]string{f + "descriptors[0].rate_limit.replaces[0]: should not have an empty replaces entry"}},
		{"replaces entry without name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, replaces: [{}]}\n",
			[]string{f + "descriptors[0].rate_limit.replaces[0]: should not have an empty replaces entry"}},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, name: a, replaces: [{name: b}, {name: a}]}\n",
			[]string{f + "descriptors[0].rate_limit.replaces[1]: replaces should not contain name of same descriptor"}},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true}\n",
			[]string{f + "descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'"}},
		{"yaml syntax", "domain: d\n  x: y\n",
			[]string{f + "invalid yaml: line 2: mapping values are not allowed in this context"}},
		{"yaml unclosed flow", "domain: [\n",
			[]string{f + "invalid yaml: line 1: did not find expected node content"}},
		{"top level is a list", "- a\n- b\n",
			[]string{f + "expected a mapping, got a list (line 1)"}},
		{"duplicate yaml key", "domain: d\ndomain: e\n",
			[]string{f + "domain: duplicate key 'domain', first at line 1 (line 2)"}},
		{"domain is a list", "domain: [a]\n",
			[]string{f + "domain: expected a string, got a list (line 1)"}},
		{"descriptors is a scalar", "domain: d\ndescriptors: 5\n",
			[]string{f + "descriptors: expected a list, got the integer 5 (line 2)"}},
		{"descriptor is a scalar", "domain: d\ndescriptors: [5]\n",
			[]string{f + "descriptors[0]: expected a mapping, got the integer 5 (line 2)"}},
		{"key is a mapping", "domain: d\ndescriptors:\n  - key: {a: b}\n",
			[]string{f + "descriptors[0].key: expected a string, got a mapping (line 3)"}},
		{"negative requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			[]string{f + "descriptors[0].rate_limit.requests_per_unit: expected an integer from 0 to 4294967295, got the integer -1 (line 4)"}},
		{"requests_per_unit over uint32", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
			[]string{f + "descriptors[0].rate_limit.requests_per_unit: expected an integer from 0 to 4294967295, got the integer 4294967296 (line 4)"}},
		{"fractional requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
			[]string{f + "descriptors[0].rate_limit.requests_per_unit: expected an integer from 0 to 4294967295, got the number 1.5 (line 4)"}},
		{"string requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: lots}\n",
			[]string{f + "descriptors[0].rate_limit.requests_per_unit: expected an integer from 0 to 4294967295, got \"lots\" (line 4)"}},
		{"non-boolean shadow_mode", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n",
			[]string{f + "descriptors[0].shadow_mode: expected true or false, got \"maybe\" (line 4)"}},
		{"rate_limit is a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n",
			[]string{f + "descriptors[0].rate_limit: expected a mapping, got a list (line 4)"}},
		{"every error, in line order", "domain: d\n" +
			"descriptors:\n" +
			"  - key: a\n" + // 3
			"    rate_limit: {unit: fortnight}\n" + // 4
			"  - key: a\n" + // 5: duplicate
			"  - value: x\n" + // 6: empty key
			"    extra: 1\n" + // 7: unknown
			"    descriptors:\n" +
			"      - key: b\n" +
			"        rate_limit: {unit: second, unlimited: true, name: n, replaces: [{name: n}]}\n", // 10
			[]string{
				f + "descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'",
				f + "descriptors[1]: duplicate descriptor composite key 'd.a'",
				f + "descriptors[2]: descriptor has empty key",
				f + "descriptors[2].extra: unknown key 'extra' (line 7)",
				f + "descriptors[2].descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited",
				f + "descriptors[2].descriptors[0].rate_limit.replaces[0]: replaces should not contain name of same descriptor",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("ratelimit.yaml", []byte(tt.yaml))
			if c != nil {
				t.Errorf("Parse returned a config with errors: %q", c.Dump())
			}
			got := cfgErrLines(err)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("errors:\n got %q\nwant %q", got, tt.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.File != "ratelimit.yaml" {
				t.Errorf("error %v is not a *FieldError for the file", err)
			}
		})
	}
}

// TestParseSyntaxErrorLine checks the line a YAML syntax error names
// against the line of the broken file it is about: yaml.v3 prints a parser
// error's line 0-based (one too low) and none on the first line.
func TestParseSyntaxErrorLine(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		line int
		msg  string
	}{
		// Parser errors: the line where the list or flow began.
		{"list item indented wrong", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", 3, "did not find expected '-' indicator"},
		{"key beside a list", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  key2: x\n", 3, "did not find expected '-' indicator"},
		{"unclosed flow list", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: [1\n", 6, "did not find expected ',' or ']'"},
		{"unclosed flow mapping after a document start", "# limits\n---\ndomain: d\ndescriptors:\n  - {key: a, value: b\n", 5, "did not find expected ',' or '}'"},
		{"unclosed flow on the first line", "domain: [\n", 1, "did not find expected node content"},
		// Scanner errors: the line where the token began, already 1-based.
		{"colon in a plain value", "# limits\n---\ndomain: d\ndescriptors:\n  - key: a\n    value: b: c\n", 6, "mapping values are not allowed in this context"},
		{"tab after a plain scalar", "domain: d\ndescriptors:\n  - key: a\n\tvalue: b\n", 3, "found a tab character that violates indentation"},
		{"unclosed quote", "domain: d\ndescriptors:\n  - key: \"a\n", 3, "found unexpected end of stream"},
		{"unclosed quote on the only line", "domain: \"d", 1, "found unexpected end of stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("ratelimit.yaml", []byte(tt.yaml))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Parse: %v, want a *FieldError", err)
			}
			want := fmt.Sprintf("invalid yaml: line %d: %s", tt.line, tt.msg)
			if fe.Line != tt.line || fe.Msg != want {
				t.Errorf("got line %d %q, want line %d %q", fe.Line, fe.Msg, tt.line, want)
			}
		})
	}
	// Bad bytes have no line.
	_, err := Parse("ratelimit.yaml", []byte("domain: d\x01\n"))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Line != 0 || fe.Msg != "invalid yaml: control characters are not allowed" {
		t.Errorf("control character: %v", err)
	}
}

// TestParseValid covers what the reference accepts, and how it reads it.
func TestParseValid(t *testing.T) {
	const (
		sec = int64(1e9)
		day = 24 * 3600 * sec
	)
	tests := []struct {
		name string
		yaml string
		want []Rule // Index is checked by position; Domain is "d"
	}{
		{"units in any case, month and year", "domain: d\ndescriptors:\n" +
			"  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n" +
			"  - {key: b, rate_limit: {unit: MINUTE, requests_per_unit: 2}}\n" +
			"  - {key: c, rate_limit: {unit: Hour, requests_per_unit: 3}}\n" +
			"  - {key: e, rate_limit: {unit: dAy, requests_per_unit: 4}}\n" +
			"  - {key: f, rate_limit: {unit: week, requests_per_unit: 5}}\n" +
			"  - {key: g, rate_limit: {unit: month, requests_per_unit: 6}}\n" +
			"  - {key: h, rate_limit: {unit: year, requests_per_unit: 7}}\n",
			[]Rule{
				{StatKey: "d.a", Unit: pb.RateLimitResponse_RateLimit_SECOND, RequestsPerUnit: 1, Limit: bucket.Limit{Requests: 1, Unit: sec}},
				{StatKey: "d.b", Unit: pb.RateLimitResponse_RateLimit_MINUTE, RequestsPerUnit: 2, Limit: bucket.Limit{Requests: 2, Unit: 60 * sec}},
				{StatKey: "d.c", Unit: pb.RateLimitResponse_RateLimit_HOUR, RequestsPerUnit: 3, Limit: bucket.Limit{Requests: 3, Unit: 3600 * sec}},
				{StatKey: "d.e", Unit: pb.RateLimitResponse_RateLimit_DAY, RequestsPerUnit: 4, Limit: bucket.Limit{Requests: 4, Unit: day}},
				{StatKey: "d.f", Unit: pb.RateLimitResponse_RateLimit_WEEK, RequestsPerUnit: 5, Limit: bucket.Limit{Requests: 5, Unit: 7 * day}},
				{StatKey: "d.g", Unit: pb.RateLimitResponse_RateLimit_MONTH, RequestsPerUnit: 6, Limit: bucket.Limit{Requests: 6, Unit: 30 * day}},
				{StatKey: "d.h", Unit: pb.RateLimitResponse_RateLimit_YEAR, RequestsPerUnit: 7, Limit: bucket.Limit{Requests: 7, Unit: 365 * day}},
			}},
		{"missing or zero requests_per_unit blocks", "domain: d\ndescriptors:\n" +
			"  - {key: a, rate_limit: {unit: second}}\n" +
			"  - {key: b, rate_limit: {unit: second, requests_per_unit: 0}}\n",
			[]Rule{
				{StatKey: "d.a", Unit: pb.RateLimitResponse_RateLimit_SECOND, Limit: bucket.Limit{Unit: sec}},
				{StatKey: "d.b", Unit: pb.RateLimitResponse_RateLimit_SECOND, Limit: bucket.Limit{Unit: sec}},
			}},
		{"unlimited", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unlimited: true, requests_per_unit: 3}}\n",
			[]Rule{{StatKey: "d.a", Unlimited: true, RequestsPerUnit: 3}}},
		{"unlimited ignores a bad unit, as the reference does", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unlimited: true, unit: bogus}}\n",
			[]Rule{{StatKey: "d.a", Unlimited: true}}},
		{"null rate_limit is no limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n", nil},
		{"name, replaces, shadow_mode, detailed_metric, nested stat key", "domain: d\ndescriptors:\n" +
			"  - key: a\n    value: x\n    descriptors:\n" +
			"      - key: b\n        shadow_mode: true\n        detailed_metric: true\n" +
			"        rate_limit: {unit: second, requests_per_unit: 9, name: n, replaces: [{name: m}, {name: o}]}\n",
			[]Rule{{StatKey: "d.a_x.b", Name: "n", Replaces: []string{"m", "o"}, ShadowMode: true, DetailedMetric: true,
				Unit: pb.RateLimitResponse_RateLimit_SECOND, RequestsPerUnit: 9, Limit: bucket.Limit{Requests: 9, Unit: sec}}}},
		{"newer reference fields are accepted", "domain: d\ndescriptors:\n" +
			"  - key: a\n    value: \"x*\"\n    share_threshold: true\n    value_to_metric: true\n    quota_mode: true\n" +
			"    metadata: {team: {name: core}}\n    rate_limit: {unit: second, quota_mode: true, metadata: [1]}\n",
			[]Rule{{StatKey: "d.a_x*", Unit: pb.RateLimitResponse_RateLimit_SECOND, Limit: bucket.Limit{Unit: sec}}}},
		{"scalars are taken as written", "domain: 42\ndescriptors:\n  - {key: 7, value: 1.50, rate_limit: {unit: second, requests_per_unit: 1e3}}\n",
			nil}, // domain "42": checked below
		{"descriptors and lists may be null", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n    rate_limit:\n      unit: second\n      replaces:\n",
			[]Rule{{StatKey: "d.a", Unit: pb.RateLimitResponse_RateLimit_SECOND, Limit: bucket.Limit{Unit: sec}}}},
		{"merge keys", "domain: d\ndescriptors:\n" +
			"  - &base {key: a, value: x, rate_limit: &rl {unit: second, requests_per_unit: 1}}\n" +
			"  - <<: *base\n    value: y\n" +
			"  - key: a\n    value: z\n    rate_limit:\n      <<: [*rl, {unit: hour}]\n      requests_per_unit: 2\n",
			[]Rule{
				{StatKey: "d.a_x", Unit: pb.RateLimitResponse_RateLimit_SECOND, RequestsPerUnit: 1, Limit: bucket.Limit{Requests: 1, Unit: sec}},
				{StatKey: "d.a_y", Unit: pb.RateLimitResponse_RateLimit_SECOND, RequestsPerUnit: 1, Limit: bucket.Limit{Requests: 1, Unit: sec}},
				{StatKey: "d.a_z", Unit: pb.RateLimitResponse_RateLimit_SECOND, RequestsPerUnit: 2, Limit: bucket.Limit{Requests: 2, Unit: sec}},
			}},
		{"only the first yaml document is read, as in the reference", "domain: d\n---\nfoo: bar\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("ratelimit.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if strings.HasPrefix(tt.yaml, "domain: 42") {
				r := c.Domain("42").Match(cfgEntries("7", "1.50"))
				if r == nil || r.StatKey != "42.7_1.50" || r.RequestsPerUnit != 1000 {
					t.Fatalf("scalars: got %+v", r)
				}
				return
			}
			rules := c.Rules()
			if len(rules) != len(tt.want) {
				t.Fatalf("got %d rules, want %d:\n%s", len(rules), len(tt.want), c.Dump())
			}
			for i, r := range rules {
				w := tt.want[i]
				w.Index, w.Domain = i, "d"
				if !cfgRuleEqual(*r, w) {
					t.Errorf("rule %d:\n got %+v\nwant %+v", i, *r, w)
				}
			}
		})
	}
}

func cfgRuleEqual(a, b Rule) bool {
	return slices.Equal(a.Replaces, b.Replaces) &&
		a.Index == b.Index && a.Domain == b.Domain && a.StatKey == b.StatKey && a.Name == b.Name &&
		a.Unlimited == b.Unlimited && a.Unit == b.Unit && a.RequestsPerUnit == b.RequestsPerUnit &&
		a.Limit == b.Limit && a.ShadowMode == b.ShadowMode && a.DetailedMetric == b.DetailedMetric
}

func TestUnitDuration(t *testing.T) {
	tests := []struct {
		u    pb.RateLimitResponse_RateLimit_Unit
		want int64
	}{
		{pb.RateLimitResponse_RateLimit_UNKNOWN, 0},
		{pb.RateLimitResponse_RateLimit_SECOND, 1_000_000_000},
		{pb.RateLimitResponse_RateLimit_MINUTE, 60_000_000_000},
		{pb.RateLimitResponse_RateLimit_HOUR, 3_600_000_000_000},
		{pb.RateLimitResponse_RateLimit_DAY, 86_400_000_000_000},
		{pb.RateLimitResponse_RateLimit_WEEK, 604_800_000_000_000},
		{pb.RateLimitResponse_RateLimit_MONTH, 2_592_000_000_000_000},
		{pb.RateLimitResponse_RateLimit_YEAR, 31_536_000_000_000_000},
		{pb.RateLimitResponse_RateLimit_Unit(99), 0},
	}
	for _, tt := range tests {
		if got := UnitDuration(tt.u); got != tt.want {
			t.Errorf("UnitDuration(%v) = %d, want %d", tt.u, got, tt.want)
		}
	}
}

// TestSeedConfig loads the seed scenario's ConfigMap verbatim.
func TestSeedConfig(t *testing.T) {
	c, err := Load("testdata/seed", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Dump(), "ratelimit.remote_address.PATH: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false\n"; got != want {
		t.Errorf("Dump = %q, want %q", got, want)
	}
	d := c.Domain("ratelimit")
	r := d.Match(cfgEntries("remote_address", "10.0.0.1", "PATH", "GET /api/login"))
	if r == nil || r.RequestsPerUnit != 100 || r.Unit != pb.RateLimitResponse_RateLimit_MINUTE ||
		r.Limit != (bucket.Limit{Requests: 100, Unit: 60e9}) {
		t.Fatalf("Match = %+v", r)
	}
	if r := d.Match(cfgEntries("remote_address", "10.0.0.1")); r != nil {
		t.Errorf("remote_address alone matched %s", r.StatKey)
	}
	// The example `make run` serves is the same file.
	a, _ := os.ReadFile("testdata/seed/ratelimit.yaml")
	b, err := os.ReadFile("../deploy/examples/config/ratelimit.yaml")
	if err != nil || !bytes.Equal(a, b) {
		t.Errorf("deploy/examples/config/ratelimit.yaml differs from the seed (%v)", err)
	}
}

// TestLoadFullDirectory reads every regular file whatever its extension, in
// subdirectories too, skipping dotfiles and dot-directories, and orders
// rules by domain.
func TestLoadFullDirectory(t *testing.T) {
	c, err := Load("testdata/full", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := `api.remote_address: unit=SECOND requests_per_unit=50, shadow_mode: false, quota_mode: false
api.remote_address.PATH_GET /login: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false
api.remote_address.PATH_GET /static/*: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false
api.remote_address.PATH: unit=HOUR requests_per_unit=1000, shadow_mode: false, quota_mode: false
api.generic_key_blocked: unit=DAY requests_per_unit=0, shadow_mode: false, quota_mode: false
api.generic_key_shadow: unit=WEEK requests_per_unit=5, shadow_mode: true, quota_mode: false
api.header_match_tenant-*-eu: unit=MONTH requests_per_unit=1000000, shadow_mode: false, quota_mode: true
api.destination_cluster: unit=YEAR requests_per_unit=4294967295, shadow_mode: false, quota_mode: false
internal.service_a: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false
internal.service_b: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false
internal.service_c: unit=MINUTE requests_per_unit=120, shadow_mode: false, quota_mode: false
nested.tenant: unit=MINUTE requests_per_unit=7, shadow_mode: false, quota_mode: false
`
	if got := c.Dump(); got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
	if got := strings.Join(c.Domains(), ","); got != "api,internal,nested" {
		t.Errorf("Domains = %s", got)
	}
	for i, r := range c.Rules() {
		if r.Index != i {
			t.Errorf("Rules()[%d].Index = %d", i, r.Index)
		}
	}
	c.Rules()[0] = nil // a copy
	if c.Rules()[0] == nil {
		t.Error("Rules() exposes the config's slice")
	}
	if r := c.Domain("api").Match(cfgEntries("remote_address", "1.2.3.4", "PATH", "GET /static/app.js")); r == nil || !r.Unlimited {
		t.Errorf("unlimited wildcard: %+v", r)
	}
}

// cfgWrite writes files (name -> content) under dir.
func cfgWrite(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func cfgSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// cfgRule is a one-rule file: domain, one descriptor key, a per-minute limit.
func cfgRule(domain, key string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: " + key +
		"\n    rate_limit: {unit: minute, requests_per_unit: " + strconv.Itoa(rpu) + "}\n"
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		setup   func(t *testing.T, dir string)
		opt     LoadOptions
		path    string // relative to the dir; "" for the dir itself
		dump    string
		wantErr []string // with "$D" for the directory
	}{
		{name: "empty directory is an empty config"},
		{name: "dotfiles and dot-directories are skipped",
			files: map[string]string{"a": cfgRule("a", "k", 1), ".b.yaml": "garbage: [", ".sub/c.yaml": "garbage: [", "..2026_01_01/d": "garbage: ["},
			dump:  "a.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"},
		{name: "subdirectories are read, depth first in name order",
			files: map[string]string{"b": cfgRule("d", "b", 1), "a/z": cfgRule("d", "az", 2), "a/b/c": cfgRule("d", "abc", 3), "c": cfgRule("e", "c", 4)},
			opt:   LoadOptions{MergeDomains: true},
			dump: "d.abc: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n" +
				"d.az: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n" +
				"d.b: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n" +
				"e.c: unit=MINUTE requests_per_unit=4, shadow_mode: false, quota_mode: false\n"},
		{name: "an error in a subdirectory names the file",
			files:   map[string]string{"a": cfgRule("d", "k", 1), "sub/b": cfgRule("d", "j", 2)},
			wantErr: []string{"rls: $D/sub/b: domain: duplicate domain 'd' in config file"}},
		{name: "IgnoreDotfiles changes nothing",
			files: map[string]string{"a": cfgRule("a", "k", 1), ".b.yaml": "garbage: ["},
			opt:   LoadOptions{IgnoreDotfiles: true},
			dump:  "a.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"},
		{name: "a single file", path: "one.yml",
			files: map[string]string{"one.yml": cfgRule("a", "k", 1), "two.yml": "garbage: ["},
			dump:  "a.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"},
		{name: "a single dotfile is read when named", path: ".one",
			files: map[string]string{".one": cfgRule("a", "k", 1)},
			dump:  "a.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"},
		{name: "domains sorted whatever the file order",
			files: map[string]string{"1.yaml": cfgRule("zeta", "k", 1), "2.yaml": cfgRule("alpha", "k", 2)},
			dump:  "alpha.k: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\nzeta.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"},
		{name: "duplicate domain",
			files:   map[string]string{"a.yaml": cfgRule("d", "k", 1), "b.yaml": cfgRule("d", "j", 2)},
			wantErr: []string{"rls: $D/b.yaml: domain: duplicate domain 'd' in config file"}},
		{name: "merged domains",
			files: map[string]string{"a.yaml": cfgRule("d", "k", 1), "b.yaml": cfgRule("d", "j", 2)},
			opt:   LoadOptions{MergeDomains: true},
			dump:  "d.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\nd.j: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"},
		{name: "merged domains still reject duplicate descriptors",
			files:   map[string]string{"a.yaml": cfgRule("d", "k", 1), "b.yaml": cfgRule("d", "k", 2)},
			opt:     LoadOptions{MergeDomains: true},
			wantErr: []string{"rls: $D/b.yaml: descriptors[0]: duplicate descriptor composite key 'd.k'"}},
		{name: "errors of every file",
			files: map[string]string{"a.yaml": "domain: a\nx: 1\n", "b.yaml": "", "c.yaml": cfgRule("c", "k", 1)},
			wantErr: []string{
				"rls: $D/a.yaml: x: unknown key 'x' (line 2)",
				"rls: $D/b.yaml: domain: config file cannot have empty domain",
			}},
		{name: "missing path", path: "nope",
			wantErr: []string{"rls: stat $D/nope: no such file or directory"}},
		{name: "kubernetes configmap mount",
			setup: func(t *testing.T, dir string) {
				cfgWrite(t, dir, map[string]string{"..2026_01_02_03_04_05.123/ratelimit.yaml": cfgRule("cm", "k", 7)})
				cfgSymlink(t, "..2026_01_02_03_04_05.123", filepath.Join(dir, "..data"))
				cfgSymlink(t, "..data/ratelimit.yaml", filepath.Join(dir, "ratelimit.yaml"))
				cfgSymlink(t, "..data/removed.yaml", filepath.Join(dir, "removed.yaml")) // dangling
			},
			dump: "cm.k: unit=MINUTE requests_per_unit=7, shadow_mode: false, quota_mode: false\n"},
		{name: "a directory reached through a symlink too is read once; a symlink loop ends",
			setup: func(t *testing.T, dir string) {
				cfgWrite(t, dir, map[string]string{"real/a.yaml": cfgRule("a", "k", 1)})
				cfgSymlink(t, "real", filepath.Join(dir, "link"))
				cfgSymlink(t, "..", filepath.Join(dir, "real", "up"))
			},
			dump: "a.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n"},
		{name: "a ConfigMap item in a subdirectory is read through its link",
			setup: func(t *testing.T, dir string) {
				cfgWrite(t, dir, map[string]string{"..2026_01_01/sub/a.yaml": cfgRule("cm", "k", 7)})
				cfgSymlink(t, "..2026_01_01", filepath.Join(dir, "..data"))
				cfgSymlink(t, "..data/sub", filepath.Join(dir, "sub"))
			},
			dump: "cm.k: unit=MINUTE requests_per_unit=7, shadow_mode: false, quota_mode: false\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cfgWrite(t, dir, tt.files)
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			c, err := Load(filepath.Join(dir, tt.path), tt.opt)
			if tt.wantErr != nil {
				want := strings.ReplaceAll(strings.Join(tt.wantErr, "\n"), "$D", dir)
				if err == nil || err.Error() != want {
					t.Fatalf("error:\n got %v\nwant %s", err, want)
				}
				if c != nil {
					t.Error("config returned with an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Dump(); got != tt.dump {
				t.Errorf("Dump:\n%s\nwant:\n%s", got, tt.dump)
			}
		})
	}
}

// TestZeroConfig: the zero and nil Config are empty and valid.
func TestZeroConfig(t *testing.T) {
	for _, c := range []*Config{nil, {}} {
		if c.Domain("x") != nil || c.Rules() != nil || c.Domains() != nil || c.Dump() != "" {
			t.Errorf("%#v is not empty", c)
		}
		if r := c.Domain("x").Match(cfgEntries("k", "v")); r != nil {
			t.Errorf("unknown domain matched %v", r)
		}
	}
}

// FuzzParseConfig: Parse never panics; it returns either errors, each line
// naming the file, or a config whose Dump is stable across parses.
func FuzzParseConfig(f *testing.F) {
	for _, p := range []string{"testdata/seed/ratelimit.yaml", "testdata/full/api.yaml", "testdata/full/internal.conf"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatal("config and error")
			}
			for _, line := range cfgErrLines(err) {
				if !strings.HasPrefix(line, "rls: fuzz.yaml: ") {
					t.Fatalf("error line without the file: %q", line)
				}
			}
			return
		}
		d := c.Dump()
		c2, err := Parse("fuzz.yaml", data)
		if err != nil || c2.Dump() != d {
			t.Fatalf("unstable: %v\n%q\n%q", err, d, c2.Dump())
		}
		for i, r := range c.Rules() {
			if r.Index != i || !strings.HasPrefix(r.StatKey, r.Domain+".") || c.Domain(r.Domain) == nil {
				t.Fatalf("bad rule %d: %+v", i, r)
			}
		}
	})
}

// TestParseBounds: nested aliases cannot blow up, and a file with many
// errors lists the first cfgMaxErrors.
func TestParseBounds(t *testing.T) {
	var bomb strings.Builder
	bomb.WriteString("domain: d\ndescriptors:\n  - &d0 {key: k0, rate_limit: {unit: second}}\n")
	for i := 1; i < 10; i++ {
		prev := "*d" + strconv.Itoa(i-1)
		bomb.WriteString("  - &d" + strconv.Itoa(i) + " {key: k" + strconv.Itoa(i) + ", descriptors: [" +
			strings.Repeat(prev+", ", 9) + prev + "]}\n")
	}
	_, err := Parse("bomb.yaml", []byte(bomb.String()))
	if got := cfgErrLines(err); len(got) != 1 || got[0] != "rls: bomb.yaml: config expands to too many yaml nodes through aliases" {
		t.Errorf("alias bomb: %q", got)
	}

	for _, cyc := range []string{
		"domain: d\ndescriptors: &x [{key: a, descriptors: *x}]\n",
		"&m {domain: d, <<: *m}\n",
		"domain: d\ndescriptors:\n  - &m {key: a, <<: [*m, *m, *m, *m]}\n",
	} {
		if _, err := Parse("cycle.yaml", []byte(cyc)); err == nil {
			t.Errorf("alias cycle %q accepted", cyc)
		}
	}

	var many strings.Builder
	many.WriteString("domain: d\ndescriptors:\n")
	for range 150 {
		many.WriteString("  - {key: k, rate_limit: {unit: fortnight}}\n")
	}
	_, err = Parse("many.yaml", []byte(many.String()))
	got := cfgErrLines(err)
	if len(got) != cfgMaxErrors+1 || got[cfgMaxErrors] != "rls: many.yaml: 199 more errors" {
		t.Errorf("many errors: %d lines, last %q", len(got), got[len(got)-1])
	}
}

// The seed scenario's config: per client IP, per method and path.
func ExampleParse() {
	cfg, err := Parse("ratelimit.yaml", []byte(`
domain: ratelimit
descriptors:
  - key: remote_address
    descriptors:
      - key: PATH
        rate_limit:
          unit: minute
          requests_per_unit: 100
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print(cfg.Dump())

	r := cfg.Domain("ratelimit").Match([]*rlv3.RateLimitDescriptor_Entry{
		{Key: "remote_address", Value: "203.0.113.7"},
		{Key: "PATH", Value: "POST /login"},
	})
	fmt.Println(r.StatKey, r.RequestsPerUnit, r.Unit)

	_, err = Parse("ratelimit.yaml", []byte("domain: ratelimit\ndescriptors:\n  - key: PATH\n    rate_limit: {unit: fortnight}\n"))
	fmt.Println(err)
	// Output:
	// ratelimit.remote_address.PATH: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false
	// ratelimit.remote_address.PATH 100 MINUTE
	// rls: ratelimit.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'
}

// TestParseDepthBound: descriptors nested 64 levels deep load; one level
// more is an error naming the file, as is metadata nested deeper than 64.
func TestParseDepthBound(t *testing.T) {
	nest := func(levels int) string {
		s := "{key: k, rate_limit: {unit: minute, requests_per_unit: 1}}"
		for range levels - 1 {
			s = "{key: k, descriptors: [" + s + "]}"
		}
		return "domain: d\ndescriptors: [" + s + "]\n"
	}
	c, err := Parse("deep.yaml", []byte(nest(cfgMaxDepth)))
	if err != nil {
		t.Fatalf("%d levels: %v", cfgMaxDepth, err)
	}
	if n := len(c.Rules()); n != 1 {
		t.Fatalf("%d levels: %d rules, want 1", cfgMaxDepth, n)
	}
	if _, err := Parse("deep.yaml", []byte(nest(cfgMaxDepth+1))); err == nil ||
		!strings.Contains(err.Error(), "rls: deep.yaml: ") || !strings.Contains(err.Error(), "descriptors nested deeper than 64 levels") {
		t.Fatalf("%d levels: err = %v", cfgMaxDepth+1, err)
	}
	meta := "1"
	for range cfgMaxDepth + 1 {
		meta = "{m: " + meta + "}"
	}
	_, err = Parse("meta.yaml", []byte("domain: d\ndescriptors: [{key: k, metadata: "+meta+"}]\n"))
	if err == nil || !strings.Contains(err.Error(), "metadata nested deeper than 64 levels") {
		t.Fatalf("deep metadata: err = %v", err)
	}
}
