package cluster

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// mshipLeakGrace bounds how long TestMain waits for goroutines to finish.
// memberlist's Shutdown does not join its own goroutines: a probe in flight
// ends only when its probe interval (scaled by memberlist's health awareness,
// at most 8 x 1s) runs out, later on a busy machine. Nothing is ignored: a
// goroutine still running after the grace period fails the package.
const mshipLeakGrace = 20 * time.Second

// TestMain fails the package if any goroutine outlives the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(mshipLeakGrace)
		tick := time.NewTicker(50 * time.Millisecond)
		for err := goleak.Find(); err != nil; err = goleak.Find() {
			if time.Now().After(deadline) {
				fmt.Fprintf(os.Stderr, "goleak: goroutines still running %v after the tests: %v\n", mshipLeakGrace, err)
				code = 1
				break
			}
			<-tick.C
		}
		tick.Stop()
	}
	os.Exit(code)
}
