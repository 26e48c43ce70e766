package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// testBin is the ringlimit binary built once for every test of the package,
// or the one RINGLIMIT_CHAOS_BIN names.
var testBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ringlimit-chaos-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wd, _ := os.Getwd()
	root, err := ModuleRoot(wd)
	if bin := os.Getenv("RINGLIMIT_CHAOS_BIN"); bin != "" {
		// A prebuilt binary (a release, or a snapshot while the tree does
		// not build).
		testBin, err = bin, nil
	} else if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		testBin, err = Build(ctx, root, dir)
		cancel()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		// Every test stops its processes, load drivers and connections.
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
