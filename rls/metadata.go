package rls

import (
	"fmt"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// This file owns a descriptor's metadata: parsing it from the config, and
// the response's dynamic metadata (Options.DynamicMetadata) that carries it.

// metadata parses a descriptor's metadata mapping; nil when it is null or
// empty. Values keep their YAML types: mappings become structs, lists
// lists, numbers numbers, booleans booleans, null null, anything else its
// text.
func (p *cfgParser) metadata(n *yaml.Node, path string) *structpb.Struct {
	ps, ok := p.pairs(n, path)
	if !ok || len(ps) == 0 {
		return nil
	}
	s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(ps))}
	for _, pr := range ps {
		s.Fields[pr.key] = p.metaValue(pr.val, cfgJoin(path, pr.key), 1)
	}
	return s
}

// metaValue converts one metadata value at a nesting depth (1 for a
// top-level field), bounded as descriptors are.
func (p *cfgParser) metaValue(n *yaml.Node, path string, depth int) *structpb.Value {
	n = p.deref(n)
	if cfgIsNull(n) || !p.spend() {
		return structpb.NewNullValue()
	}
	if depth > cfgMaxDepth {
		p.failYAML(path, n.Line, "metadata nested deeper than %d levels", cfgMaxDepth)
		return structpb.NewNullValue()
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, _ := p.pairs(n, path)
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(ps))}
		for _, pr := range ps {
			s.Fields[pr.key] = p.metaValue(pr.val, cfgJoin(path, pr.key), depth+1)
		}
		return structpb.NewStructValue(s)
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(n.Content))}
		for i, c := range n.Content {
			l.Values = append(l.Values, p.metaValue(c, fmt.Sprintf("%s[%d]", path, i), depth+1))
		}
		return structpb.NewListValue(l)
	}
	switch n.Tag {
	case "!!bool":
		var b bool
		if n.Decode(&b) == nil {
			return structpb.NewBoolValue(b)
		}
	case "!!int", "!!float":
		var f float64
		if n.Decode(&f) == nil {
			return structpb.NewNumberValue(f)
		}
	}
	return structpb.NewStringValue(n.Value)
}

// dynamicMetadata builds the response's dynamic metadata as the reference
// does: the domain; each descriptor's entries ("key=value"), its limit
// override (as text) and its own hits_addend when set; the request's
// hits_addend when not 0; and under "metadata" the metadata of the rules
// of the descriptors that were not over their limit (unlimited ones aside),
// merged: a field already set stays, except that two structs merge.
// rules[i] is descriptor i's rule (nil: none; rules may be nil).
func dynamicMetadata(req *pb.RateLimitRequest, rules []*Rule, sts []*pb.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.Descriptors))
	merged := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, d := range req.Descriptors {
		entries := make([]*structpb.Value, 0, len(d.Entries))
		for _, e := range d.Entries {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.Limit != nil {
			f["limit"] = structpb.NewStringValue(d.Limit.String())
		}
		if h := d.HitsAddend; h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.Value))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))

		var r *Rule
		if i < len(rules) {
			r = rules[i]
		}
		if r != nil && !r.Unlimited && r.Metadata != nil && sts[i].Code != pb.RateLimitResponse_OVER_LIMIT {
			mergeMetadata(merged, r.Metadata)
		}
	}
	out := &structpb.Struct{Fields: map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}}
	if req.HitsAddend != 0 {
		out.Fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	if len(merged.Fields) > 0 {
		out.Fields["metadata"] = structpb.NewStructValue(merged)
	}
	return out
}

// mergeMetadata adds src's fields to dst (copies: src belongs to a Rule);
// a field dst has stays, and two structs under one name are merged.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.Fields {
		if have, ok := dst.Fields[k]; ok {
			if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
				mergeMetadata(hs, vs)
			}
			continue
		}
		dst.Fields[k] = proto.Clone(v).(*structpb.Value)
	}
}
