package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateWarnsOnExtensions: a config using algorithm or burst is valid
// (exit 0) and gets one warning per rule naming the file and rate_limit; a
// bad algorithm is an error naming the field (exit 1).
func TestValidateWarnsOnExtensions(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(good, `domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
`)
	write(bad, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, algorithm: leaky}\n")
	noenv := func(string) string { return "" }

	var out, errb bytes.Buffer
	if code := validateCmd([]string{good}, noenv, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	want := "warning: rls: " + good + ": descriptors[1].rate_limit: algorithm: ringlimit extension; envoyproxy/ratelimit rejects it\n" +
		"warning: rls: " + good + ": descriptors[2].rate_limit: algorithm, burst: ringlimit extension; envoyproxy/ratelimit rejects it\n"
	if errb.String() != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errb.String(), want)
	}
	if !strings.Contains(out.String(), "3 rule(s)") {
		t.Errorf("stdout %q lacks the summary", out.String())
	}

	out.Reset()
	errb.Reset()
	if code := validateCmd([]string{bad}, noenv, &out, &errb); code != 1 {
		t.Fatalf("exit %d for a bad algorithm", code)
	}
	if want := "rls: " + bad + ": descriptors[0].rate_limit.algorithm: invalid rate limit algorithm 'leaky'"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q lacks %q", errb.String(), want)
	}
}

// TestValidateEmptyAndNested: files in subdirectories are read, as
// envoyproxy/ratelimit reads them; a directory holding only dotfiles loads
// no domain, and validate fails saying so.
func TestValidateEmptyAndNested(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "nested", "deeper")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "a.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := validateCmd([]string{dir}, func(string) string { return "" }, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0", code, out.String(), errb.String())
	}
	if want := "ok: " + dir + ": 1 domain(s), 1 rule(s)"; !strings.Contains(out.String(), want) {
		t.Errorf("stdout %q lacks %q", out.String(), want)
	}

	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, ".hidden.yaml"), []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	if code := validateCmd([]string{empty}, func(string) string { return "" }, &out, &errb); code != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 1", code, out.String(), errb.String())
	}
	if want := "validate: " + empty + ": no domain loaded"; !strings.Contains(errb.String(), want) {
		t.Errorf("stderr %q lacks %q", errb.String(), want)
	}
}

// TestValidateArgs: flags may follow the path; --help exits 0; a missing
// or second path is an error that says so.
func TestValidateArgs(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"a.yaml", "b.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("domain: d\ndescriptors:\n  - key: "+f[:1]+"\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{dir}, 1, "duplicate domain 'd'"},
		{[]string{dir, "--merge-domains"}, 0, ""},
		{[]string{"--merge-domains", dir}, 0, ""},
		{[]string{"--help"}, 0, "usage: ringlimit validate"},
		{[]string{dir, "--help"}, 0, "usage: ringlimit validate"},
		{nil, 2, "validate: PATH required"},
		{[]string{dir, "--merge-domains", "other"}, 2, `validate: one PATH, got "` + dir + `" and "other"`},
	} {
		var out, errb bytes.Buffer
		if code := validateCmd(tc.args, noenv, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("validate %q: exit %d, stderr %q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}
