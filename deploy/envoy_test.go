package deploy_test

// The proxies' side: the standalone Envoy bootstrap decoded into
// go-control-plane's types with every typed config resolved, the Istio
// EnvoyFilters' patch values decoded the same way, and the Emissary and
// Contour resources; all checked against the Kubernetes kit and the rate
// limit config they must agree with.

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	rlfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// decodeEnvoy decodes Envoy YAML (or JSON) into m with protojson: unknown
// fields are errors, and every Any (typed_config, protocol options) must
// resolve to a registered type. With validate, protoc-gen-validate's rules
// run on m and on every message inside an Any.
func decodeEnvoy(data []byte, m proto.Message, validate bool) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	if err := protojson.Unmarshal(j, m); err != nil {
		return err
	}
	check := func(m proto.Message) error {
		if v, ok := m.(interface{ ValidateAll() error }); ok && validate {
			return v.ValidateAll()
		}
		return nil
	}
	if err := check(m); err != nil {
		return err
	}
	return walkAnys(m.ProtoReflect(), func(inner proto.Message) error {
		if err := check(inner); err != nil {
			return fmt.Errorf("%s: %w", inner.ProtoReflect().Descriptor().FullName(), err)
		}
		return nil
	})
}

// walkAnys unpacks every Any inside m (recursively) and calls visit on it.
func walkAnys(m protoreflect.Message, visit func(proto.Message) error) error {
	var err error
	walk := func(v protoreflect.Message) error {
		if a, ok := v.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				return fmt.Errorf("any %s: %w", a.GetTypeUrl(), err)
			}
			if err := visit(inner); err != nil {
				return err
			}
			return walkAnys(inner.ProtoReflect(), visit)
		}
		return walkAnys(v, visit)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = walk(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = walk(mv.Message())
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = walk(v.Message())
		}
		return err == nil
	})
	return err
}

func TestDecodeEnvoyIsStrict(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		into      proto.Message
	}{
		{"unknown field", "name: c\ntype: STRICT_DNS\nconect_timeout: 1s\n", &clusterv3.Cluster{}},
		{"bad enum", "name: c\ntype: STRICTER_DNS\n", &clusterv3.Cluster{}},
		{"unregistered typed_config", "name: f\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.nosuch.v3.Filter\n", &hcmv3.HttpFilter{}},
		{"unknown field inside typed_config", "name: f\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n  domian: x\n", &hcmv3.HttpFilter{}},
		{"validation rule", "name: f\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n  domain: \"\"\n" +
			"  rate_limit_service: {grpc_service: {envoy_grpc: {cluster_name: c}}}\n", &hcmv3.HttpFilter{}},
	} {
		if err := decodeEnvoy([]byte(tc.doc), tc.into, true); err == nil {
			t.Errorf("%s: decoded without error", tc.name)
		}
	}
}

// rlConfig is the part of the rate limit config the proxies must agree with.
type rlConfig struct {
	Domain      string         `json:"domain"`
	Descriptors []rlDescriptor `json:"descriptors"`
}

type rlDescriptor struct {
	Key         string          `json:"key"`
	Value       string          `json:"value"`
	RateLimit   json.RawMessage `json:"rate_limit"`
	Descriptors []rlDescriptor  `json:"descriptors"`
}

// limitedKeyPaths lists the key sequences that end on a rate limit.
func limitedKeyPaths(ds []rlDescriptor, prefix []string) [][]string {
	var out [][]string
	for _, d := range ds {
		p := append(append([]string(nil), prefix...), d.Key)
		if len(d.RateLimit) > 0 {
			out = append(out, p)
		}
		out = append(out, limitedKeyPaths(d.Descriptors, p)...)
	}
	return out
}

func seedConfig(t *testing.T) rlConfig {
	t.Helper()
	data, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	var c rlConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// rateLimitSetup is what a proxy needs to ask ringlimit for a decision.
type rateLimitSetup struct {
	filters  []*hcmv3.HttpFilter // in order
	actions  []*routev3.RateLimit_Action
	clusters map[string]*clusterv3.Cluster
}

// checkRateLimitSetup checks a proxy setup against the kit and the config.
func checkRateLimitSetup(t *testing.T, s rateLimitSetup) {
	t.Helper()
	k := overlayKit(t)
	cfg := seedConfig(t)
	var rl *rlfilterv3.RateLimit
	var lua *luav3.Lua
	idx := map[string]int{}
	for i, f := range s.filters {
		idx[f.GetName()] = i
		tc, err := f.GetTypedConfig().UnmarshalNew()
		if err != nil {
			t.Fatalf("filter %s: %v", f.GetName(), err)
		}
		switch v := tc.(type) {
		case *rlfilterv3.RateLimit:
			rl = v
		case *luav3.Lua:
			lua = v
		}
	}
	if rl == nil {
		t.Fatal("no envoy.filters.http.ratelimit filter")
	}
	if r, ok := idx["envoy.filters.http.router"]; ok && (r != len(s.filters)-1 || idx["envoy.filters.http.ratelimit"] > r) {
		t.Errorf("filter order %v: the router must be last, after the rate limit filter", idx)
	}
	if rl.GetDomain() != cfg.Domain {
		t.Errorf("filter domain %q, the config's domain is %q", rl.GetDomain(), cfg.Domain)
	}
	if !rl.GetFailureModeDeny() {
		t.Error("failure_mode_deny should be true (the seed's choice)")
	}
	if d := rl.GetTimeout().AsDuration(); d < 50*time.Millisecond || d > time.Second {
		t.Errorf("timeout %v: want 50ms..1s", d)
	}
	if rl.GetEnableXRatelimitHeaders() != rlfilterv3.RateLimit_DRAFT_VERSION_03 {
		t.Error("enable_x_ratelimit_headers should be DRAFT_VERSION_03")
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Error("rate_limit_service.transport_api_version should be V3")
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c := s.clusters[name]
	if c == nil {
		t.Fatalf("rate limit cluster %q is not defined", name)
	}
	if c.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster %s: type %v, want STRICT_DNS", name, c.GetType())
	}
	if !isHTTP2(t, c) {
		t.Errorf("cluster %s: not HTTP/2", name)
	}
	rls := k.services["ringlimit-rls"]
	wantHost := fmt.Sprintf("%s.%s.svc.cluster.local", rls.Name, k.namespace)
	wantPort := servicePort(rls, "grpc")
	var addrs []string
	for _, e := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range e.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			addrs = append(addrs, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
		}
	}
	if want := fmt.Sprintf("%s:%d", wantHost, wantPort); !slices.Equal(addrs, []string{want}) {
		t.Errorf("cluster %s points at %v, want the headless Service %s", name, addrs, want)
	}
	hc := c.GetHealthChecks()
	if len(hc) != 1 || hc[0].GetGrpcHealthCheck().GetServiceName() != "ratelimit" {
		t.Errorf("cluster %s: want one gRPC health check on service \"ratelimit\"", name)
	}

	// The descriptor the actions build must reach a limit in the config.
	var keys []string
	var header string
	for _, a := range s.actions {
		switch {
		case a.GetRemoteAddress() != nil:
			keys = append(keys, "remote_address")
		case a.GetRequestHeaders() != nil:
			keys = append(keys, a.GetRequestHeaders().GetDescriptorKey())
			header = a.GetRequestHeaders().GetHeaderName()
		default:
			t.Errorf("unexpected action %v", a)
		}
	}
	if !slices.ContainsFunc(limitedKeyPaths(cfg.Descriptors, nil), func(p []string) bool { return slices.Equal(p, keys) }) {
		t.Errorf("actions send keys %v; the config limits %v", keys, limitedKeyPaths(cfg.Descriptors, nil))
	}
	if lua != nil {
		src := lua.GetDefaultSourceCode().GetInlineString()
		m := regexp.MustCompile(`headers:replace\("([^"]+)"`).FindStringSubmatch(src)
		if m == nil || m[1] != header {
			t.Errorf("the Lua normaliser sets %v, the PATH action reads %q", m, header)
		}
		if !strings.Contains(src, "function envoy_on_request") || idx["envoy.filters.http.lua"] > idx["envoy.filters.http.ratelimit"] {
			t.Error("the Lua normaliser must define envoy_on_request and run before the rate limit filter")
		}
	} else if header != ":path" {
		t.Errorf("without the Lua normaliser the PATH action must read :path, reads %q", header)
	}
}

func isHTTP2(t *testing.T, c *clusterv3.Cluster) bool {
	t.Helper()
	a, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return false
	}
	var o upstreamhttpv3.HttpProtocolOptions
	if err := a.UnmarshalTo(&o); err != nil {
		t.Fatal(err)
	}
	return o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

func TestEnvoyBootstrap(t *testing.T) {
	data, err := os.ReadFile(envoyFile)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := decodeEnvoy(data, &b, true); err != nil {
		t.Fatalf("%s: %v", envoyFile, err)
	}
	s := rateLimitSetup{clusters: map[string]*clusterv3.Cluster{}}
	for _, c := range b.GetStaticResources().GetClusters() {
		s.clusters[c.GetName()] = c
	}
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || len(ls[0].GetFilterChains()) != 1 || len(ls[0].GetFilterChains()[0].GetFilters()) != 1 {
		t.Fatal("want one listener with one filter chain and one network filter")
	}
	var hcm hcmv3.HttpConnectionManager
	if err := ls[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	s.filters = hcm.GetHttpFilters()
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if s.clusters[r.GetRoute().GetCluster()] == nil {
				t.Errorf("route to undefined cluster %q", r.GetRoute().GetCluster())
			}
			rls := r.GetRoute().GetRateLimits()
			if len(rls) != 1 {
				t.Fatalf("route %v: %d rate_limits, want 1", r.GetMatch(), len(rls))
			}
			s.actions = rls[0].GetActions()
		}
	}
	checkRateLimitSetup(t, s)
}

// envoyFilter is the part of Istio's EnvoyFilter (networking.istio.io/
// v1alpha3) this kit uses.
type envoyFilter struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		WorkloadSelector *struct {
			Labels map[string]string `json:"labels"`
		} `json:"workloadSelector,omitempty"`
		Priority      *int32 `json:"priority,omitempty"`
		ConfigPatches []struct {
			ApplyTo string `json:"applyTo"`
			Match   struct {
				Context  string `json:"context"`
				Listener *struct {
					PortNumber  uint32 `json:"portNumber,omitempty"`
					FilterChain struct {
						Filter struct {
							Name      string `json:"name"`
							SubFilter *struct {
								Name string `json:"name"`
							} `json:"subFilter,omitempty"`
						} `json:"filter"`
					} `json:"filterChain"`
				} `json:"listener,omitempty"`
				RouteConfiguration *struct {
					Vhost struct {
						Name  string `json:"name,omitempty"`
						Route struct {
							Name   string `json:"name,omitempty"`
							Action string `json:"action,omitempty"`
						} `json:"route"`
					} `json:"vhost"`
				} `json:"routeConfiguration,omitempty"`
			} `json:"match"`
			Patch struct {
				Operation string          `json:"operation"`
				Value     json.RawMessage `json:"value"`
			} `json:"patch"`
		} `json:"configPatches"`
	} `json:"spec"`
}

func TestIstioEnvoyFilters(t *testing.T) {
	objs, err := render(istioDir)
	if err != nil {
		t.Fatal(err)
	}
	s := rateLimitSetup{clusters: map[string]*clusterv3.Cluster{}}
	type inserted struct {
		priority int32
		filter   *hcmv3.HttpFilter
	}
	var filters []inserted
	for _, o := range objs {
		j, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var ef envoyFilter
		if err := decodeStrictInto(j, &ef); err != nil {
			t.Fatalf("%s: %v", objectKey(o), err)
		}
		name := ef.Metadata.Name
		if ef.APIVersion != "networking.istio.io/v1alpha3" || ef.Kind != "EnvoyFilter" || ef.Metadata.Namespace != "istio-system" {
			t.Errorf("%s: want an EnvoyFilter in istio-system", objectKey(o))
		}
		if ef.Spec.WorkloadSelector == nil || ef.Spec.WorkloadSelector.Labels["istio"] != "ingressgateway" {
			t.Errorf("%s: should select the ingress gateway (istio=ingressgateway)", name)
		}
		if ef.Spec.Priority == nil {
			t.Errorf("%s: relative patches need an explicit priority (istioctl IST0151)", name)
			continue
		}
		for i, p := range ef.Spec.ConfigPatches {
			where := fmt.Sprintf("%s configPatches[%d]", name, i)
			if p.Match.Context != "GATEWAY" {
				t.Errorf("%s: context %q, want GATEWAY", where, p.Match.Context)
			}
			switch p.ApplyTo + " " + p.Patch.Operation {
			case "CLUSTER ADD":
				var c clusterv3.Cluster
				if err := decodeEnvoy(p.Patch.Value, &c, true); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				s.clusters[c.GetName()] = &c
			case "HTTP_FILTER INSERT_BEFORE":
				l := p.Match.Listener
				if l == nil || l.FilterChain.Filter.Name != "envoy.filters.network.http_connection_manager" ||
					l.FilterChain.Filter.SubFilter == nil || l.FilterChain.Filter.SubFilter.Name != "envoy.filters.http.router" {
					t.Errorf("%s: should insert before the router of the HTTP connection manager", where)
				}
				var f hcmv3.HttpFilter
				if err := decodeEnvoy(p.Patch.Value, &f, true); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				filters = append(filters, inserted{*ef.Spec.Priority, &f})
			case "HTTP_ROUTE MERGE":
				if rc := p.Match.RouteConfiguration; rc == nil || rc.Vhost.Route.Action != "ANY" {
					t.Errorf("%s: should match every route (action ANY)", where)
				}
				// A MERGE value is a partial Route: decode strictly, no
				// required-field validation.
				var r routev3.Route
				if err := decodeEnvoy(p.Patch.Value, &r, false); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if len(r.GetRoute().GetRateLimits()) != 1 {
					t.Fatalf("%s: want one rate_limits entry", where)
				}
				s.actions = r.GetRoute().GetRateLimits()[0].GetActions()
			default:
				t.Errorf("%s: unexpected %s %s", where, p.ApplyTo, p.Patch.Operation)
			}
		}
	}
	// Istio applies lower priorities first; each INSERT_BEFORE router lands
	// just before the router, so the first applied runs first.
	slices.SortStableFunc(filters, func(a, b inserted) int { return int(a.priority - b.priority) })
	for i := 1; i < len(filters); i++ {
		if filters[i].priority == filters[i-1].priority {
			t.Errorf("filters %s and %s share priority %d: their order would depend on creation time",
				filters[i-1].filter.GetName(), filters[i].filter.GetName(), filters[i].priority)
		}
	}
	for _, f := range filters {
		s.filters = append(s.filters, f.filter)
	}
	checkRateLimitSetup(t, s)
}

// TestIstioWithoutPathNormaliser: dropping the optional component still
// leaves a working setup (PATH from :path).
func TestIstioWithoutPathNormaliser(t *testing.T) {
	k, err := loadKustomization(istioDir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(k.Components, []string{"path-normaliser"}) {
		t.Fatalf("components %v", k.Components)
	}
	objs, err := renderResources(istioDir, k.Resources)
	if err != nil {
		t.Fatal(err)
	}
	o := findObject(objs, "networking.istio.io/v1alpha3", "EnvoyFilter", "ringlimit-actions")
	if o == nil {
		t.Fatal("no ringlimit-actions EnvoyFilter")
	}
	h, err := jsonPointer(o, "/spec/configPatches/0/patch/value/route/rate_limits/0/actions/1/request_headers/header_name")
	if err != nil || h != ":path" {
		t.Errorf("without the normaliser the PATH action reads %v (%v), want :path", h, err)
	}
}

// emissaryRateLimitService is Emissary's RateLimitService
// (getambassador.io/v3alpha1) spec.
type emissaryRateLimitService struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		AmbassadorID                   []string `json:"ambassador_id,omitempty"`
		Service                        string   `json:"service"`
		TimeoutMs                      int      `json:"timeout_ms,omitempty"`
		Domain                         string   `json:"domain,omitempty"`
		TLS                            string   `json:"tls,omitempty"`
		ProtocolVersion                string   `json:"protocol_version,omitempty"`
		StatsName                      string   `json:"stats_name,omitempty"`
		FailureModeDeny                bool     `json:"failure_mode_deny,omitempty"`
		RateLimitedAsResourceExhausted bool     `json:"rate_limited_as_resource_exhausted,omitempty"`
	} `json:"spec"`
}

func TestEmissaryRateLimitService(t *testing.T) {
	data, err := os.ReadFile(emissaryFile)
	if err != nil {
		t.Fatal(err)
	}
	var r emissaryRateLimitService
	if err := decodeStrictInto(data, &r); err != nil {
		t.Fatal(err)
	}
	k := overlayKit(t)
	want := fmt.Sprintf("ringlimit-rls.%s.svc.cluster.local:8081", k.namespace)
	if r.APIVersion != "getambassador.io/v3alpha1" || r.Kind != "RateLimitService" {
		t.Errorf("%s %s", r.APIVersion, r.Kind)
	}
	if r.Spec.ProtocolVersion != "v3" {
		t.Errorf("protocol_version %q, want v3 (ringlimit speaks RLS v3 only)", r.Spec.ProtocolVersion)
	}
	if r.Spec.Service != want {
		t.Errorf("service %q, want the headless Service %s", r.Spec.Service, want)
	}
	if r.Spec.Domain != seedConfig(t).Domain || !r.Spec.FailureModeDeny || r.Spec.TimeoutMs < 50 || r.Spec.TimeoutMs > 1000 {
		t.Errorf("domain %q failure_mode_deny %v timeout_ms %d", r.Spec.Domain, r.Spec.FailureModeDeny, r.Spec.TimeoutMs)
	}
}

// contourExtensionService is Contour's ExtensionService
// (projectcontour.io/v1alpha1).
type contourExtensionService struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Services []struct {
			Name   string `json:"name"`
			Port   int    `json:"port"`
			Weight uint32 `json:"weight,omitempty"`
		} `json:"services"`
		Validation         json.RawMessage `json:"validation,omitempty"`
		Protocol           string          `json:"protocol,omitempty"`
		ProtocolVersion    string          `json:"protocolVersion,omitempty"`
		LoadBalancerPolicy *struct {
			Strategy string `json:"strategy,omitempty"`
		} `json:"loadBalancerPolicy,omitempty"`
		TimeoutPolicy *struct {
			Response       string `json:"response,omitempty"`
			Idle           string `json:"idle,omitempty"`
			IdleConnection string `json:"idleConnection,omitempty"`
		} `json:"timeoutPolicy,omitempty"`
	} `json:"spec"`
}

func TestContourExtensionService(t *testing.T) {
	data, err := os.ReadFile(contourFile)
	if err != nil {
		t.Fatal(err)
	}
	var e contourExtensionService
	if err := decodeStrictInto(data, &e); err != nil {
		t.Fatal(err)
	}
	k := overlayKit(t)
	if e.APIVersion != "projectcontour.io/v1alpha1" || e.Kind != "ExtensionService" {
		t.Errorf("%s %s", e.APIVersion, e.Kind)
	}
	if e.Metadata.Namespace != k.namespace {
		t.Errorf("ExtensionService in %q; it must sit in ringlimit's namespace %q", e.Metadata.Namespace, k.namespace)
	}
	if e.Spec.Protocol != "h2c" || e.Spec.ProtocolVersion != "v3" {
		t.Errorf("protocol %q version %q, want h2c v3", e.Spec.Protocol, e.Spec.ProtocolVersion)
	}
	if len(e.Spec.Services) != 1 {
		t.Fatalf("%d services", len(e.Spec.Services))
	}
	svc := k.services[e.Spec.Services[0].Name]
	if svc == nil || servicePort(svc, "grpc") != int32(e.Spec.Services[0].Port) {
		t.Errorf("services[0] = %+v, want a kit Service's grpc port", e.Spec.Services[0])
	}
	if tp := e.Spec.TimeoutPolicy; tp == nil {
		t.Error("no timeoutPolicy")
	} else if d, err := time.ParseDuration(tp.Response); err != nil || d < 50*time.Millisecond || d > time.Second {
		t.Errorf("timeoutPolicy.response %q: want 50ms..1s", tp.Response)
	}
}
