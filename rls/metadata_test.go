package rls

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

const metaConfig = `domain: meta
descriptors:
  - key: a
    metadata: {team: x, nested: {one: 1}, tags: [p, 2.5, true]}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: b
    metadata: {team: y, nested: {two: true}, extra: null, tags: [other]}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: u
    metadata: {team: z}
    rate_limit: {unlimited: true}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// TestServiceDynamicMetadata: with DynamicMetadata, the response carries
// the reference's dynamic metadata: the domain, each descriptor's entries
// ("key=value"), limit override and own hits_addend, the request's
// hits_addend, and the merged metadata of the rules not over their limit
// (unlimited ones aside; the first rule's field wins, structs merge).
func TestServiceDynamicMetadata(t *testing.T) {
	mustStruct := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	override := svLimit(svD("plain", "x"), 9, typev3.RateLimitUnit_MINUTE)
	tests := []struct {
		name string
		req  *pb.RateLimitRequest
		want map[string]any
	}{
		{"all within their limits: metadata merged in request order",
			svReq("meta", 0, svD("a", "1"), svD("b", "1"), svD("u", "1"), svD("none", "1")),
			map[string]any{
				"domain": "meta",
				"descriptors": []any{
					map[string]any{"entries": []any{"a=1"}}, map[string]any{"entries": []any{"b=1"}},
					map[string]any{"entries": []any{"u=1"}}, map[string]any{"entries": []any{"none=1"}},
				},
				"metadata": map[string]any{"team": "x", "nested": map[string]any{"one": 1, "two": true},
					"tags": []any{"p", 2.5, true}, "extra": nil},
			}},
		{"a is over: only b's metadata; hits_addend of the request and of a descriptor",
			svReq("meta", 3, svHits(svD("a", "1"), 2), svD("b", "1")),
			map[string]any{
				"domain": "meta",
				"descriptors": []any{
					map[string]any{"entries": []any{"a=1"}, "hitsAddend": 2},
					map[string]any{"entries": []any{"b=1"}},
				},
				"hitsAddend": 3,
				"metadata":   map[string]any{"team": "y", "nested": map[string]any{"two": true}, "extra": nil, "tags": []any{"other"}},
			}},
		{"a limit override is shown as text; no rule metadata: no metadata field",
			svReq("meta", 0, override, svD("plain", "y", "more", "z")),
			map[string]any{
				"domain": "meta",
				"descriptors": []any{
					map[string]any{"entries": []any{"plain=x"}, "limit": override.Limit.String()},
					map[string]any{"entries": []any{"plain=y", "more=z"}},
				},
			}},
		{"unknown domain",
			svReq("other", 0, svD("a", "1")),
			map[string]any{"domain": "other", "descriptors": []any{map[string]any{"entries": []any{"a=1"}}}}},
	}
	h := svNew(t, metaConfig, Options{DynamicMetadata: true})
	for _, tt := range tests {
		resp, err := h.svc.ShouldRateLimit(context.Background(), tt.req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if want := mustStruct(tt.want); !proto.Equal(resp.DynamicMetadata, want) {
			t.Fatalf("%s: dynamic metadata\n%s\nwant\n%s", tt.name, svText(resp.DynamicMetadata), svText(want))
		}
	}
	// The rules' metadata is not changed by merging it into responses.
	if got, want := h.cfg.Domain("meta").Match([]*rlv3.RateLimitDescriptor_Entry{{Key: "a", Value: "1"}}).Metadata,
		mustStruct(map[string]any{"team": "x", "nested": map[string]any{"one": 1}, "tags": []any{"p", 2.5, true}}); !proto.Equal(got, want) {
		t.Fatalf("rule a's metadata is now %s", svText(got))
	}

	off := svNew(t, metaConfig, Options{})
	resp, err := off.svc.ShouldRateLimit(context.Background(), svReq("meta", 0, svD("a", "1")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.DynamicMetadata != nil {
		t.Fatalf("dynamic metadata without the option: %s", svText(resp.DynamicMetadata))
	}
}
