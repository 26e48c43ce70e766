// Command ringlimit is a clustered, Redis-free rate limit service for Envoy
// (RLS v3). It is one binary with subcommands:
//
//	ringlimit serve     run the service
//	ringlimit check     ask a running service for one decision
//	ringlimit validate  check a config file or directory
//	ringlimit keygen    print a new gossip key
//	ringlimit version   print the version
//
// Only this package reads flags, environment variables and files, builds the
// concrete types and handles signals.
package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches a subcommand and returns the process exit code.
func run(ctx context.Context, args []string, env []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "serve":
		return serveCmd(ctx, args[1:], environment(env), stdout, stderr)
	case "bench":
		return benchCmd(ctx, args[1:], stdout, stderr)
	case "check":
		return checkCmd(ctx, args[1:], stdout, stderr)
	case "validate":
		return validateCmd(args[1:], environment(env).get, stdout, stderr)
	case "keygen":
		return keygenCmd(args[1:], rand.Reader, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "ringlimit", version())
		return 0
	case "help", "-h", "--help", "-help":
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "ringlimit: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: ringlimit <command> [flags]

commands:
  serve     run the rate limit service (RLS v3 gRPC, HTTP, debug)
  check     ask a running service for one decision and print every field
  validate  validate a config file or directory
  keygen    print a new random gossip key (base64, for --gossip-key-file)
  bench     load-test an RLS server (or run a do-nothing one: --noop-server)
  version   print the version

Run 'ringlimit <command> -h' for a command's flags.
`)
}
