package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeygen: keygen prints a key serve's --gossip-key-file accepts, a new
// one each time, of the length asked for; a bad length is a usage error.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	seen := map[string]bool{}
	for _, tc := range []struct {
		args []string
		n    int
	}{{nil, 32}, {nil, 32}, {[]string{"--bytes", "16"}, 16}, {[]string{"--bytes=24"}, 24}} {
		var out, errb bytes.Buffer
		if code := keygenCmd(tc.args, rand.Reader, &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d, stderr %q", tc.args, code, errb.String())
		}
		if seen[out.String()] {
			t.Fatalf("%q: the same key twice", tc.args)
		}
		seen[out.String()] = true
		if !strings.HasSuffix(out.String(), "\n") || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%q: output %q is not one line", tc.args, out.String())
		}
		p := filepath.Join(dir, "gossip.key")
		if err := os.WriteFile(p, out.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		keys, err := readGossipKeys(p)
		if err != nil || len(keys) != 1 || len(keys[0]) != tc.n {
			t.Errorf("%q: --gossip-key-file reads %d keys, %v; want one of %d bytes", tc.args, len(keys), err, tc.n)
		}
	}
	for _, args := range [][]string{{"--bytes", "20"}, {"--bytes", "0"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := keygenCmd(args, rand.Reader, &out, &errb); code != 2 || out.Len() != 0 || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and an error", args, code, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	if code := keygenCmd(nil, strings.NewReader("short"), &out, &errb); code != 1 || out.Len() != 0 {
		t.Errorf("a failing random source: exit %d, stdout %q", code, out.String())
	}
}
