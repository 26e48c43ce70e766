package cluster

import (
	"time"

	"github.com/ringlimit/ringlimit/cluster/clock"
)

// nodeClock adapts NodeConfig.Clock (Unix ns; nil: the system clock) to
// the clock.Clock the forwarder, replication and membership take.
func nodeClock(unixNs func() int64) clock.Clock {
	if unixNs == nil {
		return clock.Real()
	}
	return funcClock{Clock: clock.Real(), unixNs: unixNs}
}

// funcClock tells the time of a Unix ns function; its timers are the
// system's.
type funcClock struct {
	clock.Clock // clock.Real(): timers and tickers
	unixNs      func() int64
}

// Now returns unixNs's time, with the system's monotonic reading moved by
// the same offset: for the wall clock (what cmd passes) that is
// time.Now(), so durations taken on it ignore steps of the wall clock.
func (c funcClock) Now() time.Time {
	t := time.Now()
	return t.Add(time.Duration(c.unixNs() - t.UnixNano()))
}
