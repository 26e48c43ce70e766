package deploy_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestManifestFilesDecodeStrictly decodes every YAML file under kubernetes/
// on its own, patches included, into its k8s.io/api type (or, for
// kustomize's files and the ServiceMonitor, a strict mirror of the fields
// used).
func TestManifestFilesDecodeStrictly(t *testing.T) {
	dec := mustDecoder(t)
	files := yamlFiles(t, kubeDir)
	if len(files) < 10 {
		t.Fatalf("found only %d YAML files under %s", len(files), kubeDir)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if filepath.Base(f) == "kustomization.yaml" {
				if _, err := loadKustomization(filepath.Dir(f)); err != nil {
					t.Fatal(err)
				}
				return
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			docs, err := yamlDocs(data)
			if err != nil || len(docs) == 0 {
				t.Fatalf("%d documents, err %v", len(docs), err)
			}
			for _, d := range docs {
				var head struct{ Kind string }
				_ = yamlUnmarshalLoose(d, &head)
				if head.Kind == "ServiceMonitor" {
					var sm serviceMonitor
					if err := decodeStrictInto(d, &sm); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if _, err := decodeTyped(dec, d); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestStrictDecoderRejects shows the decoder the other tests rely on refuses
// what a lenient one would let through.
func TestStrictDecoderRejects(t *testing.T) {
	dec := mustDecoder(t)
	const sts = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: x\nspec:\n"
	for _, tc := range []struct{ name, doc string }{
		{"unknown field", sts + "  replicsa: 3\n"},
		{"wrong type", sts + "  replicas: three\n"},
		{"wrong case", sts + "  Replicas: 3\n"},
		{"duplicate key", sts + "  replicas: 3\n  replicas: 4\n"},
		{"unknown nested field", "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  ports:\n    - port: 80\n      targetport: 81\n"},
		{"bad quantity", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers:\n    - name: c\n      resources:\n        limits:\n          memory: lots\n"},
		{"unknown kind", "apiVersion: v1\nkind: Servise\nmetadata:\n  name: x\n"},
	} {
		if _, err := decodeTyped(dec, []byte(tc.doc)); err == nil {
			t.Errorf("%s: decoded without error", tc.name)
		}
	}
	var k kustomization
	if err := decodeStrictInto([]byte("resource:\n  - a.yaml\n"), &k); err == nil {
		t.Error("kustomization with a misspelt key decoded without error")
	}
}

// TestKustomizationsListEveryFile: each kustomization lists every YAML file
// beside it (and nothing that does not exist), but for the monitoring
// files that are not Kubernetes objects; the only YAML left out are the
// gossip key Secret examples, which must stay out.
func TestKustomizationsListEveryFile(t *testing.T) {
	notObjects := map[string]bool{filepath.Clean(dashboardFile): true, filepath.Clean(rulesFile): true}
	secretExamples := map[string]bool{filepath.Clean(secretExample): true, filepath.Clean(egSecretExample): true}
	dirs := map[string]bool{}
	for _, f := range slices.Concat(yamlFiles(t, kubeDir), yamlFiles(t, istioDir), yamlFiles(t, monitoringDir), yamlFiles(t, egDir)) {
		if filepath.Base(f) == "kustomization.yaml" {
			dirs[filepath.Dir(f)] = true
		}
	}
	referenced := map[string]bool{}
	for _, dir := range sortedKeys(dirs) {
		k, err := loadKustomization(dir)
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		check := func(rel string, wantDir bool, what string) {
			p := filepath.Clean(filepath.Join(dir, rel))
			st, err := os.Stat(p)
			switch {
			case err != nil:
				t.Errorf("%s: %s %q: %v", dir, what, rel, err)
			case st.IsDir() != wantDir:
				t.Errorf("%s: %s %q: is a directory: %v", dir, what, rel, st.IsDir())
			case st.IsDir():
				if !dirs[p] {
					t.Errorf("%s: %s %q has no kustomization.yaml", dir, what, rel)
				}
				referenced[p] = true
			default:
				if filepath.Dir(p) != dir {
					t.Errorf("%s: %s %q is outside the kustomization's directory", dir, what, rel)
				}
				if listed[p] {
					t.Errorf("%s: %q listed twice", dir, rel)
				}
				listed[p] = true
			}
		}
		for _, r := range k.Resources {
			p := filepath.Join(dir, r)
			st, err := os.Stat(p)
			check(r, err == nil && st.IsDir(), "resource")
		}
		for _, c := range k.Components {
			check(c, true, "component")
		}
		for _, p := range k.Patches {
			if p.Path != "" {
				check(p.Path, false, "patch")
			}
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			if e.IsDir() || e.Name() == "kustomization.yaml" || notObjects[p] {
				continue
			}
			if !isYAML(e.Name()) {
				t.Errorf("%s: unexpected file %s in a kustomization directory", dir, e.Name())
				continue
			}
			switch {
			case secretExamples[p] && listed[p]:
				t.Errorf("%s: lists the Secret example %s; it must stay out", dir, e.Name())
			case !secretExamples[p] && !listed[p]:
				t.Errorf("%s: %s exists but kustomization.yaml does not list it", dir, e.Name())
			}
		}
	}
	// Every kustomization is an entry point the docs name or is used by one.
	roots := map[string]bool{filepath.Clean(overlayDir): true, filepath.Clean(monOverlayDir): true, filepath.Clean(istioDir): true, filepath.Clean(baseDir): true, filepath.Clean(egDir): true}
	for dir := range dirs {
		if !roots[dir] && !referenced[dir] {
			t.Errorf("%s: kustomization not used by any other", dir)
		}
	}
	for _, f := range append(yamlFiles(t, kubeDir), yamlFiles(t, egDir)...) {
		if !dirs[filepath.Dir(f)] && !secretExamples[f] {
			t.Errorf("%s: YAML outside any kustomization", f)
		}
	}
}

// TestRenderMatchesKubectl: the tests' own renderer agrees with kustomize
// itself (skipped where kubectl is not installed).
func TestRenderMatchesKubectl(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed: the test renderer is not compared with kustomize")
	}
	for _, dir := range []string{baseDir, overlayDir, monOverlayDir, istioDir, egDir} {
		t.Run(dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, kubectl, "kustomize", dir)
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
			}
			docs, err := yamlDocs(out)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]object{}
			for _, d := range docs {
				var o object
				if err := decodeStrictInto(d, &o); err != nil {
					t.Fatal(err)
				}
				want[objectKey(o)] = o
			}
			objs, err := render(dir)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]object{}
			for _, o := range objs {
				got[objectKey(o)] = o
			}
			if !slices.Equal(sortedKeys(got), sortedKeys(want)) {
				t.Fatalf("objects differ:\n ours:    %q\n kubectl: %q", sortedKeys(got), sortedKeys(want))
			}
			for key, w := range want {
				if g := got[key]; !reflect.DeepEqual(g, w) {
					gj, _ := json.MarshalIndent(g, "", " ")
					wj, _ := json.MarshalIndent(w, "", " ")
					t.Errorf("%s differs:\nours:\n%s\nkubectl:\n%s", key, gj, wj)
				}
			}
		})
	}
}

// TestExampleRunsOnABareCluster: the example overlay needs no CRDs and
// schedules three pods on a small test cluster; the monitoring overlay is
// the same objects plus the ServiceMonitor and the PrometheusRule.
func TestExampleRunsOnABareCluster(t *testing.T) {
	ks := kits(t)
	mon, ex := ks[1], ks[2]
	if mon.name != monOverlayDir || ex.name != overlayDir {
		t.Fatalf("kits are %s and %s", mon.name, ex.name)
	}
	if len(ex.serviceMonitors)+len(ex.prometheusRules) > 0 {
		t.Errorf("%s has Prometheus Operator objects: it must apply on a cluster without the Operator's CRDs", ex.name)
	}
	c := ex.container(t)
	for r, most := range map[corev1.ResourceName]string{corev1.ResourceCPU: "100m", corev1.ResourceMemory: "128Mi"} {
		if q := c.Resources.Requests[r]; q.Cmp(resource.MustParse(most)) > 0 {
			t.Errorf("%s requests %s %s per pod; keep it at most %s so three pods fit a laptop's kind cluster", ex.name, q.String(), r, most)
		}
	}
	if len(mon.serviceMonitors) != 1 || len(mon.prometheusRules) != 1 {
		t.Errorf("%s: %d ServiceMonitors, %d PrometheusRules; want one of each", mon.name, len(mon.serviceMonitors), len(mon.prometheusRules))
	}
	if !reflect.DeepEqual(mon.statefulSet.Spec.Template.Spec, ex.statefulSet.Spec.Template.Spec) || len(mon.services) != len(ex.services) {
		t.Errorf("%s's pods differ from %s's beyond the scrape annotation", mon.name, ex.name)
	}
}

func TestConfigMapIsTheExampleConfig(t *testing.T) {
	want, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kits(t) {
		cm := k.configMaps["ringlimit-config"]
		if cm == nil {
			t.Fatalf("%s: no ConfigMap ringlimit-config", k.name)
		}
		if len(cm.Data) != 1 || len(cm.BinaryData) != 0 {
			t.Errorf("%s: ConfigMap has %d keys, want ratelimit.yaml only", k.name, len(cm.Data)+len(cm.BinaryData))
		}
		if got := cm.Data["ratelimit.yaml"]; got != string(want) {
			t.Errorf("%s: ConfigMap ratelimit.yaml is not byte-identical to %s:\n%q\nwant\n%q", k.name, exampleConfig, got, want)
		}
	}
}

func TestGossipKeySecretExample(t *testing.T) {
	k := overlayKit(t)
	vol, mount := volumeFor(t, k, func(v corev1.Volume) bool { return v.Secret != nil })
	keyFile := mustFlag(t, k.container(t).Args, "gossip-key-file")
	if filepath.Dir(keyFile) != filepath.Clean(mount.MountPath) {
		t.Errorf("--gossip-key-file=%s is not in the Secret's mount %s", keyFile, mount.MountPath)
	}
	checkGossipKeyExample(t, secretExample, k.namespace, vol.Secret.SecretName, filepath.Base(keyFile))
}

// checkGossipKeyExample checks an example gossip key Secret: the name,
// namespace and key the pods mount, holding a placeholder that never works
// as a key.
func checkGossipKeyExample(t *testing.T, path, namespace, name, key string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := decodeTyped(mustDecoder(t), data)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := obj.(*corev1.Secret)
	if !ok {
		t.Fatalf("%s is a %T, want a Secret", path, obj)
	}
	if s.Name != name || s.Namespace != namespace {
		t.Errorf("%s: Secret %s/%s, the pods mount %s/%s", path, s.Namespace, s.Name, namespace, name)
	}
	placeholder, ok := s.StringData[key]
	if !ok || len(s.StringData)+len(s.Data) != 1 {
		t.Fatalf("%s: example Secret should hold exactly the key %q, has %v", path, key, sortedKeys(s.StringData))
	}
	// The placeholder must never work as a key, so that applying the
	// example by mistake fails loudly.
	if b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(placeholder)); err == nil && (len(b) == 16 || len(b) == 24 || len(b) == 32) {
		t.Errorf("%s holds a usable key; commit a placeholder, never a key", path)
	}
}

// TestKitConsistency checks that the objects of the base and of the example
// overlay agree with each other.
func TestKitConsistency(t *testing.T) {
	for _, k := range kits(t) {
		t.Run(k.name, func(t *testing.T) { checkKit(t, k) })
	}
}

func checkKit(t *testing.T, k *kit) {
	sts := k.statefulSet
	podSpec := sts.Spec.Template.Spec
	podLabels := sts.Spec.Template.Labels
	c := k.container(t)
	_, _, args := expandedPod(t, k, 0, "10.1.2.3")
	if len(args) == 0 || args[0] != "serve" || len(c.Command) != 0 {
		t.Errorf("container should run the image entrypoint with args [serve ...], has command %q args %q", c.Command, c.Args)
	}

	t.Run("workload", func(t *testing.T) {
		if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
			t.Errorf("replicas = %v, want 3", sts.Spec.Replicas)
		}
		if sts.Spec.PodManagementPolicy != "Parallel" {
			t.Errorf("podManagementPolicy = %q, want Parallel", sts.Spec.PodManagementPolicy)
		}
		if sts.Spec.UpdateStrategy.Type != "RollingUpdate" {
			t.Errorf("updateStrategy = %q, want RollingUpdate", sts.Spec.UpdateStrategy.Type)
		}
		if sts.Spec.Selector == nil || len(sts.Spec.Selector.MatchExpressions) > 0 || !selects(sts.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("selector %v does not select the pod labels %v", sts.Spec.Selector, podLabels)
		}
		if !strings.HasPrefix(c.Image, "ghcr.io/ringlimit/ringlimit:") {
			t.Errorf("image %q", c.Image)
		}
		if sa := k.serviceAccounts[podSpec.ServiceAccountName]; sa == nil {
			t.Errorf("ServiceAccount %q is not in the kit", podSpec.ServiceAccountName)
		} else if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Error("ServiceAccount mounts a token; ringlimit needs no API access")
		}
		for _, n := range k.namespaces {
			if n.Name != k.namespace {
				t.Errorf("Namespace %s created, pods run in %s", n.Name, k.namespace)
			}
		}
	})

	t.Run("security", func(t *testing.T) {
		psc := podSpec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			t.Fatalf("pod must run as a non-root user: %+v", psc)
		}
		if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Error("pod seccompProfile should be RuntimeDefault")
		}
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Fatal("container has no securityContext")
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Error("allowPrivilegeEscalation must be false")
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Error("readOnlyRootFilesystem must be true")
		case sc.Privileged != nil && *sc.Privileged:
			t.Error("container is privileged")
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
			t.Error("capabilities must drop ALL and add none")
		}
		if podSpec.HostNetwork || podSpec.HostPID || podSpec.HostIPC {
			t.Error("pod uses host namespaces")
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				t.Errorf("port %s uses a hostPort", p.Name)
			}
		}
		if podSpec.AutomountServiceAccountToken == nil || *podSpec.AutomountServiceAccountToken {
			t.Error("automountServiceAccountToken must be false")
		}
		if podSpec.EnableServiceLinks == nil || *podSpec.EnableServiceLinks {
			t.Error("enableServiceLinks must be false (service variables collide with envoyproxy/ratelimit's)")
		}
	})

	t.Run("resources", func(t *testing.T) {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := c.Resources.Requests[r]
			lim, okLim := c.Resources.Limits[r]
			if !okReq || !okLim {
				t.Errorf("%s: requests and limits must both be set", r)
				continue
			}
			if req.Cmp(lim) > 0 {
				t.Errorf("%s: request %s above limit %s", r, req.String(), lim.String())
			}
		}
		if m := c.Resources.Requests[corev1.ResourceMemory]; m.Cmp(resource.MustParse("128Mi")) < 0 {
			t.Errorf("memory request %s is too small for the counter store", m.String())
		}
	})

	t.Run("spread", func(t *testing.T) {
		spread := false
		for _, tsc := range podSpec.TopologySpreadConstraints {
			if tsc.TopologyKey == "kubernetes.io/hostname" && tsc.LabelSelector != nil && selects(tsc.LabelSelector.MatchLabels, podLabels) {
				spread = true
			}
		}
		if a := podSpec.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && selects(term.LabelSelector.MatchLabels, podLabels) {
					spread = true
				}
			}
			for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				term := w.PodAffinityTerm
				if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && selects(term.LabelSelector.MatchLabels, podLabels) {
					spread = true
				}
			}
		}
		if !spread {
			t.Error("no topology spread or anti-affinity over kubernetes.io/hostname selecting the pods")
		}
	})

	t.Run("flags-and-ports", func(t *testing.T) {
		for _, tc := range []struct {
			flag, port string
			proto      corev1.Protocol
		}{
			{"grpc-addr", "grpc", corev1.ProtocolTCP},
			{"http-addr", "http", corev1.ProtocolTCP},
			{"debug-addr", "metrics", corev1.ProtocolTCP},
			{"gossip-addr", "gossip", corev1.ProtocolTCP},
			{"gossip-addr", "gossip-udp", corev1.ProtocolUDP},
		} {
			want := portOf(t, mustFlag(t, args, tc.flag))
			cp := containerPort(c, intstr.FromString(tc.port))
			if cp == nil || cp.ContainerPort != want || protocol(cp.Protocol) != tc.proto {
				t.Errorf("--%s listens on %d; container port %q is %+v, want %d/%s", tc.flag, want, tc.port, cp, want, tc.proto)
			}
		}
		// Listeners bind the pod IP; peers reach this node at the pod IP.
		for _, f := range []string{"grpc-addr", "http-addr", "debug-addr", "gossip-addr"} {
			if raw := mustFlag(t, c.Args, f); !strings.HasPrefix(raw, "[$(POD_IP)]:") {
				t.Errorf("--%s=%s should bind [$(POD_IP)]:port", f, raw)
			}
		}
		fieldOf := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				fieldOf[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		for _, tc := range []struct{ flag, raw, field string }{
			{"node-name", "$(POD_NAME)", "metadata.name"},
			{"advertise-addr", "$(POD_IP)", "status.podIP"},
		} {
			if got := mustFlag(t, c.Args, tc.flag); got != tc.raw {
				t.Errorf("--%s=%s, want %s", tc.flag, got, tc.raw)
			}
			v := strings.TrimSuffix(strings.TrimPrefix(tc.raw, "$("), ")")
			if fieldOf[v] != tc.field {
				t.Errorf("%s should come from fieldRef %s, comes from %q", v, tc.field, fieldOf[v])
			}
		}
		if fieldOf["POD_NAMESPACE"] != "metadata.namespace" {
			t.Error("POD_NAMESPACE should come from fieldRef metadata.namespace")
		}
		peers := k.services[sts.Spec.ServiceName]
		wantJoin := peers.Name + "." + k.namespace + ".svc.cluster.local:7946"
		if got := mustFlag(t, args, "join"); got != wantJoin {
			t.Errorf("--join=%s, want the peers Service %s", got, wantJoin)
		}
		if gp := containerPort(c, intstr.FromString("gossip")); gp == nil || portOf(t, wantJoin) != gp.ContainerPort {
			t.Errorf("--join port is not the gossip port")
		}
	})

	t.Run("services", func(t *testing.T) {
		if len(k.services) != 3 {
			t.Errorf("services %v, want peers, rls and tools", sortedKeys(k.services))
		}
		for _, name := range sortedKeys(k.services) {
			svc := k.services[name]
			if !selects(svc.Spec.Selector, podLabels) {
				t.Errorf("Service %s selector %v does not select the pods %v", name, svc.Spec.Selector, podLabels)
			}
			headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
			for _, sp := range svc.Spec.Ports {
				target := sp.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(sp.Port)
				}
				cp := containerPort(c, target)
				switch {
				case cp == nil:
					t.Errorf("Service %s port %s: targetPort %s is no container port", name, sp.Name, target.String())
				case protocol(cp.Protocol) != protocol(sp.Protocol):
					t.Errorf("Service %s port %s: protocol %s, container port %s is %s", name, sp.Name, protocol(sp.Protocol), cp.Name, protocol(cp.Protocol))
				case sp.Port != cp.ContainerPort:
					// Headless clients dial pod IPs at the Service port.
					t.Errorf("Service %s port %s: %d, container port %s is %d (headless: %v)", name, sp.Name, sp.Port, cp.Name, cp.ContainerPort, headless)
				}
			}
		}
		peers := k.services[sts.Spec.ServiceName]
		if peers == nil {
			t.Fatalf("serviceName %q is not a Service of the kit", sts.Spec.ServiceName)
		}
		if peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses {
			t.Errorf("peers Service %s must be headless with publishNotReadyAddresses", peers.Name)
		}
		if !hasPort(peers, "gossip", corev1.ProtocolTCP) || !hasPort(peers, "gossip-udp", corev1.ProtocolUDP) {
			t.Errorf("peers Service must carry gossip over TCP and UDP")
		}
		rls := k.services["ringlimit-rls"]
		if rls == nil || rls.Spec.ClusterIP != corev1.ClusterIPNone || rls.Spec.PublishNotReadyAddresses || !hasPort(rls, "grpc", corev1.ProtocolTCP) {
			t.Errorf("Envoy's Service ringlimit-rls must be headless, list ready pods only, and carry grpc: %+v", rls)
		}
		tools := k.services["ringlimit"]
		if tools == nil || tools.Spec.Type != corev1.ServiceTypeClusterIP || tools.Spec.ClusterIP == corev1.ClusterIPNone ||
			!hasPort(tools, "grpc", corev1.ProtocolTCP) || !hasPort(tools, "http", corev1.ProtocolTCP) {
			t.Errorf("tools Service ringlimit must be a ClusterIP on grpc and http: %+v", tools)
		}
	})

	t.Run("config-mount", func(t *testing.T) {
		vol, mount := volumeFor(t, k, func(v corev1.Volume) bool { return v.ConfigMap != nil })
		if mustFlag(t, args, "config") != mount.MountPath {
			t.Errorf("--config=%s, the ConfigMap is mounted at %s", mustFlag(t, args, "config"), mount.MountPath)
		}
		if mount.SubPath != "" || mount.SubPathExpr != "" {
			t.Error("a subPath mount never sees ConfigMap updates; mount the directory")
		}
		if !mount.ReadOnly {
			t.Error("config mount should be readOnly")
		}
		if k.configMaps[vol.ConfigMap.Name] == nil {
			t.Errorf("volume %s mounts ConfigMap %q, which is not in the kit", vol.Name, vol.ConfigMap.Name)
		}
		if vol.ConfigMap.Optional != nil && *vol.ConfigMap.Optional {
			t.Error("the config volume must not be optional")
		}
	})

	t.Run("gossip-key", func(t *testing.T) {
		vol, mount := volumeFor(t, k, func(v corev1.Volume) bool { return v.Secret != nil })
		keyFile := mustFlag(t, args, "gossip-key-file")
		if filepath.Dir(keyFile) != filepath.Clean(mount.MountPath) || !mount.ReadOnly {
			t.Errorf("--gossip-key-file=%s is not in the read-only Secret mount %s", keyFile, mount.MountPath)
		}
		if vol.Secret.Optional != nil && *vol.Secret.Optional {
			t.Error("the gossip key Secret must not be optional")
		}
		mode := vol.Secret.DefaultMode
		fsGroup := podSpec.SecurityContext.FSGroup
		if mode == nil || *mode&0o007 != 0 || *mode&0o040 == 0 || fsGroup == nil {
			t.Errorf("gossip key should be group-readable (fsGroup) and not world-readable: mode %v fsGroup %v", mode, fsGroup)
		}
	})

	t.Run("data-dir", func(t *testing.T) {
		dataDir := mustFlag(t, args, "data-dir")
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if filepath.Clean(m.MountPath) == filepath.Clean(dataDir) {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			t.Fatalf("--data-dir=%s is not a volume mount (the root file system is read-only)", dataDir)
		}
		if mount.ReadOnly || mount.SubPath != "" || mount.SubPathExpr != "" {
			t.Errorf("data mount %+v must be writable and whole", *mount)
		}
		for _, v := range podSpec.Volumes {
			if v.Name == mount.Name {
				t.Errorf("volume %s is a pod volume; the base keeps --data-dir on a volumeClaimTemplate, so it outlives the pod", v.Name)
			}
		}
		var claim *corev1.PersistentVolumeClaim
		for i, pvc := range sts.Spec.VolumeClaimTemplates {
			if pvc.Name == mount.Name {
				claim = &sts.Spec.VolumeClaimTemplates[i]
			}
		}
		if claim == nil {
			t.Fatalf("mount %s of --data-dir has no volumeClaimTemplate", mount.Name)
		}
		if !slices.Equal(claim.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) {
			t.Errorf("data claim access modes %v, want [ReadWriteOnce] (one pod per volume)", claim.Spec.AccessModes)
		}
		// The snapshot is at most about --max-store-bytes, and a save
		// writes the next one beside it before the rename.
		storeBytes := resource.MustParse("256Mi")
		if v, ok := flagValue(args, "max-store-bytes"); ok {
			storeBytes = resource.MustParse(v)
		}
		want := storeBytes.DeepCopy()
		want.Add(storeBytes)
		if got := claim.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(want) < 0 {
			t.Errorf("data claim asks for %s, less than twice --max-store-bytes (%s)", got.String(), want.String())
		}
		if !selects(sts.Spec.Selector.MatchLabels, claim.Labels) {
			t.Errorf("data claim labels %v do not carry the StatefulSet's selector %v (kubectl get pvc -l ... should find them)", claim.Labels, sts.Spec.Selector.MatchLabels)
		}
		if podSpec.SecurityContext == nil || podSpec.SecurityContext.FSGroup == nil {
			t.Error("no fsGroup: the non-root user cannot write the data volume")
		}
	})

	t.Run("probes", func(t *testing.T) {
		httpPort := portOf(t, mustFlag(t, args, "http-addr"))
		debugPort := portOf(t, mustFlag(t, args, "debug-addr"))
		paths := map[int32][]string{
			httpPort:  {"/healthcheck", "/json"},
			debugPort: {"/metrics", "/rlconfig", "/debug/cluster", "/debug/pprof/"},
		}
		for _, tc := range []struct {
			name  string
			probe *corev1.Probe
		}{{"readiness", c.ReadinessProbe}, {"liveness", c.LivenessProbe}} {
			if tc.probe == nil || tc.probe.HTTPGet == nil {
				t.Errorf("%s probe should be an httpGet", tc.name)
				continue
			}
			g := tc.probe.HTTPGet
			cp := containerPort(c, g.Port)
			if cp == nil {
				t.Errorf("%s probe port %s is no container port", tc.name, g.Port.String())
				continue
			}
			if !slices.Contains(paths[cp.ContainerPort], g.Path) {
				t.Errorf("%s probe %s on port %d: ringlimit serves %v there", tc.name, g.Path, cp.ContainerPort, paths[cp.ContainerPort])
			}
			if g.Host != "" || (g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP) {
				t.Errorf("%s probe: host %q scheme %q", tc.name, g.Host, g.Scheme)
			}
		}
		if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/healthcheck" {
			t.Error("readiness must follow /healthcheck (config loaded, cluster joined, not draining)")
		}
		if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/healthcheck" {
			t.Error("liveness on /healthcheck restarts nodes that merely cannot reach their peers")
		}
	})

	t.Run("shutdown", func(t *testing.T) {
		d, err := time.ParseDuration(mustFlag(t, args, "shutdown-timeout"))
		if err != nil {
			t.Fatal(err)
		}
		var preStop time.Duration
		if l := c.Lifecycle; l != nil && l.PreStop != nil {
			switch {
			case l.PreStop.Sleep != nil:
				preStop = time.Duration(l.PreStop.Sleep.Seconds) * time.Second
			case l.PreStop.Exec != nil:
				t.Error("preStop exec: the distroless image has no shell or sleep binary")
			}
		}
		if preStop == 0 {
			t.Error("no preStop sleep: Envoy keeps sending to a pod until DNS and health checks catch up")
		}
		var grace time.Duration
		if g := podSpec.TerminationGracePeriodSeconds; g != nil {
			grace = time.Duration(*g) * time.Second
		}
		if grace < preStop+d+5*time.Second {
			t.Errorf("terminationGracePeriodSeconds %v < preStop %v + --shutdown-timeout %v + 5s", grace, preStop, d)
		}
	})

	t.Run("pdb", func(t *testing.T) {
		if len(k.pdbs) != 1 {
			t.Fatalf("%d PodDisruptionBudgets, want 1", len(k.pdbs))
		}
		p := k.pdbs[0]
		if p.Spec.Selector == nil || !selects(p.Spec.Selector.MatchLabels, podLabels) {
			t.Errorf("PDB selector %v does not select the pods", p.Spec.Selector)
		}
		if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.Type != intstr.Int || p.Spec.MaxUnavailable.IntVal != 1 || p.Spec.MinAvailable != nil {
			t.Errorf("PDB should allow maxUnavailable: 1, has %+v", p.Spec)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		ann := sts.Spec.Template.Annotations
		mp := containerPort(c, intstr.FromString("metrics"))
		if mp == nil || ann["prometheus.io/port"] != strconv.Itoa(int(mp.ContainerPort)) || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("scrape annotations %v do not point at the metrics port %+v", ann, mp)
		}
		wantScrape := "true"
		if len(k.serviceMonitors) > 0 {
			wantScrape = "false" // scraped by the ServiceMonitor instead
		}
		if ann["prometheus.io/scrape"] != wantScrape {
			t.Errorf("prometheus.io/scrape = %q, want %q (%d ServiceMonitors)", ann["prometheus.io/scrape"], wantScrape, len(k.serviceMonitors))
		}
		for _, sm := range k.serviceMonitors {
			if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" {
				t.Errorf("ServiceMonitor %s/%s", sm.APIVersion, sm.Kind)
			}
			if ns := sm.Metadata.Namespace; ns != sts.Namespace {
				t.Errorf("ServiceMonitor in namespace %q, pods in %q", ns, sts.Namespace)
			}
			for _, ep := range sm.Spec.Endpoints {
				var hits []string
				for _, name := range sortedKeys(k.services) {
					svc := k.services[name]
					if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
						continue
					}
					for _, sp := range svc.Spec.Ports {
						if sp.Name == ep.Port {
							hits = append(hits, name)
							if cp := containerPort(c, sp.TargetPort); cp == nil || cp.ContainerPort != mp.ContainerPort {
								t.Errorf("ServiceMonitor port %s on Service %s is not the metrics port", ep.Port, name)
							}
						}
					}
				}
				if len(hits) != 1 || ep.Path != "/metrics" {
					t.Errorf("ServiceMonitor endpoint %q %s selects Services %v; want exactly one, path /metrics", ep.Port, ep.Path, hits)
				}
			}
		}
		if len(k.prometheusRules) != len(k.serviceMonitors) {
			t.Errorf("%d PrometheusRules with %d ServiceMonitors: the monitoring component adds one of each", len(k.prometheusRules), len(k.serviceMonitors))
		}
		for _, pr := range k.prometheusRules {
			if ns := pr.Metadata.Namespace; ns != sts.Namespace {
				t.Errorf("PrometheusRule in namespace %q, pods in %q", ns, sts.Namespace)
			}
			if !reflect.DeepEqual(pr.Spec, loadRules(t)) {
				t.Errorf("PrometheusRule %s is not %s", pr.Metadata.Name, rulesFile)
			}
		}
	})
}

// selects reports whether a non-empty selector matches labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// containerPort resolves a port by name or number.
func containerPort(c corev1.Container, p intstr.IntOrString) *corev1.ContainerPort {
	for i, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return &c.Ports[i]
		}
	}
	return nil
}

func hasPort(svc *corev1.Service, name string, proto corev1.Protocol) bool {
	for _, p := range svc.Spec.Ports {
		if p.Name == name && protocol(p.Protocol) == proto {
			return true
		}
	}
	return false
}

// servicePort is the number of a Service's named port, or 0.
func servicePort(svc *corev1.Service, name string) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p.Port
		}
	}
	return 0
}

// volumeFor finds the one volume matching pick and the container's mount of
// it.
func volumeFor(t *testing.T, k *kit, pick func(corev1.Volume) bool) (corev1.Volume, corev1.VolumeMount) {
	t.Helper()
	var found []corev1.Volume
	for _, v := range k.statefulSet.Spec.Template.Spec.Volumes {
		if pick(v) {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d matching volumes, want 1", k.name, len(found))
	}
	for _, m := range k.container(t).VolumeMounts {
		if m.Name == found[0].Name {
			return found[0], m
		}
	}
	t.Fatalf("%s: volume %s is not mounted", k.name, found[0].Name)
	return corev1.Volume{}, corev1.VolumeMount{}
}

// yamlFiles lists the YAML files under dir, sorted.
func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && isYAML(p) {
			out = append(out, filepath.Clean(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func isYAML(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// yamlUnmarshalLoose reads a few header fields without strictness.
func yamlUnmarshalLoose(doc []byte, v any) error {
	var o object
	if err := decodeStrictInto(doc, &o); err != nil {
		return err
	}
	j, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, v)
}
