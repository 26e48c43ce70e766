package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
)

// --dry-run prints every flag as name=value, from flags, RINGLIMIT_* and
// the reference's variables, and then the config it loaded.
func TestDryRunPrintsSettings(t *testing.T) {
	var out, errb bytes.Buffer
	env := environment{"RINGLIMIT_HTTP_ADDR=127.0.0.1:9080", "LOG_FORMAT=json"}
	code := serveCmd(context.Background(), []string{"--config", "../../deploy/examples/config", "--node-name", "n1", "--dry-run"}, env, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := map[string]string{}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	for _, l := range lines[:len(lines)-1] {
		name, value, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("line %q is not name=value", l)
		}
		got[name] = value
	}
	if last := lines[len(lines)-1]; last != "# config: 1 domain(s), 1 rule(s)" {
		t.Errorf("last line %q", last)
	}
	for name, want := range map[string]string{
		"config":           "../../deploy/examples/config",
		"node-name":        "n1",
		"http-addr":        "127.0.0.1:9080", // RINGLIMIT_HTTP_ADDR
		"log-format":       "json",           // LOG_FORMAT, the reference's
		"grpc-addr":        ":8081",          // the default
		"shutdown-timeout": "15s",
		"replicas":         "2",
	} {
		if got[name] != want {
			t.Errorf("%s=%q, want %q", name, got[name], want)
		}
	}
	fs, _ := newServeFlags(&serveConfig{}, io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := got[f.Name]; !ok {
			t.Errorf("--%s not printed", f.Name)
		}
	})
}

// A flag holding a secret itself prints <redacted>; paths to key files
// print as they are.
func TestSettingsRedactSecrets(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.String("gossip-key", "c2VjcmV0", "")
	fs.String("gossip-keys", "a2V5MQ==,a2V5Mg==", "")
	fs.String("admin-token", "t0ken", "")
	fs.String("empty-secret", "", "")
	fs.String("peer-tls-key", "/tls/key.pem", "")
	fs.String("gossip-key-file", "/etc/gossip.key", "")
	fs.Int("max-keys", 1024, "")
	var out bytes.Buffer
	(&serveConfig{parsed: &parsedFlags{flags: fs}}).writeSettings(&out)
	want := "admin-token=<redacted>\nempty-secret=\ngossip-key=<redacted>\ngossip-key-file=/etc/gossip.key\ngossip-keys=<redacted>\nmax-keys=1024\npeer-tls-key=/tls/key.pem\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// The values of the xDS stream's gRPC metadata are credentials as often as
// not (authorization:Bearer ...): --dry-run prints their keys only.
func TestDryRunRedactsXDSHeaderValues(t *testing.T) {
	var out, errb bytes.Buffer
	env := environment{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer s3cret,x-team:t2am"}
	code := serveCmd(context.Background(), []string{"--node-name", "n1", "--dry-run"}, env, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if s := out.String(); strings.Contains(s, "s3cret") || strings.Contains(s, "t2am") ||
		!strings.Contains(s, "\nxds-headers=authorization:<redacted>,x-team:<redacted>\n") {
		t.Errorf("dry run prints the xds headers' values, or not their keys:\n%s", s)
	}
}
