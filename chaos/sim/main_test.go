package sim

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests. Each
// seed runs in a synctest bubble, which fails by itself if something it
// started is still blocked when it ends; this also catches what a run
// might start outside one.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines still running after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
