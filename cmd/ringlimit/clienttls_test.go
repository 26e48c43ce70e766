package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// check and bench reach an RLS listener that serves TLS with the --tls
// flags, and say why when they cannot.
func TestClientTLSFlags(t *testing.T) {
	leakCheck(t)
	dir := t.TempDir()
	ca, rogue := newTestCA(t, "rls-ca"), newTestCA(t, "rogue-ca")
	caPath, roguePath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "rogue.pem")
	writeFile(t, caPath, ca.pem)
	writeFile(t, roguePath, rogue.pem)
	notPEM := filepath.Join(dir, "not.pem")
	writeFile(t, notPEM, []byte("hello"))
	cert, key := ca.issue(t, dir, "rls", 2)
	f, err := newTLSFiles(&serveConfig{GRPCTLSCert: cert, GRPCTLSKey: key})
	if err != nil {
		t.Fatal(err)
	}
	addr := gatedServer(t, f, nil)
	base := []string{"--addr", addr, "--domain", "d", "--descriptor", "k=v", "--timeout", "10s"}
	tests := []struct {
		name     string
		flags    []string
		wantCode int
		wantErr  string // in stderr
	}{
		{"the server's CA", []string{"--tls-ca", caPath}, 0, ""},
		{"no verification", []string{"--tls-insecure-skip-verify"}, 0, ""},
		{"another CA", []string{"--tls-ca", roguePath}, 1, "certificate"},
		{"a wrong server name", []string{"--tls-ca", caPath, "--tls-server-name", "other.example"}, 1, "certificate"},
		{"plaintext to a TLS listener", nil, 1, "check:"},
		{"a CA file that is not PEM", []string{"--tls-ca", notPEM}, 2, "no PEM certificate"},
		{"a missing CA file", []string{"--tls-ca", filepath.Join(dir, "missing.pem")}, 2, "--tls-ca"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := checkCmd(context.Background(), append(append([]string(nil), base...), tt.flags...), &out, &errb)
			if code != tt.wantCode || !strings.Contains(errb.String(), tt.wantErr) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errb.String(), tt.wantCode, tt.wantErr)
			}
			if code == 0 && !strings.Contains(out.String(), "OK") {
				t.Fatalf("stdout %q, want an OK decision", out.String())
			}
		})
	}

	// bench with the same flags: every call answered.
	var out, errb bytes.Buffer
	args := []string{"--addr", addr, "-n", "50", "-c", "2", "--deadline", "10s", "--tls-ca", caPath}
	if code := benchCmd(context.Background(), args, &out, &errb); code != 0 || !strings.Contains(out.String(), "[OK]") {
		t.Fatalf("bench over TLS: exit %d, stderr %q, stdout %q", code, errb.String(), out.String())
	}
}
