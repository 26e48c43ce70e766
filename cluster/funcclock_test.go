package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestNodeClock(t *testing.T) {
	if got := nodeClock(func() int64 { return 42 }).Now().UnixNano(); got != 42 {
		t.Errorf("Now = %d ns, want the function's 42", got)
	}
	// On the wall clock, readings keep a monotonic part (printed as m=).
	wall := nodeClock(func() int64 { return time.Now().UnixNano() })
	if s := wall.Now().String(); !strings.Contains(s, "m=") {
		t.Errorf("Now = %s, want a monotonic reading", s)
	}
	if nodeClock(nil) == nil {
		t.Error("nodeClock(nil) is nil, want the system clock")
	}
}
