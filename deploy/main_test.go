package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// binDir holds the ringlimit binary the tests build; TestMain owns it.
var binDir string

// ringlimitBinary builds ./cmd/ringlimit once per test binary, the way the
// Dockerfile does (static, CGO_ENABLED=0, so the process resolves names with
// Go's own resolver from /etc/hosts, as in the image).
var ringlimitBinary = sync.OnceValues(func() (string, error) {
	out := filepath.Join(binDir, "ringlimit")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./cmd/ringlimit")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ringlimit: %v\n%s", err, b)
	}
	return out, nil
})

// needBinary returns the built ringlimit binary or fails the test.
func needBinary(t *testing.T) string {
	t.Helper()
	bin, err := ringlimitBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ringlimit-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := 0
	func() {
		defer os.RemoveAll(dir)
		code = runWithLeakCheck(m)
	}()
	os.Exit(code)
}

// runWithLeakCheck runs the tests and then fails if goroutines leaked.
func runWithLeakCheck(m *testing.M) int {
	code := m.Run()
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
