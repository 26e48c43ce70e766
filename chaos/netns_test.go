package chaos

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNetnsLifecycle makes two hosts, partitions and heals one, and checks
// that Close leaves no namespace or link of its prefix behind.
func TestNetnsLifecycle(t *testing.T) {
	if why := NetnsUnavailable(); why != "" {
		t.Skip(why)
	}
	x, err := NewNetns(2)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			x.Close()
		}
	})
	ipOut := func(args ...string) string {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	if out := ipOut("netns", "list"); !strings.Contains(out, x.Name(0)) || !strings.Contains(out, x.Name(1)) {
		t.Fatalf("namespaces missing: %s", out)
	}
	for i := 0; i < 2; i++ {
		addrs := ipOut("-n", x.Name(i), "-o", "addr", "show")
		for _, ip := range []string{x.ClusterIP(i) + "/24", x.ClientIP(i) + "/24", "127.0.0.1/8"} {
			if !strings.Contains(addrs, ip) {
				t.Errorf("host %d lacks %s:\n%s", i, ip, addrs)
			}
		}
	}
	root, _ := x.link(1, 0)
	state := func() string { return ipOut("-o", "link", "show", "dev", root) }
	if err := x.Isolate(1); err != nil {
		t.Fatal(err)
	}
	if s := state(); strings.Contains(s, "UP,") || !strings.Contains(s, "state DOWN") {
		t.Errorf("after Isolate: %s", s)
	}
	client, _ := x.link(1, 1)
	if s := ipOut("-o", "link", "show", "dev", client); !strings.Contains(s, "UP,") {
		t.Errorf("Isolate took the client link down too: %s", s)
	}
	if err := x.Heal(1); err != nil {
		t.Fatal(err)
	}
	if s := state(); !strings.Contains(s, "UP,") {
		t.Errorf("after Heal: %s", s)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if out := ipOut("netns", "list"); strings.Contains(out, x.Prefix) {
		t.Errorf("namespaces left: %s", out)
	}
	if out := ipOut("-o", "link", "show"); strings.Contains(out, x.Prefix) {
		t.Errorf("links left: %s", out)
	}
}
