package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// refConfig has the limits of the reference's rules checked below, per day
// (see dayConfig for why a day).
const refConfig = `domain: ref
descriptors:
  - {key: a, rate_limit: {unit: day, requests_per_unit: 2}}
  - {key: b, rate_limit: {unit: day, requests_per_unit: 5}}
  - {key: c, rate_limit: {unit: day, requests_per_unit: 10}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 1}}
`

// On three real nodes, through every node and for keys every node owns,
// requests get the reference's answers: STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
// counts the descriptors that are over and only those, and the same
// descriptor twice in one request gets its statuses in request order.
func TestClusterReferenceRules(t *testing.T) {
	c := startCluster(t, 3, refConfig, "--stop-increment-when-over-limit")
	cls := dialAll(t, c.Nodes)
	type want struct {
		code pb.RateLimitResponse_Code
		rem  uint32
	}
	ok := func(rem uint32) want { return want{pb.RateLimitResponse_OK, rem} }
	over := want{pb.RateLimitResponse_OVER_LIMIT, 0}
	d := func(key, value string, hits uint64) *rlv3.RateLimitDescriptor {
		return &rlv3.RateLimitDescriptor{
			Entries:    []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
			HitsAddend: wrapperspb.UInt64(hits),
		}
	}
	for n, cl := range cls {
		call := func(what string, overall pb.RateLimitResponse_Code, wants []want, ds ...*rlv3.RateLimitDescriptor) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := cl.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "ref", Descriptors: ds})
			if err != nil {
				t.Fatalf("via %s: %s: %v", c.Nodes[n].ID, what, err)
			}
			bad := resp.OverallCode != overall || len(resp.Statuses) != len(wants)
			for i := 0; !bad && i < len(wants); i++ {
				bad = resp.Statuses[i].Code != wants[i].code || resp.Statuses[i].LimitRemaining != wants[i].rem
			}
			if bad {
				t.Fatalf("via %s: %s: got %v, want %v %v", c.Nodes[n].ID, what, resp, overall, wants)
			}
		}
		for v := range 6 { // values whose keys land on every node
			val := fmt.Sprintf("%s-%d", c.Nodes[n].ID, v)
			call(val+": c 8 hits", pb.RateLimitResponse_OK, []want{ok(2)}, d("c", val, 8))
			call(val+": c 5 hits, over, counted", pb.RateLimitResponse_OVER_LIMIT, []want{over}, d("c", val, 5))
			call(val+": c 1 hit, still over", pb.RateLimitResponse_OVER_LIMIT, []want{over}, d("c", val, 1))
			call(val+": a, b, c: c over, a and b count nothing", pb.RateLimitResponse_OVER_LIMIT,
				[]want{ok(2), ok(5), over}, d("a", val, 1), d("b", val, 1), d("c", val, 1))
			call(val+": a, b: both count", pb.RateLimitResponse_OK, []want{ok(1), ok(4)}, d("a", val, 1), d("b", val, 1))
			call(val+": d twice: in request order", pb.RateLimitResponse_OVER_LIMIT, []want{ok(0), over},
				d("d", val, 1), d("d", val, 1))
		}
	}
}
