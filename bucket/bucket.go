// Package bucket owns rate-limit counters: the algorithms that decide a hit
// and the sharded in-memory store that keeps their state.
//
// Time is always an argument (Unix nanoseconds, UTC); nothing in this package
// reads the clock. A Store is safe for concurrent use; the value types are not
// shared and need no locking.
package bucket

import (
	"errors"
	"fmt"
	"math"
)

// Algorithm selects how a Limit counts. The zero value is FixedWindow.
type Algorithm uint8

const (
	// FixedWindow counts hits in windows aligned to the Unix epoch:
	// window start = floor(now/Unit)*Unit. It is envoyproxy/ratelimit's
	// algorithm and the default.
	FixedWindow Algorithm = iota
	// SlidingWindow is a weighted two-window counter (see sliding.go): the
	// usage at now is prev*(Unit-elapsed)/Unit + cur, where cur counts the
	// hits of now's epoch-aligned window, prev those of the window before
	// it and elapsed is how far now is into its window. It approximates an
	// exact sliding log; docs/algorithms.md states and measures the error.
	SlidingWindow
	// TokenBucket is the generic cell rate algorithm (GCRA, see token.go):
	// a bucket of Burst tokens that refills Requests tokens per Unit,
	// evenly. Its state is one theoretical arrival time.
	TokenBucket
)

// String returns the config spelling of the algorithm.
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
	case SlidingWindow:
		return "sliding_window"
	case TokenBucket:
		return "token_bucket"
	}
	return "unknown"
}

// ParseAlgorithm returns the algorithm spelled s ("fixed_window",
// "sliding_window" or "token_bucket", as String returns them). It reports
// false for anything else.
func ParseAlgorithm(s string) (Algorithm, bool) {
	for a := FixedWindow; a <= TokenBucket; a++ {
		if s == a.String() {
			return a, true
		}
	}
	return 0, false
}

// known reports whether the store implements the algorithm.
func (a Algorithm) known() bool {
	return a <= TokenBucket
}

// Limit is one rule as the store applies it.
type Limit struct {
	// Algorithm picks the counting scheme; zero is FixedWindow.
	Algorithm Algorithm
	// Requests is how many hits a window allows (FixedWindow,
	// SlidingWindow), or how many tokens a TokenBucket gains per Unit.
	// Zero blocks every hit, whatever the algorithm.
	Requests uint64
	// Unit is the window length in nanoseconds, or for TokenBucket the
	// period in which it regains Requests tokens. It must be > 0.
	Unit int64
	// Burst is a TokenBucket's capacity in tokens: the most hits it admits
	// at once after a quiet period. Zero means Requests. The other
	// algorithms ignore it.
	Burst uint64
}

// Capacity returns the most hits the limit admits at once, the number
// Result.Count is compared with: Burst for a TokenBucket (Requests when
// Burst is 0, and 0 when Requests is 0, which blocks every hit), Requests
// otherwise.
func (l Limit) Capacity() uint64 {
	if l.Algorithm != TokenBucket || l.Requests == 0 {
		return l.Requests
	}
	if l.Burst == 0 {
		return l.Requests
	}
	return l.Burst
}

// Validate reports whether the store can apply l: Unit must be > 0,
// Algorithm one this package implements and, for a SlidingWindow, Requests
// at most math.MaxUint32. The error wraps ErrInvalidLimit. Any other
// Requests value is valid (zero blocks every hit).
func (l Limit) Validate() error {
	if !l.Algorithm.known() {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, uint8(l.Algorithm))
	}
	if l.Unit <= 0 {
		return fmt.Errorf("%w: unit must be > 0 nanoseconds, got %d", ErrInvalidLimit, l.Unit)
	}
	if l.Algorithm == SlidingWindow && l.Requests > math.MaxUint32 {
		return fmt.Errorf("%w: a sliding window allows at most %d requests, got %d", ErrInvalidLimit, uint64(math.MaxUint32), l.Requests)
	}
	return nil
}

// Mode changes how Apply treats a hit.
type Mode uint8

const (
	// Consume adds the hits to the counter whether or not the result is
	// over the limit (envoyproxy/ratelimit's default) for FixedWindow.
	// SlidingWindow and TokenBucket never count hits they refuse, so for
	// them Consume is StopOnOver: counting refused hits would carry into
	// later windows (or, for a bucket, without bound) and a client sending
	// steadily above the limit would get nothing through at all.
	Consume Mode = iota
	// StopOnOver adds the hits only when the result is within the limit.
	// (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is
	// not this: it still counts a descriptor that is over; see rls.)
	StopOnOver
	// Peek computes the result as if the hits were added but changes
	// nothing and creates no entry.
	Peek
)

// Op is one decision to make: add Hits to the counter named Key under Limit.
// Hits == 0 checks without consuming.
type Op struct {
	// Key names the counter. Apply does not retain it: the store copies
	// it when it creates an entry.
	Key []byte
	// Limit is the rule to apply; it should pass Validate.
	Limit Limit
	// Hits is how many hits to add; 0 only checks (and creates nothing).
	// Counts saturate at math.MaxUint64 instead of wrapping.
	Hits uint64
	// Mode is how the hits are added; the zero value is Consume.
	Mode Mode
}

// Result is the outcome of one Op.
type Result struct {
	// Over reports that Count exceeds Limit.Capacity().
	Over bool
	// Count is the usage the decision was made on, after the hits (for
	// Peek, as if they were added; when the hits were refused, the usage
	// they would have made). FixedWindow: the hits counted in the window.
	// SlidingWindow: the estimate prev*(Unit-elapsed)/Unit, rounded up,
	// plus cur. TokenBucket: the tokens in use, (max(TAT,now)-now)/T
	// rounded up, where T = Unit/Requests. It saturates at math.MaxUint64.
	Count uint64
	// Remaining is Limit.Capacity() - Count when not Over, else 0: how
	// many more hits would be admitted right now.
	Remaining uint64
	// ResetAfter is a time in nanoseconds, >= 0.
	//
	// FixedWindow: the time until the window the hits count in ends,
	// Unit - now%Unit, in (0, Unit]. The one exception is a counter a peer
	// with a faster clock already moved to the next window (see
	// Store.Merge): the hits then count in that window and ResetAfter is up
	// to 2*Unit.
	//
	// SlidingWindow and TokenBucket: when Over, the time until an op of
	// min(max(Hits,1), Capacity()) hits would be admitted if nothing else
	// were counted (0 when Hits exceed the capacity and that many would be
	// admitted now); when not Over, the time until the whole capacity is
	// back (0 when it is). A SlidingWindow reports at most 3*Unit and a
	// TokenBucket about Burst*Unit/Requests (more only after merging a
	// state from a peer whose clock runs ahead). A limit with Requests 0
	// reports the FixedWindow value for SlidingWindow and Unit for
	// TokenBucket.
	ResetAfter int64
}

// ErrInvalidLimit is returned by Limit.Validate for a limit the store
// cannot apply.
var ErrInvalidLimit = errors.New("bucket: invalid limit")
