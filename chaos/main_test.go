package chaos

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// testBin is the ringlimit binary built once for every test of the package.
var testBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ringlimit-chaos-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wd, _ := os.Getwd()
	root, err := ModuleRoot(wd)
	if err == nil {
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
	os.Exit(code)
}
