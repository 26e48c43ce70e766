package deploy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// freeRunPortBase returns a RUN_PORT_BASE whose ports for nodes nodes are
// free on 127.0.0.1 now (bounded tries).
func freeRunPortBase(t *testing.T, nodes int) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(400)*100
		free := true
		for i := 0; i < nodes && free; i++ {
			for p := 0; p < 4 && free; p++ {
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i*100+p))
				if err != nil {
					free = false
					break
				}
				l.Close()
			}
		}
		if free {
			return base
		}
	}
	t.Fatal("no free RUN_PORT_BASE found")
	return 0
}

// make run's script, started as a shell starts a foreground job (its own
// process group, which Ctrl-C signals as a whole), stops every node it
// started and exits 0 on SIGINT, also when its stdout has been closed
// (`make run | tee log`: tee takes the SIGINT too and goes first).
func TestRunClusterCtrlC(t *testing.T) {
	bin := needBinary(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("run-cluster.sh needs curl")
	}
	for _, piped := range []bool{false, true} {
		name := "terminal"
		if piped {
			name = "stdout closed first"
		}
		t.Run(name, func(t *testing.T) {
			const nodes = 2
			base := freeRunPortBase(t, nodes)
			cmd := exec.Command(filepath.Join(repoRoot, "deploy/local/run-cluster.sh"), bin, fmt.Sprint(nodes))
			cmd.Env = append(os.Environ(), fmt.Sprintf("RUN_PORT_BASE=%d", base), "TMPDIR="+t.TempDir())
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pgid := cmd.Process.Pid
			exited := make(chan error, 1)
			killed := false
			defer func() {
				if !killed { // the test failed early: leave nothing running
					syscall.Kill(-pgid, syscall.SIGKILL)
					<-exited
				}
			}()

			// Read until the cluster is ready (bounded).
			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			var seen []string
			deadline := time.After(60 * time.Second)
			for ready := false; !ready; {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("script ended before the cluster was ready:\n%s\n%s", strings.Join(seen, "\n"), stderr.String())
					}
					seen = append(seen, l)
					ready = strings.HasPrefix(l, "Ctrl-C stops all nodes")
				case <-deadline:
					t.Fatalf("cluster not ready within 60 s:\n%s\n%s", strings.Join(seen, "\n"), stderr.String())
				}
			}
			go func() { exited <- cmd.Wait() }()
			want := []string{
				fmt.Sprintf("starting %d node(s) on 127.0.0.1 (ports from RUN_PORT_BASE=%d)", nodes, base),
				fmt.Sprintf("  ringlimit-1  grpc 127.0.0.1:%d  http 127.0.0.1:%d  debug 127.0.0.1:%d  gossip 127.0.0.1:%d", base+101, base+100, base+102, base+103),
				"waiting for every node to join the others and report ready...",
				fmt.Sprintf("  %s check --addr 127.0.0.1:%d --domain ratelimit", bin, base+1),
			}
			for _, w := range want {
				if !strings.Contains(strings.Join(seen, "\n"), w) {
					t.Errorf("output lacks %q:\n%s", w, strings.Join(seen, "\n"))
				}
			}
			if piped {
				out.(io.Closer).Close() // the reader is gone: writes fail with EPIPE
			} else {
				go func() { // keep reading, as a terminal would
					for range lines {
					}
				}()
			}

			killed = true
			if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("script exited with %v after SIGINT, want 0; stderr:\n%s", err, stderr.String())
				}
			case <-time.After(60 * time.Second):
				syscall.Kill(-pgid, syscall.SIGKILL)
				<-exited
				t.Fatal("script still running 60 s after SIGINT")
			}
			// Nothing of the group is left: every node was waited for.
			if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("processes of the script's group still running after it exited (kill -0: %v)", err)
				syscall.Kill(-pgid, syscall.SIGKILL)
			}
		})
	}
}
