package rls

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	confpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// XDSTypeURL is the type of the xDS resources a config is made of:
// envoyproxy/ratelimit's RateLimitConfig, one per domain.
const XDSTypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// ConfigFromXDS builds one Config from the resources of one xDS response
// (state of the world: every domain), as version. Each RateLimitConfig is
// checked as a config file would be, by the same parser and with the same
// errors, named `xds RateLimitConfig "<name>"` in place of a file; the
// resources are taken in name order. opt.MergeDomains lets two resources
// share a domain; opt.IgnoreDotfiles means nothing here. A descriptor's
// quota_mode and metadata are read as a file's are. No resource at all is a
// valid, empty Config.
func ConfigFromXDS(version string, resources []*anypb.Any, opt LoadOptions) (*Config, error) {
	type named struct {
		name string
		msg  *confpb.RateLimitConfig
	}
	var errs []error
	list := make([]named, 0, len(resources))
	for i, res := range resources {
		if res.GetTypeUrl() != XDSTypeURL {
			errs = append(errs, fmt.Errorf("rls: xds resources[%d]: type %q, want %q", i, res.GetTypeUrl(), XDSTypeURL))
			continue
		}
		m := &confpb.RateLimitConfig{}
		if err := proto.Unmarshal(res.GetValue(), m); err != nil {
			errs = append(errs, fmt.Errorf("rls: xds resources[%d]: %v", i, err))
			continue
		}
		name := m.GetName()
		if name == "" {
			name = fmt.Sprintf("resources[%d]", i)
		}
		list = append(list, named{name, m})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortStableFunc(list, func(a, b named) int { return strings.Compare(a.name, b.name) })
	b := cfgNewBuilder(opt.MergeDomains)
	for _, r := range list {
		var n int
		root := xdsConfigNode(r.msg, &n)
		b.addNode(fmt.Sprintf("xds RateLimitConfig %q", r.name), root, n)
	}
	cfg, err := b.finish()
	if err != nil {
		return nil, err
	}
	cfg.version = version
	return cfg, nil
}

// Version is the xDS version_info the config was received as; "" for a
// config read from files.
func (c *Config) Version() string {
	if c == nil {
		return ""
	}
	return c.version
}

// xdsConfigNode is a RateLimitConfig as the YAML mapping a file holding it
// would parse to; n counts the nodes made.
func xdsConfigNode(m *confpb.RateLimitConfig, n *int) *yaml.Node {
	root := xdsMap(n)
	xdsPut(root, n, "domain", xdsStr(n, m.GetDomain()))
	if d := m.GetDescriptors(); len(d) > 0 {
		xdsPut(root, n, "descriptors", xdsDescriptors(d, n))
	}
	return root
}

func xdsDescriptors(ds []*confpb.RateLimitDescriptor, n *int) *yaml.Node {
	list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	*n++
	for _, d := range ds {
		m := xdsMap(n)
		xdsPut(m, n, "key", xdsStr(n, d.GetKey()))
		if d.GetValue() != "" {
			xdsPut(m, n, "value", xdsStr(n, d.GetValue()))
		}
		if r := d.GetRateLimit(); r != nil {
			xdsPut(m, n, "rate_limit", xdsRate(r, n))
		}
		if d.GetShadowMode() {
			xdsPut(m, n, "shadow_mode", xdsScalar(n, "!!bool", "true"))
		}
		if d.GetDetailedMetric() {
			xdsPut(m, n, "detailed_metric", xdsScalar(n, "!!bool", "true"))
		}
		if d.GetQuotaMode() {
			xdsPut(m, n, "quota_mode", xdsScalar(n, "!!bool", "true"))
		}
		if md := d.GetMetadata(); md != nil {
			xdsPut(m, n, "metadata", xdsStruct(md, n))
		}
		if c := d.GetDescriptors(); len(c) > 0 {
			xdsPut(m, n, "descriptors", xdsDescriptors(c, n))
		}
		list.Content = append(list.Content, m)
	}
	return list
}

func xdsRate(r *confpb.RateLimitPolicy, n *int) *yaml.Node {
	m := xdsMap(n)
	// The enum's numbers are those of the RLS response's unit (WEEK,
	// MONTH and YEAR included, which newer versions of the resource's Go
	// package name); an unknown number stays a number, an invalid unit.
	unit, ok := pb.RateLimitResponse_RateLimit_Unit_name[int32(r.GetUnit())]
	if !ok {
		unit = strconv.Itoa(int(r.GetUnit()))
	}
	xdsPut(m, n, "unit", xdsStr(n, unit))
	xdsPut(m, n, "requests_per_unit", xdsScalar(n, "!!int", strconv.FormatUint(uint64(r.GetRequestsPerUnit()), 10)))
	if r.GetUnlimited() {
		xdsPut(m, n, "unlimited", xdsScalar(n, "!!bool", "true"))
	}
	if r.GetName() != "" {
		xdsPut(m, n, "name", xdsStr(n, r.GetName()))
	}
	if rp := r.GetReplaces(); len(rp) > 0 {
		list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		*n++
		for _, x := range rp {
			e := xdsMap(n)
			xdsPut(e, n, "name", xdsStr(n, x.GetName()))
			list.Content = append(list.Content, e)
		}
		xdsPut(m, n, "replaces", list)
	}
	return m
}

// xdsStruct is a descriptor's metadata as the YAML a file would hold.
func xdsStruct(s *structpb.Struct, n *int) *yaml.Node {
	m := xdsMap(n)
	keys := make([]string, 0, len(s.GetFields()))
	for k := range s.GetFields() {
		keys = append(keys, k)
	}
	slices.Sort(keys) // deterministic, as a file is
	for _, k := range keys {
		xdsPut(m, n, k, xdsValue(s.GetFields()[k], n))
	}
	return m
}

func xdsValue(v *structpb.Value, n *int) *yaml.Node {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return xdsStruct(k.StructValue, n)
	case *structpb.Value_ListValue:
		list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		*n++
		for _, e := range k.ListValue.GetValues() {
			list.Content = append(list.Content, xdsValue(e, n))
		}
		return list
	case *structpb.Value_BoolValue:
		return xdsScalar(n, "!!bool", strconv.FormatBool(k.BoolValue))
	case *structpb.Value_NumberValue:
		f := k.NumberValue
		switch {
		case math.IsNaN(f):
			return xdsScalar(n, "!!float", ".nan")
		case math.IsInf(f, 1):
			return xdsScalar(n, "!!float", ".inf")
		case math.IsInf(f, -1):
			return xdsScalar(n, "!!float", "-.inf")
		}
		return xdsScalar(n, "!!float", strconv.FormatFloat(f, 'g', -1, 64))
	case *structpb.Value_StringValue:
		return xdsStr(n, k.StringValue)
	}
	return xdsScalar(n, "!!null", "null") // null, or no kind set
}

func xdsMap(n *int) *yaml.Node {
	*n++
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
}

func xdsScalar(n *int, tag, v string) *yaml.Node {
	*n++
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v}
}

func xdsStr(n *int, v string) *yaml.Node { return xdsScalar(n, "!!str", v) }

// xdsPut adds key: v to the mapping m.
func xdsPut(m *yaml.Node, n *int, key string, v *yaml.Node) {
	m.Content = append(m.Content, xdsStr(n, key), v)
}
