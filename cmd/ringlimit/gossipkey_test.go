package main

import (
	"bytes"
	"encoding/base64"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster/membership"
)

// testKey is a base64 AES key of n bytes, all b.
func testKey(b byte, n int) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, n))
}

// fp is the fingerprint of testKey(b, n).
func fp(b byte, n int) string { return membership.KeyFingerprint(bytes.Repeat([]byte{b}, n)) }

func TestReadGossipKeys(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, text string
		want       []string // fingerprints
		err        string   // after the file's path
	}{
		{"one key, no newline", testKey(1, 32), []string{fp(1, 32)}, ""},
		{"keys, comments and blanks", "# rotation: new key second\n\n  " + testKey(1, 32) + "  \n#" + testKey(9, 16) + "\n\n" + testKey(2, 16) + "\n" + testKey(3, 24) + "\n",
			[]string{fp(1, 32), fp(2, 16), fp(3, 24)}, ""},
		{"bad base64", "# keys\n" + testKey(1, 32) + "\nnot base64!\n", nil, ":3: not base64"},
		{"wrong size", testKey(1, 32) + "\n" + testKey(2, 20) + "\n", nil, ":2: key is 20 bytes, want 16, 24 or 32"},
		{"empty", "", nil, ": no key"},
		{"only comments", "# no key yet\n\n", nil, ": no key"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "key"+string(rune('a'+i)))
			if err := os.WriteFile(path, []byte(tt.text), 0o600); err != nil {
				t.Fatal(err)
			}
			keys, err := readGossipKeys(path)
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), "serve: --gossip-key-file: "+path+tt.err) {
					t.Fatalf("error %v, want one starting with the flag, %s and %q", err, path, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fingerprints(keys); !slices.Equal(got, tt.want) {
				t.Fatalf("keys %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := readGossipKeys(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "--gossip-key-file") {
		t.Errorf("missing file: %v", err)
	}
}

// A running node installs the keys of a rewritten --gossip-key-file, keeps
// its keys when the file turns bad, and says which key is primary in its
// log and metrics, never the key itself.
func TestGossipKeyFileReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gossip.key")
	write := func(text string) {
		t.Helper()
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(testKey(1, 32) + "\n")
	c, _, err := parseServeFlags([]string{"--gossip-addr", "127.0.0.1:0", "--advertise-addr", "127.0.0.1", "--node-name", "n1",
		"--join", "127.0.0.1:1", "--gossip-key-file", path}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	n, err := startCluster(c, "127.0.0.1:0", bucket.NewStore(bucket.StoreConfig{}), reg, slog.New(slog.NewTextHandler(&logs, nil)), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	m := n.node.Membership()
	waitKeys := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(m.KeyFingerprints(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("keys %v, want %v; log:\n%s", m.KeyFingerprints(), want, logs.String())
			}
			time.Sleep(20 * time.Millisecond) // polling a bounded wait
		}
	}
	waitKeys(fp(1, 32))

	write(testKey(1, 32) + "\n" + testKey(2, 16) + "\n")
	waitKeys(fp(1, 32), fp(2, 16))
	write("# new key first\n" + testKey(2, 16) + "\n" + testKey(1, 32) + "\n")
	waitKeys(fp(2, 16), fp(1, 32))

	write(testKey(2, 16) + "\nnot base64!\n")
	deadline := time.Now().Add(10 * time.Second)
	for n.keys.errors.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a bad key file was not counted; log:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a bounded wait
	}
	if got, want := m.KeyFingerprints(), []string{fp(2, 16), fp(1, 32)}; !slices.Equal(got, want) {
		t.Fatalf("a bad file changed the keys to %v", got)
	}
	if !strings.Contains(logs.String(), "gossip.key:2: not base64") {
		t.Errorf("the failed reload does not name the file and line:\n%s", logs.String())
	}

	write(testKey(2, 16) + "\n")
	waitKeys(fp(2, 16))

	out := logs.String()
	if !strings.Contains(out, `gossip keys reloaded" primary=`+fp(2, 16)) {
		t.Errorf("no log line names the new primary %s:\n%s", fp(2, 16), out)
	}
	for _, k := range []string{testKey(1, 32), testKey(2, 16)} {
		if strings.Contains(out, k) {
			t.Errorf("the log holds a key:\n%s", out)
		}
	}
	expo := `
# HELP ringlimit_gossip_key_reload_errors_total Changes of --gossip-key-file that did not read, parse or apply; the keys in use stayed.
# TYPE ringlimit_gossip_key_reload_errors_total counter
ringlimit_gossip_key_reload_errors_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expo), "ringlimit_gossip_key_reload_errors_total"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []string
	for _, mf := range mfs {
		if mf.GetName() != "ringlimit_gossip_keys" {
			continue
		}
		for _, s := range mf.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			series = append(series, strings.Join(labels, ","))
		}
	}
	if want := []string{"fingerprint=" + fp(2, 16) + ",primary=true"}; !slices.Equal(series, want) {
		t.Errorf("ringlimit_gossip_keys series %v, want %v", series, want)
	}
}

// A change of the file between the read at start and the start of the
// watch raises no event the watcher sees: starting the watch reads the
// file again.
func TestGossipKeyFileChangedBeforeWatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(path, []byte(testKey(1, 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := parseServeFlags([]string{"--gossip-addr", "127.0.0.1:0", "--advertise-addr", "127.0.0.1", "--node-name", "n1",
		"--join", "127.0.0.1:1", "--gossip-key-file", path}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	n, err := startCluster(c, "127.0.0.1:0", bucket.NewStore(bucket.StoreConfig{}), nil, log, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	m := n.node.Membership()
	// The start-up read has happened; the watch has not (closed here).
	n.keys.close()
	if err := os.WriteFile(path, []byte(testKey(2, 16)+"\n"+testKey(1, 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n.keys, err = watchGossipKeys(path, m, nil, log); err != nil {
		t.Fatal(err)
	}
	if got, want := m.KeyFingerprints(), []string{fp(2, 16), fp(1, 32)}; !slices.Equal(got, want) {
		t.Fatalf("keys %v once the watch started, want the file's %v; log:\n%s", got, want, logs.String())
	}
}
