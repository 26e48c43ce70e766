package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// defaultBenchDescriptor is the seed scenario's descriptor: the client IP
// and the method+path header, as the team's Envoy route sent them.
const defaultBenchDescriptor = "remote_address={ip},PATH=/login"

// benchFlags are bench's flags before validation.
type benchFlags struct {
	n, c, connections, keys int
	z, deadline, warmup     time.Duration
	connectTimeout          time.Duration
	rps, zipfS              float64
	addr, dist, domain      string
	label, compare, noop    string
	jsonFile, serverPIDs    string
	hits                    uint
	limits                  bool
	seed                    uint64
	json                    bool
	descs                   listFlag
	tls                     rlsClientTLS
}

func newBenchFlags(f *benchFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&f.n, "n", 200, "number of calls to send (ignored when -z is set)")
	fs.DurationVar(&f.z, "z", 0, "send for this long instead of -n calls (e.g. 10s)")
	fs.IntVar(&f.c, "c", 50, "concurrency: workers, each with one call in flight")
	fs.Float64Var(&f.rps, "rps", 0, "calls per second over all workers, on a fixed schedule; latency is then measured from each call's scheduled time, so a call sent late (all workers busy) counts its wait, as wrk2 does (0: as fast as answered)")
	fs.IntVar(&f.connections, "connections", 0, "gRPC connections, spread round-robin over --addr targets (0: one per target)")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8081", "comma-separated gRPC addresses; each connection is pinned to one, as Envoy spreads over a headless Service")
	fs.IntVar(&f.keys, "keys", 10000, "distinct keys substituted for {ip} / {key}")
	fs.StringVar(&f.dist, "dist", "uniform", "key distribution: uniform or zipf")
	fs.Float64Var(&f.zipfS, "zipf-s", 1.1, "zipf exponent (> 1); key 0 is the hottest")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the key choice (same flags and seed: same keys per worker)")
	fs.Var(&f.descs, "descriptor", "descriptor template k=v,k2=v2 (repeat for several); {ip} and {key} in a value become the chosen key (default "+defaultBenchDescriptor+")")
	fs.StringVar(&f.domain, "domain", "ratelimit", "rate limit domain")
	fs.UintVar(&f.hits, "hits", 0, "hits_addend of every request (0 means 1, as Envoy sends)")
	fs.DurationVar(&f.deadline, "deadline", 20*time.Millisecond, "per-call deadline; a later answer or DeadlineExceeded is a fail-open, as Envoy's timeout (0: none)")
	fs.DurationVar(&f.warmup, "warmup", 0, "send load for this long first and discard it")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 5*time.Second, "how long connections may take to become ready")
	fs.BoolVar(&f.limits, "limits", false, "count, per key and window, hits refused before the limit was reached (early refusals) and hits allowed beyond it, from each answer's current_limit and duration_until_reset; keeps every answer until the end (about 24 bytes each)")
	fs.StringVar(&f.serverPIDs, "server-pids", "", "comma-separated PIDs of the server processes: report their CPU time (user + system, from /proc) per measured call")
	f.tls.register(fs)
	fs.BoolVar(&f.json, "json", false, "print the report as JSON")
	fs.StringVar(&f.jsonFile, "json-file", "", "also write the --json report to this file")
	fs.StringVar(&f.label, "label", "", "name of this run in the report and in --compare")
	fs.StringVar(&f.compare, "compare", "", "comma-separated --json reports: print a table of their medians by label, with ratios to the first label, and exit")
	fs.StringVar(&f.noop, "noop-server", "", "instead of sending load, serve an RLS that answers OK without deciding on this address (the floor), until interrupted")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: ringlimit bench [flags]            send RLS load and report, like hey
       ringlimit bench --noop-server ADDR    serve the do-nothing RLS floor
       ringlimit bench --compare a.json,b.json  tabulate --json reports

`)
		fs.PrintDefaults()
	}
	return fs
}

// config validates the flags into a run.
func (f *benchFlags) config() (*benchConfig, error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("bench: "+format, a...)) }
	var targets []string
	for _, t := range strings.Split(f.addr, ",") {
		if t = strings.TrimSpace(t); t != "" {
			targets = append(targets, t)
		}
	}
	if len(targets) == 0 {
		bad("--addr: no target")
	}
	if f.z < 0 {
		bad("-z: %v is negative", f.z)
	}
	if f.z == 0 && f.n < 1 {
		bad("-n: %d, want >= 1 (or set -z)", f.n)
	}
	if f.c < 1 || f.c > 10000 {
		bad("-c: %d is not in [1, 10000]", f.c)
	}
	if f.rps < 0 || math.IsNaN(f.rps) || math.IsInf(f.rps, 0) {
		bad("--rps: %v is not a finite rate >= 0", f.rps)
	}
	conns := f.connections
	if conns == 0 {
		conns = len(targets)
	}
	if conns < len(targets) || conns > f.c {
		bad("--connections: %d, want between the number of targets (%d) and -c (%d)", conns, len(targets), f.c)
	}
	if f.deadline < 0 || f.warmup < 0 || f.connectTimeout <= 0 {
		bad("--deadline and --warmup must be >= 0 and --connect-timeout > 0")
	}
	descs := []string(f.descs)
	if len(descs) == 0 {
		descs = []string{defaultBenchDescriptor}
	}
	tmpl, err := parseTemplate(f.domain, f.hits, descs)
	if err != nil {
		errs = append(errs, err)
	}
	if _, err := newKeyChooser(f.dist, f.keys, f.zipfS, f.seed, 0); err != nil {
		errs = append(errs, err)
	}
	var pids []int
	for _, p := range strings.Split(f.serverPIDs, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pid, err := strconv.Atoi(p)
		if err != nil || pid < 1 {
			bad("--server-pids: %q is not a PID", p)
			continue
		}
		pids = append(pids, pid)
	}
	creds, err := f.tls.dialOption()
	if err != nil {
		bad("%v", err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &benchConfig{
		Targets: targets, Requests: f.n, Duration: f.z, Concurrency: f.c, RPS: f.rps, Connections: conns,
		Keys: f.keys, Dist: f.dist, ZipfS: f.zipfS, Seed: f.seed, Template: tmpl, Deadline: f.deadline,
		Warmup: f.warmup, ConnectTimeout: f.connectTimeout, Label: f.label, Creds: creds,
		Limits: f.limits, ServerPIDs: pids,
	}, nil
}

// benchCmd is `ringlimit bench`: an RLS load generator reporting in hey's
// shape, the noop floor server, or a comparison table of earlier runs.
func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f benchFlags
	fs := newBenchFlags(&f, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch {
	case f.noop != "":
		return noopServe(ctx, f.noop, stdout, stderr)
	case f.compare != "":
		reports, err := readReports(strings.Split(f.compare, ","))
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		writeCompare(stdout, compareRows(reports))
		return 0
	}
	cfg, err := f.config()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	var progress io.Writer
	if isTerminal(stderr) {
		progress = stderr
	}
	r, err := runBench(ctx, cfg, progress)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if f.jsonFile != "" {
		if err := writeJSONFile(f.jsonFile, r); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	if f.json {
		if err := writeBenchJSON(stdout, r); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	} else {
		writeBenchText(stdout, r)
	}
	if r.Interrupted {
		return 130
	}
	return 0
}

// isTerminal reports whether w is a terminal: a character device other than
// the null device. (Without a terminal ioctl this is a close guess; a
// serial line would count too, which only costs a progress line.)
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(fi, null)
}

// writeJSONFile writes r's --json report to path.
func writeJSONFile(path string, r *benchResult) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: --json-file: %w", err)
	}
	err = writeBenchJSON(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: --json-file: %w", err)
	}
	return nil
}
