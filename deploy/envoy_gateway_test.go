package deploy_test

// deploy/envoy-gateway/: Envoy Gateway's rate limit Deployment running
// ringlimit. Envoy Gateway renders that Deployment itself; the tests apply
// the EnvoyGateway config's settings to a description of what it renders
// (testdata/envoy-gateway/ratelimit-deployment.yaml) the way Envoy Gateway
// does, and check the resulting pod against the other manifests and
// against the real `ringlimit serve` parser.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	egDir           = "envoy-gateway"
	egConfigFile    = "envoy-gateway/envoy-gateway-config.yaml"
	egSecretExample = "envoy-gateway/gossip-key-secret.example.yaml"
	egFixtures      = "testdata/envoy-gateway"
)

// referenceEnv lists the envoyproxy/ratelimit variables the config adds
// that ringlimit reads under the reference's name.
var referenceEnv = map[string]bool{"GRPC_CLIENT_TLS_CACERT": true}

// egConfig is the part of Envoy Gateway's EnvoyGateway configuration
// (gateway.envoyproxy.io/v1alpha1, api/v1alpha1/envoygateway_types.go) the
// kit uses, with the Kubernetes types it embeds; decoding strictly into it
// refuses a misspelt or misplaced field.
type egConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Gateway    *struct {
		ControllerName string `json:"controllerName,omitempty"`
	} `json:"gateway,omitempty"`
	Logging *struct {
		Level map[string]string `json:"level,omitempty"`
	} `json:"logging,omitempty"`
	Provider struct {
		Type       string `json:"type"`
		Kubernetes *struct {
			RateLimitDeployment *egDeploymentSpec `json:"rateLimitDeployment,omitempty"`
			RateLimitPDB        *struct {
				MinAvailable   *intstr.IntOrString `json:"minAvailable,omitempty"`
				MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
			} `json:"rateLimitPDB,omitempty"`
		} `json:"kubernetes,omitempty"`
	} `json:"provider"`
	RateLimit *struct {
		Backend struct {
			Type  string `json:"type"`
			Redis *struct {
				URL *string `json:"url,omitempty"`
			} `json:"redis,omitempty"`
		} `json:"backend"`
		Timeout    string `json:"timeout,omitempty"`
		FailClosed bool   `json:"failClosed"`
	} `json:"rateLimit,omitempty"`
}

// egDeploymentSpec is Envoy Gateway's KubernetesDeploymentSpec.
type egDeploymentSpec struct {
	Patch *struct {
		Type  *string         `json:"type,omitempty"`
		Value json.RawMessage `json:"value"`
	} `json:"patch,omitempty"`
	Replicas *int32                     `json:"replicas,omitempty"`
	Strategy *appsv1.DeploymentStrategy `json:"strategy,omitempty"`
	Pod      *struct {
		Annotations               map[string]string                 `json:"annotations,omitempty"`
		Labels                    map[string]string                 `json:"labels,omitempty"`
		SecurityContext           *corev1.PodSecurityContext        `json:"securityContext,omitempty"`
		Affinity                  *corev1.Affinity                  `json:"affinity,omitempty"`
		Tolerations               []corev1.Toleration               `json:"tolerations,omitempty"`
		Volumes                   []corev1.Volume                   `json:"volumes,omitempty"`
		ImagePullSecrets          []corev1.LocalObjectReference     `json:"imagePullSecrets,omitempty"`
		NodeSelector              map[string]string                 `json:"nodeSelector,omitempty"`
		TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	} `json:"pod,omitempty"`
	Container *struct {
		Env             []corev1.EnvVar              `json:"env,omitempty"`
		Resources       *corev1.ResourceRequirements `json:"resources,omitempty"`
		SecurityContext *corev1.SecurityContext      `json:"securityContext,omitempty"`
		Image           *string                      `json:"image,omitempty"`
		VolumeMounts    []corev1.VolumeMount         `json:"volumeMounts,omitempty"`
	} `json:"container,omitempty"`
}

// egKit is deploy/envoy-gateway/ rendered, and the rate limit Deployment
// and Service Envoy Gateway would make from it.
type egKit struct {
	configMap  *corev1.ConfigMap
	config     *egConfig
	peers      *corev1.Service
	objects    []object // the custom resources (Gateway API, Envoy Gateway)
	deployment *appsv1.Deployment
	rlService  *corev1.Service // envoy-ratelimit, Envoy Gateway's
}

func loadEGKit(t *testing.T) *egKit {
	t.Helper()
	objs, err := render(egDir)
	if err != nil {
		t.Fatal(err)
	}
	dec := mustDecoder(t)
	k := &egKit{}
	for _, o := range objs {
		if g, _ := o["apiVersion"].(string); strings.Contains(g, "gateway") {
			k.objects = append(k.objects, o)
			continue
		}
		j, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		typed, err := decodeTyped(dec, j)
		if err != nil {
			t.Fatalf("%s: %v", objectKey(o), err)
		}
		switch v := typed.(type) {
		case *corev1.ConfigMap:
			k.configMap = v
		case *corev1.Service:
			k.peers = v
		default:
			t.Fatalf("%s: no checks for %T", objectKey(o), typed)
		}
	}
	if k.configMap == nil || k.peers == nil {
		t.Fatalf("%s: want the ConfigMap and the peers Service", egDir)
	}
	k.config = &egConfig{}
	if err := decodeStrictInto([]byte(k.configMap.Data["envoy-gateway.yaml"]), k.config); err != nil {
		t.Fatalf("%s: envoy-gateway.yaml: %v", egConfigFile, err)
	}
	k.deployment, k.rlService = renderEGRateLimit(t, k.config)
	return k
}

// renderEGRateLimit applies the config's rateLimitDeployment and backend to
// Envoy Gateway's rate limit Deployment, in Envoy Gateway's order: the
// container and pod fields (env, volumes and mounts replace the same name or
// are appended), then the patch.
func renderEGRateLimit(t *testing.T, cfg *egConfig) (*appsv1.Deployment, *corev1.Service) {
	t.Helper()
	objs, err := readObjects(filepath.Join(egFixtures, "ratelimit-deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := mustDecoder(t)
	var d *appsv1.Deployment
	var svc *corev1.Service
	for _, o := range objs {
		j, _ := json.Marshal(o)
		typed, err := decodeTyped(dec, j)
		if err != nil {
			t.Fatal(err)
		}
		switch v := typed.(type) {
		case *appsv1.Deployment:
			d = v
		case *corev1.Service:
			svc = v
		}
	}
	if cfg.Provider.Kubernetes == nil || cfg.Provider.Kubernetes.RateLimitDeployment == nil || cfg.RateLimit == nil {
		t.Fatal("config has no provider.kubernetes.rateLimitDeployment or no rateLimit")
	}
	rd := cfg.Provider.Kubernetes.RateLimitDeployment
	d.Spec.Replicas = rd.Replicas
	if rd.Strategy != nil {
		d.Spec.Strategy = *rd.Strategy
	}
	ps := &d.Spec.Template.Spec
	c := &ps.Containers[0]
	if rd.Container != nil {
		if rd.Container.Image != nil {
			c.Image = *rd.Container.Image
		}
		if rd.Container.Resources != nil {
			c.Resources = *rd.Container.Resources
		}
		if rd.Container.SecurityContext != nil {
			c.SecurityContext = rd.Container.SecurityContext
		}
	}
	// The Redis variables come after the xDS and TLS ones, before the
	// Prometheus ones.
	if r := cfg.RateLimit.Backend.Redis; r != nil && r.URL != nil {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "USE_PROMETHEUS" })
		c.Env = slices.Insert(c.Env, i, corev1.EnvVar{Name: "REDIS_SOCKET_TYPE", Value: "tcp"}, corev1.EnvVar{Name: "REDIS_URL", Value: *r.URL})
	}
	if rd.Container != nil {
		c.Env = amendByName(c.Env, rd.Container.Env, func(e corev1.EnvVar) string { return e.Name })
		c.VolumeMounts = amendByName(c.VolumeMounts, rd.Container.VolumeMounts, func(m corev1.VolumeMount) string { return m.Name })
	}
	if p := rd.Pod; p != nil {
		labels := d.Spec.Template.Labels
		for k, v := range p.Labels {
			if _, ours := labels[k]; !ours {
				labels[k] = v
			}
		}
		for k, v := range p.Annotations {
			d.Spec.Template.Annotations[k] = v
		}
		ps.SecurityContext, ps.Affinity, ps.Tolerations = p.SecurityContext, p.Affinity, p.Tolerations
		ps.ImagePullSecrets, ps.NodeSelector, ps.TopologySpreadConstraints = p.ImagePullSecrets, p.NodeSelector, p.TopologySpreadConstraints
		ps.Volumes = amendByName(ps.Volumes, p.Volumes, func(v corev1.Volume) string { return v.Name })
	}
	if rd.Patch != nil {
		if rd.Patch.Type != nil && *rd.Patch.Type != "StrategicMerge" {
			t.Fatalf("patch type %q: these tests apply StrategicMerge patches only", *rd.Patch.Type)
		}
		// The patch must be a valid (partial) Deployment on its own.
		if _, err := decodeTyped(dec, withKind(t, rd.Patch.Value)); err != nil {
			t.Fatalf("rateLimitDeployment.patch.value: %v", err)
		}
		var base, patch object
		j, _ := json.Marshal(d)
		if err := json.Unmarshal(j, &base); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(rd.Patch.Value, &patch); err != nil {
			t.Fatal(err)
		}
		// The tests' strategic merge merges lists of named items by name;
		// Kubernetes' merges containers by name too, and ports by
		// containerPort, which is why the patch declares no ports (a TCP
		// and a UDP port on 7946 would collapse into one there).
		if spec, _ := jsonPointer(patch, "/spec/template/spec"); spec != nil {
			if cs, _ := spec.(map[string]any)["containers"].([]any); cs != nil {
				for _, x := range cs {
					if _, ok := x.(map[string]any)["ports"]; ok {
						t.Fatal("rateLimitDeployment.patch declares container ports; see the comment above")
					}
				}
			}
		}
		strategicMerge(base, patch)
		j, _ = json.Marshal(base)
		typed, err := decodeTyped(dec, j)
		if err != nil {
			t.Fatalf("patched Deployment: %v", err)
		}
		d = typed.(*appsv1.Deployment)
	}
	return d, svc
}

// withKind makes a patch value a decodable Deployment document.
func withKind(t *testing.T, raw json.RawMessage) []byte {
	t.Helper()
	var o object
	if err := decodeStrictInto(raw, &o); err != nil {
		t.Fatal(err)
	}
	o["apiVersion"], o["kind"] = "apps/v1", "Deployment"
	j, _ := json.Marshal(o)
	return j
}

// amendByName replaces the items of base whose name an item of more has,
// and appends the others, in order.
func amendByName[T any](base, more []T, name func(T) string) []T {
	out := slices.Clone(base)
	for _, m := range more {
		if i := slices.IndexFunc(out, func(b T) bool { return name(b) == name(m) }); i >= 0 {
			out[i] = m
		} else {
			out = append(out, m)
		}
	}
	return out
}

func mustEGSchemas(t *testing.T) crdSchemas {
	t.Helper()
	s, err := loadCRDs(filepath.Join(egFixtures, "gateway.envoyproxy.io_backendtrafficpolicies.yaml"), filepath.Join(egFixtures, "gatewayapi-crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEnvoyGatewayConfig checks the EnvoyGateway config Envoy Gateway
// accepts: the fields it validates, and a Redis URL it requires but that
// ringlimit never dials.
func TestEnvoyGatewayConfig(t *testing.T) {
	k := loadEGKit(t)
	c := k.config
	if k.configMap.Name != "envoy-gateway-config" || k.configMap.Namespace != "envoy-gateway-system" || len(k.configMap.Data) != 1 {
		t.Errorf("ConfigMap %s/%s with %d keys; Envoy Gateway reads envoy-gateway-config/envoy-gateway.yaml in envoy-gateway-system",
			k.configMap.Namespace, k.configMap.Name, len(k.configMap.Data))
	}
	if c.APIVersion != "gateway.envoyproxy.io/v1alpha1" || c.Kind != "EnvoyGateway" {
		t.Errorf("%s %s", c.APIVersion, c.Kind)
	}
	if c.Gateway == nil || c.Gateway.ControllerName != "gateway.envoyproxy.io/gatewayclass-controller" || c.Provider.Type != "Kubernetes" {
		t.Error("gateway.controllerName and provider.type must stay Envoy Gateway's defaults")
	}
	// Envoy Gateway refuses a rateLimit without a Redis backend and a URL
	// (api/v1alpha1/validation); REDIS_URL is then set on the pod.
	rl := c.RateLimit
	if rl.Backend.Type != "Redis" || rl.Backend.Redis == nil || rl.Backend.Redis.URL == nil || *rl.Backend.Redis.URL == "" {
		t.Fatal("rateLimit.backend must be type Redis with a url: Envoy Gateway requires one")
	}
	if !strings.HasSuffix(strings.Split(*rl.Backend.Redis.URL, ":")[0], ".invalid") {
		t.Errorf("redis url %q: use a name under .invalid, which never resolves, so nobody mistakes it for a real Redis", *rl.Backend.Redis.URL)
	}
	if d, err := time.ParseDuration(rl.Timeout); rl.Timeout != "" && (err != nil || d < 50*time.Millisecond || d > time.Second) {
		t.Errorf("rateLimit.timeout %q: want 50ms..1s (a decision may take a hop to its owner)", rl.Timeout)
	}
	// docs/migration.md's section names every variable the config adds to
	// Envoy Gateway's, and the files of the kit.
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs/migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Envoy Gateway\n")
	if !ok {
		t.Fatal(`docs/migration.md has no section "## Envoy Gateway"`)
	}
	for _, e := range c.Provider.Kubernetes.RateLimitDeployment.Container.Env {
		if !strings.HasPrefix(e.Name, "POD_") && !strings.Contains(section, "`"+e.Name+"`") {
			t.Errorf("docs/migration.md, Envoy Gateway: %s is not described", e.Name)
		}
	}
	for _, f := range append(yamlFiles(t, egDir), egDir) {
		if filepath.Base(f) != "kustomization.yaml" && !strings.Contains(section, filepath.Base(f)) {
			t.Errorf("docs/migration.md, Envoy Gateway: %s is not described", f)
		}
	}
	if c.Logging != nil {
		for comp, lvl := range c.Logging.Level {
			if !slices.Contains([]string{"debug", "info", "warn", "error"}, lvl) {
				t.Errorf("logging.level.%s: %q", comp, lvl)
			}
		}
	}
}

// TestEnvoyGatewayRateLimitPod checks the pod Envoy Gateway would run with
// the config: ringlimit's binary, a cluster over the peers Service, TLS
// that peers can speak, probes, ports and shutdown.
func TestEnvoyGatewayRateLimitPod(t *testing.T) {
	k := loadEGKit(t)
	d := k.deployment
	ps := d.Spec.Template.Spec
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers", len(ps.Containers))
	}
	c := ps.Containers[0]
	p := pod{name: "envoy-ratelimit-7d9f8c6b5-x2kqp", namespace: d.Namespace, ip: "10.244.1.17"}
	env, err := podEnv(c, p)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, kv := range env {
		name, v, _ := strings.Cut(kv, "=")
		vars[name] = v
	}

	t.Run("image", func(t *testing.T) {
		if !strings.HasPrefix(c.Image, "ghcr.io/ringlimit/ringlimit:") {
			t.Errorf("image %q", c.Image)
		}
		// The image's ENTRYPOINT, then serve.
		stages := dockerStages(t)
		entry := stages[len(stages)-1].all("ENTRYPOINT")
		if len(entry) != 1 || !slices.Equal(c.Command, execForm(t, entry[0])) || !slices.Equal(c.Args, []string{"serve"}) {
			t.Errorf("command %q args %q; want the image's entrypoint %v and [serve]", c.Command, c.Args, entry)
		}
		if ps.EnableServiceLinks == nil || *ps.EnableServiceLinks {
			t.Error("enableServiceLinks must be false (service variables collide with envoyproxy/ratelimit's)")
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 3 {
			t.Errorf("replicas %v: want 3 or more (each counter has a replica on another pod)", d.Spec.Replicas)
		}
		if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
			ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
			t.Errorf("strategy %+v: want a rolling update that starts a new pod before stopping an old one", d.Spec.Strategy)
		}
		if pdb := k.config.Provider.Kubernetes.RateLimitPDB; pdb == nil || pdb.MinAvailable != nil || pdb.MaxUnavailable == nil || pdb.MaxUnavailable.IntValue() != 1 {
			t.Errorf("rateLimitPDB %+v: want maxUnavailable: 1 (drains stop one pod at a time)", pdb)
		}
		if _, ok := vars["RINGLIMIT_DATA_DIR"]; ok {
			t.Error("RINGLIMIT_DATA_DIR: a Deployment's pods have no stable names or volumes to restore from")
		}
		if m := c.Resources.Requests[corev1.ResourceMemory]; m.Cmp(resource.MustParse("512Mi")) < 0 {
			t.Errorf("memory request %s is too small for the counter store", m.String())
		}
	})

	t.Run("cluster", func(t *testing.T) {
		if vars["RINGLIMIT_NODE_NAME"] != p.name || vars["RINGLIMIT_ADVERTISE_ADDR"] != p.ip {
			t.Errorf("node name %q, advertise %q: want the pod name and IP", vars["RINGLIMIT_NODE_NAME"], vars["RINGLIMIT_ADVERTISE_ADDR"])
		}
		peers := k.peers
		if peers.Namespace != d.Namespace || peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses {
			t.Errorf("peers Service %s/%s must be headless, in the pods' namespace %s, with publishNotReadyAddresses", peers.Namespace, peers.Name, d.Namespace)
		}
		if !selects(peers.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("peers Service selector %v does not select Envoy Gateway's pod labels %v", peers.Spec.Selector, d.Spec.Template.Labels)
		}
		if !selects(peers.Spec.Selector, k.rlService.Spec.Selector) {
			t.Errorf("peers Service selector %v is not Envoy Gateway's (%v)", peers.Spec.Selector, k.rlService.Spec.Selector)
		}
		want := peers.Name + "." + peers.Namespace + ".svc.cluster.local:"
		join := vars["RINGLIMIT_JOIN"]
		if !strings.HasPrefix(join, want) {
			t.Errorf("RINGLIMIT_JOIN=%s, want the peers Service %s<port>", join, want)
		}
		gossip := portOf(t, join)
		if addr, ok := vars["RINGLIMIT_GOSSIP_ADDR"]; ok && portOf(t, addr) != gossip {
			t.Errorf("RINGLIMIT_GOSSIP_ADDR=%s, joined at port %d", addr, gossip)
		} else if !ok && gossip != 7946 {
			t.Errorf("joined at port %d, gossip listens on 7946", gossip)
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			found := false
			for _, sp := range peers.Spec.Ports {
				if protocol(sp.Protocol) == proto && sp.Port == gossip && sp.TargetPort == intstr.FromInt32(gossip) {
					found = true
				}
			}
			if !found {
				t.Errorf("peers Service has no %s port %d for gossip", proto, gossip)
			}
		}
		if vars["RINGLIMIT_CLUSTER_NAME"] == "" || vars["RINGLIMIT_CLUSTER_NAME"] == "ringlimit" {
			t.Error("give the Envoy Gateway cluster its own RINGLIMIT_CLUSTER_NAME, apart from a kit-deployed ringlimit")
		}
	})

	t.Run("gossip-key", func(t *testing.T) {
		keyFile := vars["RINGLIMIT_GOSSIP_KEY_FILE"]
		vol, mount := mountOf(t, ps, c, filepath.Dir(keyFile))
		if vol.Secret == nil || !mount.ReadOnly || (vol.Secret.Optional != nil && *vol.Secret.Optional) {
			t.Fatalf("RINGLIMIT_GOSSIP_KEY_FILE=%s is not in a read-only, required Secret mount", keyFile)
		}
		mode, sc := vol.Secret.DefaultMode, ps.SecurityContext
		if mode == nil || *mode&0o007 != 0 || *mode&0o040 == 0 || sc == nil || sc.FSGroup == nil {
			t.Errorf("gossip key should be group-readable (fsGroup) and not world-readable: defaultMode %s, pod securityContext %+v", modeString(mode), sc)
		}
		checkGossipKeyExample(t, egSecretExample, d.Namespace, vol.Secret.SecretName, filepath.Base(keyFile))
	})

	t.Run("tls", func(t *testing.T) {
		// Envoy Gateway turns TLS on for the gRPC port; peers share that port,
		// so they need mTLS, with the same key pair and CA.
		if vars["GRPC_SERVER_USE_TLS"] != "true" {
			t.Skip("Envoy Gateway no longer turns TLS on")
		}
		for _, tc := range []struct{ peer, eg string }{
			{"RINGLIMIT_PEER_TLS_CERT", "GRPC_SERVER_TLS_CERT"},
			{"RINGLIMIT_PEER_TLS_KEY", "GRPC_SERVER_TLS_KEY"},
			{"RINGLIMIT_PEER_TLS_CA", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"},
			{"GRPC_CLIENT_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"},
		} {
			if vars[tc.peer] == "" || vars[tc.peer] != vars[tc.eg] {
				t.Errorf("%s=%q, want %s's %q", tc.peer, vars[tc.peer], tc.eg, vars[tc.eg])
			}
		}
		vol, _ := mountOf(t, ps, c, filepath.Dir(vars["GRPC_SERVER_TLS_CERT"]))
		if vol.Secret == nil || vol.Secret.SecretName != "envoy-rate-limit" {
			t.Errorf("certificates come from volume %+v, want Envoy Gateway's Secret envoy-rate-limit", vol)
		}
	})

	t.Run("ports-and-probes", func(t *testing.T) {
		debug := portOf(t, vars["RINGLIMIT_DEBUG_ADDR"])
		metrics := containerPort(c, intstr.FromString("metrics"))
		ann := d.Spec.Template.Annotations
		if metrics == nil || metrics.ContainerPort != debug || ann["prometheus.io/port"] != vars["RINGLIMIT_DEBUG_ADDR"][1:] || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("RINGLIMIT_DEBUG_ADDR=%s: want Envoy Gateway's metrics port %+v and scrape annotations %v", vars["RINGLIMIT_DEBUG_ADDR"], metrics, ann)
		}
		// ringlimit's defaults for the other listeners are Envoy Gateway's ports.
		grpc := containerPort(c, intstr.FromString("grpc"))
		if grpc == nil || grpc.ContainerPort != 8081 || servicePort(k.rlService, "http") != 8081 {
			t.Errorf("Envoy Gateway's gRPC port %+v is not ringlimit's default 8081", grpc)
		}
		for name := range vars {
			if slices.Contains([]string{"RINGLIMIT_GRPC_ADDR", "RINGLIMIT_HTTP_ADDR", "GRPC_PORT", "PORT"}, name) {
				t.Errorf("%s moves a listener off the port Envoy Gateway's Service and probes use", name)
			}
		}
		if r := c.ReadinessProbe; r == nil || r.HTTPGet == nil || r.HTTPGet.Path != "/healthcheck" || r.HTTPGet.Port.IntValue() != 8080 {
			t.Error("readiness must follow /healthcheck on 8080 (config loaded, cluster joined, not draining)")
		}
		for name, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "startup": c.StartupProbe} {
			if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != "/metrics" || pr.HTTPGet.Port.IntValue() != int(debug) {
				t.Errorf("%s probe %+v: want /metrics on the debug port %d (a restart helps no /healthcheck failure)", name, pr, debug)
			}
		}
	})

	t.Run("shutdown", func(t *testing.T) {
		d, err := time.ParseDuration(vars["RINGLIMIT_SHUTDOWN_TIMEOUT"])
		if err != nil {
			t.Fatalf("RINGLIMIT_SHUTDOWN_TIMEOUT: %v", err)
		}
		var preStop time.Duration
		if l := c.Lifecycle; l != nil && l.PreStop != nil && l.PreStop.Sleep != nil {
			preStop = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
		}
		if preStop == 0 {
			t.Error("no preStop sleep: Envoy keeps sending to a pod until DNS and the endpoints catch up")
		}
		if g := ps.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < preStop+d+5*time.Second {
			t.Errorf("terminationGracePeriodSeconds %v < preStop %v + shutdown timeout %v + 5s", g, preStop, d)
		}
	})
}

// modeString prints a file mode pointer in octal.
func modeString(m *int32) string {
	if m == nil {
		return "unset"
	}
	return fmt.Sprintf("%#o", *m)
}

// mountOf finds the container's mount at dir and its pod volume.
func mountOf(t *testing.T, ps corev1.PodSpec, c corev1.Container, dir string) (corev1.Volume, corev1.VolumeMount) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(dir) {
			continue
		}
		for _, v := range ps.Volumes {
			if v.Name == m.Name {
				return v, m
			}
		}
		t.Fatalf("mount %s: no volume %q", dir, m.Name)
	}
	t.Fatalf("no volume mounted at %s", dir)
	return corev1.Volume{}, corev1.VolumeMount{}
}

// TestEnvoyGatewayPodAcceptedByServe runs the real `ringlimit serve` parser
// on the environment the pod gets (Envoy Gateway's variables and the
// config's), and checks every variable the config sets takes effect.
func TestEnvoyGatewayPodAcceptedByServe(t *testing.T) {
	bin := needBinary(t)
	k := loadEGKit(t)
	c := k.deployment.Spec.Template.Spec.Containers[0]
	p := pod{name: "envoy-ratelimit-7d9f8c6b5-x2kqp", namespace: k.deployment.Namespace, ip: "10.244.1.17"}
	env, err := podEnv(c, p)
	if err != nil {
		t.Fatal(err)
	}
	args, err := podArgs(c, env)
	if err != nil {
		t.Fatal(err)
	}
	if len(args) < 2 {
		t.Fatalf("command line %q", args)
	}
	got, out, err := dryRun(t, bin, args[1:], env, "")
	if err != nil {
		t.Fatalf("ringlimit refused the pod's environment: %v\n%s", err, out)
	}
	for field, want := range map[string]string{
		"node-name":          p.name,
		"advertise-addr":     p.ip,
		"join":               "ringlimit-peers.envoy-gateway-system.svc.cluster.local:7946",
		"gossip-key-file":    "/etc/ringlimit/gossip/gossip.key",
		"cluster-name":       "envoy-gateway",
		"peer-tls-cert":      "/certs/tls.crt",
		"peer-tls-key":       "/certs/tls.key",
		"peer-tls-ca":        "/certs/ca.crt",
		"grpc-tls-cert":      "/certs/tls.crt", // Envoy Gateway's GRPC_SERVER_TLS_CERT
		"grpc-tls-key":       "/certs/tls.key",
		"grpc-addr":          ":8081",
		"http-addr":          ":8080",
		"debug-addr":         ":19001",
		"shutdown-timeout":   "30s",
		"log-level":          "info", // Envoy Gateway's LOG_LEVEL
		"data-dir":           "",
		"grpc-tls-client-ca": "/certs/ca.crt",
		"config-type":        "GRPC_XDS_SOTW",
	} {
		if got[field] != want {
			t.Errorf("%s = %q, want %q\n%s", field, got[field], want, out)
		}
	}
	// Every variable the config adds is a serve flag's RINGLIMIT_ variable
	// (whose effect is checked above), one of the reference's that ringlimit
	// reads (checked above too), or one that another variable's value
	// refers to.
	flags := serveFlagNames(t, bin)
	refs := map[string]bool{}
	for _, e := range k.config.Provider.Kubernetes.RateLimitDeployment.Container.Env {
		for _, m := range regexp.MustCompile(`\$\((\w+)\)`).FindAllStringSubmatch(e.Value, -1) {
			refs[m[1]] = true
		}
	}
	for _, e := range k.config.Provider.Kubernetes.RateLimitDeployment.Container.Env {
		if f, ok := strings.CutPrefix(e.Name, "RINGLIMIT_"); ok {
			if !flags[strings.ToLower(strings.ReplaceAll(f, "_", "-"))] {
				t.Errorf("%s: ringlimit serve has no flag --%s", e.Name, strings.ToLower(strings.ReplaceAll(f, "_", "-")))
			}
			continue
		}
		if !referenceEnv[e.Name] && !refs[e.Name] {
			t.Errorf("%s: ringlimit does not read it and no other variable refers to it", e.Name)
		}
	}
}

// serveFlagNames lists `ringlimit serve`'s flags, from its -h output.
func serveFlagNames(t *testing.T, bin string) map[string]bool {
	t.Helper()
	_, out, _ := dryRun(t, bin, []string{"serve", "-h"}, nil, "")
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(out, -1) {
		names[m[1]] = true
	}
	if !names["join"] || !names["node-name"] {
		t.Fatalf("could not read serve's flags from -h:\n%s", out)
	}
	return names
}

// TestEnvoyGatewayResources checks the Gateway API and Envoy Gateway objects
// against their CRDs' schemas, and that they refer to each other.
func TestEnvoyGatewayResources(t *testing.T) {
	k := loadEGKit(t)
	schemas := mustEGSchemas(t)
	byKind := map[string][]object{}
	for _, o := range k.objects {
		if err := schemas.check(o); err != nil {
			t.Error(err)
		}
		byKind[kindOf(o)] = append(byKind[kindOf(o)], o)
	}
	for _, kind := range []string{"GatewayClass", "Gateway", "HTTPRoute", "BackendTrafficPolicy"} {
		if len(byKind[kind]) != 1 {
			t.Fatalf("%d %s objects, want 1", len(byKind[kind]), kind)
		}
	}
	gc, gw, route, btp := byKind["GatewayClass"][0], byKind["Gateway"][0], byKind["HTTPRoute"][0], byKind["BackendTrafficPolicy"][0]
	str := func(o object, ptr string) string {
		v, err := jsonPointer(o, ptr)
		if err != nil {
			t.Fatalf("%s: %v", objectKey(o), err)
		}
		s, _ := v.(string)
		return s
	}
	if str(gc, "/spec/controllerName") != k.config.Gateway.ControllerName {
		t.Errorf("GatewayClass controllerName %q is not Envoy Gateway's %q", str(gc, "/spec/controllerName"), k.config.Gateway.ControllerName)
	}
	if str(gw, "/spec/gatewayClassName") != nameOf(gc) {
		t.Error("the Gateway does not use the GatewayClass")
	}
	if str(route, "/spec/parentRefs/0/name") != nameOf(gw) || nsOf(route) != nsOf(gw) {
		t.Error("the HTTPRoute is not attached to the Gateway")
	}
	if str(btp, "/spec/targetRefs/0/kind") != "Gateway" || str(btp, "/spec/targetRefs/0/name") != nameOf(gw) || nsOf(btp) != nsOf(gw) {
		t.Error("the BackendTrafficPolicy does not target the Gateway (in its namespace)")
	}
	// The seed scenario's limit: 100 a minute per client IP, counted by the
	// rate limit service (global), not by each Envoy (local).
	if _, err := jsonPointer(btp, "/spec/rateLimit/local"); err == nil {
		t.Error("a local rate limit is counted per Envoy, not by ringlimit")
	}
	rule, err := jsonPointer(btp, "/spec/rateLimit/global/rules/0")
	if err != nil {
		t.Fatal(err)
	}
	r := rule.(map[string]any)
	if str(r, "/limit/unit") != "Minute" || r["limit"].(map[string]any)["requests"] != float64(100) ||
		str(r, "/clientSelectors/0/sourceCIDR/type") != "Distinct" || str(r, "/clientSelectors/0/sourceCIDR/value") != "0.0.0.0/0" {
		t.Errorf("rule %v: want 100 per Minute for each distinct client IP", r)
	}
}
