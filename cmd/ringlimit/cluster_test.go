package main

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/bucket"
)

// A node whose --node-name defaults to the hostname is told so when it
// joins a cluster: two nodes on one host would claim one identity.
func TestNodeNameFromHostnameWarns(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--join", "127.0.0.1:1"}, true},
		{[]string{"--join", "127.0.0.1:1", "--node-name", "n1"}, false},
	} {
		args := append([]string{"--gossip-addr", "127.0.0.1:0", "--advertise-addr", "127.0.0.1"}, tc.args...)
		c, _, err := parseServeFlags(args, nil, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if tc.warn && (c.NodeName != host || !c.nodeNameFromHost) {
			t.Fatalf("%v: node name %q (from host %v), want the hostname %q", tc.args, c.NodeName, c.nodeNameFromHost, host)
		}
		var logs bytes.Buffer
		n, err := startCluster(c, "127.0.0.1:0", bucket.NewStore(bucket.StoreConfig{}), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)), nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		n.close()
		if got := strings.Contains(logs.String(), "--node-name not set"); got != tc.warn {
			t.Fatalf("%v: warned %v, want %v:\n%s", tc.args, got, tc.warn, logs.String())
		}
	}
}
