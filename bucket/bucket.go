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
)

// Algorithm selects how a Limit counts. The zero value is FixedWindow.
type Algorithm uint8

const (
	// FixedWindow counts hits in windows aligned to the Unix epoch:
	// window start = floor(now/Unit)*Unit. It is envoyproxy/ratelimit's
	// algorithm and the default.
	FixedWindow Algorithm = iota
)

// String returns the config spelling of the algorithm.
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
	}
	return "unknown"
}

// known reports whether the store implements the algorithm.
func (a Algorithm) known() bool {
	return a == FixedWindow
}

// Limit is one rule as the store applies it.
type Limit struct {
	// Algorithm picks the counting scheme; zero is FixedWindow.
	Algorithm Algorithm
	// Requests is how many hits a window allows. Zero blocks every hit.
	Requests uint64
	// Unit is the window length in nanoseconds. It must be > 0.
	Unit int64
}

// Validate reports whether the store can apply l: Unit must be > 0 and
// Algorithm one this package implements. The error wraps ErrInvalidLimit.
// Any Requests value is valid (zero blocks every hit).
func (l Limit) Validate() error {
	if !l.Algorithm.known() {
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, uint8(l.Algorithm))
	}
	if l.Unit <= 0 {
		return fmt.Errorf("%w: unit must be > 0 nanoseconds, got %d", ErrInvalidLimit, l.Unit)
	}
	return nil
}

// Mode changes how Apply treats a hit.
type Mode uint8

const (
	// Consume adds the hits to the counter whether or not the result is
	// over the limit (envoyproxy/ratelimit's default).
	Consume Mode = iota
	// StopOnOver adds the hits only when the result is within the limit
	// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
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
	// Over reports that Count exceeds Limit.Requests.
	Over bool
	// Count is the counter after the hits (for Peek, as if they were
	// added; for StopOnOver when Over, the count the hits would have made).
	Count uint64
	// Remaining is Limit.Requests - Count when not Over, else 0.
	Remaining uint64
	// ResetAfter is the time in nanoseconds until the window the hits
	// count in ends: Unit - now%Unit, in (0, Unit]. The one exception is
	// a counter a peer with a faster clock already moved to the next window
	// (see Store.Merge): the hits then count in that window and ResetAfter
	// is up to 2*Unit.
	ResetAfter int64
}

// ErrInvalidLimit is returned by Limit.Validate for a limit the store
// cannot apply.
var ErrInvalidLimit = errors.New("bucket: invalid limit")
