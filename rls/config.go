// Package rls is ringlimit's Envoy rate limit service (RLS v3): it owns the
// envoyproxy/ratelimit configuration (YAML files or RateLimitConfig
// resources from an xDS server, validation, the descriptor match tree,
// reloading on change), the counter key codec, and the service that answers
// ShouldRateLimit.
//
// A *Config and everything reachable from it (Domain, Rule) is immutable once
// Load or Parse returns it, and is safe for concurrent use; a reload builds a
// new *Config. Matching and key encoding allocate nothing.
package rls

import (
	"fmt"
	"slices"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ringlimit/ringlimit/bucket"
)

// Rule is one rate_limit of the config tree, precomputed at load time. It is
// immutable: callers must not modify it or its Replaces.
type Rule struct {
	// Index is the rule's position in Config.Rules(); stable for one *Config.
	Index int
	// Domain is the domain of the file the rule came from.
	Domain string
	// StatKey is the reference's stat key: the domain and each descriptor on
	// the config path, "key" or "key_value", joined with ".", e.g.
	// "ratelimit.remote_address.PATH". Wildcard values appear as written.
	StatKey string
	// Name is rate_limit.name ("" if none).
	Name string
	// Replaces lists the names from rate_limit.replaces, in config order.
	Replaces []string
	// Unlimited is rate_limit.unlimited: matching requests are never limited.
	Unlimited bool
	// Unit is SECOND..YEAR; UNKNOWN when Unlimited.
	Unit pb.RateLimitResponse_RateLimit_Unit
	// RequestsPerUnit is rate_limit.requests_per_unit. Zero (or missing)
	// blocks every matching request.
	RequestsPerUnit uint32
	// Limit is the rule as the counter store applies it: Requests is
	// RequestsPerUnit, Unit is UnitDuration(Unit) in nanoseconds, Algorithm
	// is rate_limit.algorithm (FixedWindow by default) and, for a
	// TokenBucket, Burst is rate_limit.burst (RequestsPerUnit by default; 0
	// otherwise). It is the zero Limit (and must not be applied) when
	// Unlimited.
	Limit bucket.Limit
	// ShadowMode is the descriptor's shadow_mode: count and report, but
	// never answer OVER_LIMIT.
	ShadowMode bool
	// QuotaMode is the descriptor's quota_mode: the rule's status says
	// OVER_LIMIT as usual, but it makes the overall code OVER_LIMIT only
	// when every quota-mode descriptor of the request is over (see
	// Options.QuotaMode).
	QuotaMode bool
	// Metadata is the descriptor's metadata, returned in the response's
	// dynamic metadata (Options.DynamicMetadata); nil if none. It must not
	// be modified.
	Metadata *structpb.Struct
	// DetailedMetric is the descriptor's detailed_metric.
	DetailedMetric bool
	// SharedCounter is true when a descriptor on the rule's path has
	// share_threshold: at that level the counter key carries the value
	// pattern (e.g. "files/*") instead of the request's value, so every
	// value the pattern matches counts on one counter, as in the
	// reference. See Domain.AppendKey.
	SharedCounter bool
	// counterTag ends the counter key of a rule with a sliding_window or
	// token_bucket algorithm: the algorithm and the unit (see
	// Domain.AppendKey). "" for a fixed window.
	counterTag string
	// Extension is non-nil when the rule's rate_limit uses ringlimit's
	// extension fields (algorithm, burst), which envoyproxy/ratelimit
	// rejects: it names the file, the rate_limit and the fields, as a
	// warning to print. Limit carries the algorithm and burst.
	Extension *FieldError
}

// Config is a loaded rate limit configuration: a set of domains, each a tree
// of descriptors. The zero Config is valid and empty (every domain unknown).
// It is immutable after load and safe for concurrent use.
type Config struct {
	domains map[string]*Domain
	names   []string // sorted domain names
	rules   []*Rule  // by Index
	dump    string
	version string // the xDS version_info it came as; "" from files
}

// Domain is one domain's descriptor tree. It is immutable and safe for
// concurrent use. A nil *Domain is an unknown domain: it matches nothing.
type Domain struct {
	name string
	root matchNode
}

// Domain returns the named domain, or nil if the config has none by that name.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Rules returns every rule of the config, ordered by domain name, then by
// file (sorted by name) and position in the file (depth first); Rules()[i].Index
// == i. The slice is a copy; the rules are shared and must not be modified.
func (c *Config) Rules() []*Rule {
	if c == nil {
		return nil
	}
	return slices.Clone(c.rules)
}

// Domains returns the names of the config's domains, sorted. The slice is a
// copy.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.names)
}

// Dump returns the config as the reference's /rlconfig shows it: one line per
// rule, in Rules() order, "<StatKey>: unit=MINUTE requests_per_unit=100,
// shadow_mode: false, quota_mode: false". Unlimited rules show unit=UNKNOWN. A rule with
// another algorithm than fixed_window adds ", algorithm: sliding_window" or
// ", algorithm: token_bucket, burst: 20".
func (c *Config) Dump() string {
	if c == nil {
		return ""
	}
	return c.dump
}

// Name returns the domain's name ("" for a nil Domain).
func (d *Domain) Name() string {
	if d == nil {
		return ""
	}
	return d.name
}

// UnitDuration returns the length of a rate limit unit in nanoseconds: a
// month is 30 days and a year 365 days, as in the reference. It returns 0 for
// UNKNOWN and any value outside SECOND..YEAR.
func UnitDuration(u pb.RateLimitResponse_RateLimit_Unit) int64 {
	const day = 24 * 3600 * 1e9
	switch u {
	case pb.RateLimitResponse_RateLimit_SECOND:
		return 1e9
	case pb.RateLimitResponse_RateLimit_MINUTE:
		return 60 * 1e9
	case pb.RateLimitResponse_RateLimit_HOUR:
		return 3600 * 1e9
	case pb.RateLimitResponse_RateLimit_DAY:
		return day
	case pb.RateLimitResponse_RateLimit_WEEK:
		return 7 * day
	case pb.RateLimitResponse_RateLimit_MONTH:
		return 30 * day
	case pb.RateLimitResponse_RateLimit_YEAR:
		return 365 * day
	}
	return 0
}

// FieldError is one problem found in a config file. Load and Parse return
// every FieldError they find, joined with errors.Join.
type FieldError struct {
	// File is the file name as given to Parse, or the path Load read.
	File string
	// Path is the field path inside the file, e.g.
	// "descriptors[0].rate_limit.unit"; "" for the file as a whole.
	Path string
	// Line is the 1-based line of the field when known, else 0.
	Line int
	// Msg is the problem, in the reference's wording where it has one.
	Msg string
}

// Error formats the problem as "rls: <file>: <path>: <msg>". Errors the YAML
// decoder reports (syntax, types, unknown keys) end with "(line N)".
func (e *FieldError) Error() string {
	var b strings.Builder
	b.WriteString("rls: ")
	b.WriteString(e.File)
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// cfgDumpRule formats one /rlconfig line.
func cfgDumpRule(b *strings.Builder, r *Rule) {
	fmt.Fprintf(b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t",
		r.StatKey, r.Unit.String(), r.RequestsPerUnit, r.ShadowMode, r.QuotaMode)
	cfgDumpExt(b, r)
	b.WriteByte('\n')
}
