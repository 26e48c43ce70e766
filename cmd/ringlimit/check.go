package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// check's exit codes.
const (
	checkExitOK        = 0 // the server answered (OK, or OVER_LIMIT without --fail-over-limit)
	checkExitFailed    = 1 // the call failed: unreachable, TLS, deadline, or an error status
	checkExitUsage     = 2 // bad flags or arguments
	checkExitOverLimit = 3 // --fail-over-limit and the overall code is OVER_LIMIT
)

// checkCmd sends one ShouldRateLimit call and prints the decision.
func checkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of a ringlimit (or any RLS v3) server")
	domain := fs.String("domain", "", "rate limit domain")
	hits := fs.Uint("hits", 0, "hits_addend of the request (0 means 1, as Envoy sends)")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of the call")
	failOver := fs.Bool("fail-over-limit", false, fmt.Sprintf("exit %d when the overall code is OVER_LIMIT (for scripts)", checkExitOverLimit))
	var descs listFlag
	fs.Var(&descs, "descriptor", "a descriptor as k=v,k2=v2 (repeat for several; a bare k means an empty value)")
	var ctls rlsClientTLS
	ctls.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ringlimit check --addr HOST:PORT --domain D --descriptor k=v[,k2=v2] [--descriptor ...] [--hits N] [--fail-over-limit] [--tls-ca FILE]")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "exit status: %d answered, %d the call failed, %d bad flags, %d over the limit with --fail-over-limit\n",
			checkExitOK, checkExitFailed, checkExitUsage, checkExitOverLimit)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return checkExitOK
		}
		return checkExitUsage
	}
	var missing []string
	if *domain == "" {
		missing = append(missing, "--domain")
	}
	if len(descs) == 0 {
		missing = append(missing, "--descriptor")
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "check: unexpected argument %q\n", fs.Arg(0))
		return checkExitUsage
	}
	if len(missing) > 0 {
		fmt.Fprintf(stderr, "check: %s required\n", strings.Join(missing, " and "))
		fs.Usage()
		return checkExitUsage
	}
	req := &pb.RateLimitRequest{Domain: *domain, HitsAddend: uint32(*hits)}
	for _, d := range descs {
		desc, err := parseDescriptor(d)
		if err != nil {
			fmt.Fprintln(stderr, "check:", err)
			return checkExitUsage
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	creds, err := ctls.dialOption()
	if err != nil {
		fmt.Fprintln(stderr, "check:", err)
		return checkExitUsage
	}
	conn, err := grpc.NewClient(*addr, creds)
	if err != nil {
		fmt.Fprintln(stderr, "check:", err)
		return checkExitFailed
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start := time.Now()
	resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	took := time.Since(start)
	if err != nil {
		fmt.Fprintln(stderr, "check:", err)
		return checkExitFailed
	}
	printResponse(stdout, req, resp, took)
	if *failOver && resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		return checkExitOverLimit
	}
	return checkExitOK
}

// parseDescriptor reads "k=v,k2=v2". A value may contain '='; entries are
// split on ','.
func parseDescriptor(s string) (*rlv3.RateLimitDescriptor, error) {
	d := &rlv3.RateLimitDescriptor{}
	for _, part := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(part, "=")
		if k == "" {
			return nil, fmt.Errorf("descriptor %q: empty key", s)
		}
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}

// printResponse prints every field of the answer. A status without
// current_limit is a descriptor no rule matched (its domain is not loaded,
// or no rule of the domain matches its entries), or, with limit_remaining
// 2^32-1, one an unlimited rule matched: the server answered OK without
// counting it, and the output says which.
func printResponse(w io.Writer, req *pb.RateLimitRequest, resp *pb.RateLimitResponse, took time.Duration) {
	fmt.Fprintf(w, "overall_code: %s  (%s)\n", resp.OverallCode, took.Round(time.Microsecond))
	unmatched := 0
	for i, st := range resp.Statuses {
		var entries []string
		if i < len(req.Descriptors) {
			for _, e := range req.Descriptors[i].Entries {
				entries = append(entries, e.Key+"="+e.Value)
			}
		}
		fmt.Fprintf(w, "descriptor[%d] %s\n", i, strings.Join(entries, ","))
		fmt.Fprintf(w, "  code: %s\n", st.Code)
		switch l := st.CurrentLimit; {
		case l == nil && st.LimitRemaining == math.MaxUint32:
			fmt.Fprintln(w, "  unlimited: the rule that matched is unlimited; not counted")
		case l == nil:
			unmatched++
			fmt.Fprintln(w, "  no rule matched: not counted (an unknown domain, or no rule for these entries)")
			continue
		default:
			fmt.Fprintf(w, "  current_limit: %d/%s", l.RequestsPerUnit, l.Unit)
			if l.Name != "" {
				fmt.Fprintf(w, " name=%q", l.Name)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "  limit_remaining: %d\n", st.LimitRemaining)
		if d := st.DurationUntilReset; d != nil {
			fmt.Fprintf(w, "  duration_until_reset: %s\n", d.AsDuration())
		}
	}
	for _, h := range resp.ResponseHeadersToAdd {
		fmt.Fprintf(w, "header %s: %s\n", h.Key, h.Value)
	}
	if n := len(resp.Statuses); n > 0 && unmatched == n {
		fmt.Fprintf(w, "no rule matched any descriptor: is domain %q loaded, with a rule for these keys? (the server's debug listener lists its rules at /rlconfig)\n", req.Domain)
	}
}
