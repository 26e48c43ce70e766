package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/ringlimit/ringlimit/rls"
)

// validateCmd loads a config file or directory and prints every error (exit
// 1) or a summary (exit 0). A config without any domain is an error too,
// and a subdirectory it skips gets a warning. A valid config that uses
// ringlimit's rate_limit extensions (algorithm, burst) gets one warning line
// per rule on stderr: it is valid for ringlimit, but envoyproxy/ratelimit
// would reject it.
func validateCmd(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	merge := fs.Bool("merge-domains", envBool(getenv, "MERGE_DOMAIN_CONFIG"), "merge files that share a domain instead of rejecting them")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ringlimit validate [--merge-domains] PATH\n\nPATH is a config file or a directory of them (as serve --config).")
		fs.PrintDefaults()
	}
	// Flags may come before and after the path (validate PATH --merge-domains).
	var paths []string
	for rest := args; ; rest = fs.Args()[1:] {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		paths = append(paths, fs.Arg(0))
	}
	args = paths
	if len(args) > 1 {
		fmt.Fprintf(stderr, "validate: one PATH, got %q and %q\n", args[0], args[1])
		return 2
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "validate: PATH required")
		fs.Usage()
		return 2
	}
	cfg, err := rls.Load(args[0], rls.LoadOptions{MergeDomains: *merge})
	if err != nil {
		for _, e := range flattenErrors(err) {
			fmt.Fprintln(stderr, e)
		}
		return 1
	}
	doms := cfg.Domains()
	if len(doms) == 0 {
		fmt.Fprintf(stderr, "validate: %s: no domain loaded (no config file, only dotfiles): every request would be answered OK\n", args[0])
		return 1
	}
	fmt.Fprintf(stdout, "ok: %s: %d domain(s), %d rule(s)\n", args[0], len(doms), len(cfg.Rules()))
	for _, d := range doms {
		n := 0
		for _, r := range cfg.Rules() {
			if r.Domain == d {
				n++
			}
		}
		fmt.Fprintf(stdout, "  domain %s: %d rule(s)\n", d, n)
	}
	for _, r := range cfg.Rules() {
		if r.Extension != nil {
			fmt.Fprintf(stderr, "warning: %v\n", r.Extension)
		}
	}
	return 0
}

// flattenErrors splits an errors.Join tree into its leaves, one per line.
func flattenErrors(err error) []string {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, flattenErrors(e)...)
		}
		return out
	}
	var out []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line != "" {
			out = append(out, line)
		}
	}
	return out
}
