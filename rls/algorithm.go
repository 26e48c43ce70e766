package rls

import (
	"fmt"
	"strings"

	"github.com/ringlimit/ringlimit/bucket"
)

// This file parses ringlimit's extension of rate_limit: algorithm and burst.
// envoyproxy/ratelimit rejects both keys, so a rule that uses them carries a
// warning (Rule.Extension) that `ringlimit validate` prints.

// extensionMsg is the warning a rule using the extension fields carries.
const extensionMsg = "ringlimit extension; envoyproxy/ratelimit rejects it"

// cfgExt is the extension part of one parsed rate_limit.
type cfgExt struct {
	algo  bucket.Algorithm // FixedWindow unless algorithm says otherwise
	burst uint32           // 0: not set

	// What the file said, for validation and the warning.
	algoSet, burstSet   bool
	algoName            string
	algoLine, burstLine int
}

// rateExt records an algorithm or burst key of a rate_limit; fp is its path.
func (p *cfgParser) rateExt(e *cfgExt, pr cfgPair, fp string) {
	switch pr.key {
	case "algorithm":
		e.algoSet, e.algoLine = true, pr.line
		e.algoName = p.str(pr.val, fp)
	case "burst":
		e.burstSet, e.burstLine = true, pr.line
		e.burst = p.uint32(pr.val, fp)
	}
}

// checkRateExt validates the extension fields of the rate_limit r at path,
// once all its keys are read. Algorithms are case-insensitive, as units are.
func (p *cfgParser) checkRateExt(path string, r *cfgRate) {
	e := &r.ext
	valid := true // algorithm absent or known
	if e.algoSet {
		var a bucket.Algorithm
		a, valid = bucket.ParseAlgorithm(strings.ToLower(e.algoName))
		switch {
		case r.unlimited:
			p.fail(cfgJoin(path, "algorithm"), e.algoLine, "should not specify rate limit algorithm when unlimited")
		case !valid:
			p.fail(cfgJoin(path, "algorithm"), e.algoLine,
				"invalid rate limit algorithm '%s': want fixed_window, sliding_window or token_bucket", e.algoName)
		default:
			e.algo = a
		}
	}
	if !e.burstSet {
		return
	}
	fp := cfgJoin(path, "burst")
	switch {
	case r.unlimited:
		p.fail(fp, e.burstLine, "should not specify burst when unlimited")
	case !valid: // reported above
	case e.algo != bucket.TokenBucket:
		p.fail(fp, e.burstLine, "burst is only valid with algorithm token_bucket, not %s", e.algo)
	case e.burst == 0:
		p.fail(fp, e.burstLine, "burst must be at least 1")
	}
}

// limit returns the bucket.Limit of a limited rule with rpu requests per
// unit u: a token bucket's burst defaults to rpu.
func (e *cfgExt) limit(rpu uint32, u int64) bucket.Limit {
	l := bucket.Limit{Algorithm: e.algo, Requests: uint64(rpu), Unit: u}
	if e.algo == bucket.TokenBucket {
		l.Burst = uint64(rpu)
		if e.burstSet {
			l.Burst = uint64(e.burst)
		}
	}
	return l
}

// warning returns the warning for a rule whose rate_limit, at ratePath in
// file, uses extension fields; nil when it uses none.
func (e *cfgExt) warning(file, ratePath string) *FieldError {
	var fields []string
	if e.algoSet {
		fields = append(fields, "algorithm")
	}
	if e.burstSet {
		fields = append(fields, "burst")
	}
	if len(fields) == 0 {
		return nil
	}
	line := e.algoLine
	if !e.algoSet {
		line = e.burstLine
	}
	return &FieldError{File: file, Path: ratePath, Line: line,
		Msg: fmt.Sprintf("%s: %s", strings.Join(fields, ", "), extensionMsg)}
}

// cfgDumpExt appends a rule's algorithm and burst to its /rlconfig line when
// it is not a fixed window, so reference rules dump exactly as the
// reference does.
func cfgDumpExt(b *strings.Builder, r *Rule) {
	switch r.Limit.Algorithm {
	case bucket.FixedWindow:
	case bucket.TokenBucket:
		fmt.Fprintf(b, ", algorithm: %s, burst: %d", r.Limit.Algorithm, r.Limit.Burst)
	default:
		fmt.Fprintf(b, ", algorithm: %s", r.Limit.Algorithm)
	}
}
