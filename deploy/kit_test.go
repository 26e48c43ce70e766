package deploy_test

// Loading the kit: YAML documents, strict decoding into the Kubernetes API
// types, a small kustomize renderer, and the objects gathered into a kit
// that the consistency checks read.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/yaml"
)

// Paths are relative to this directory (deploy/), where go test runs.
const (
	repoRoot      = ".."
	kubeDir       = "kubernetes"
	baseDir       = "kubernetes/base"
	overlayDir    = "kubernetes/overlays/example"
	monOverlayDir = "kubernetes/overlays/example-monitoring"
	exampleConfig = "examples/config/ratelimit.yaml"
	secretExample = "kubernetes/gossip-key-secret.example.yaml"
	envoyFile     = "envoy/envoy.yaml"
	istioDir      = "istio"
	emissaryFile  = "emissary/ratelimitservice.yaml"
	contourFile   = "contour/extensionservice.yaml"
	dockerfile    = "../Dockerfile"
	dockerignore  = "../.dockerignore"
)

// object is one manifest as generic JSON (what kustomize works on).
type object = map[string]any

// yamlDocs splits a YAML stream on "---" lines and drops empty documents
// (comments only).
func yamlDocs(data []byte) ([][]byte, error) {
	var docs [][]byte
	var cur []byte
	flush := func() error {
		j, err := yaml.YAMLToJSONStrict(cur)
		if err != nil {
			return err
		}
		if s := string(bytes.TrimSpace(j)); s != "null" && s != "" {
			docs = append(docs, cur)
		}
		cur = nil
		return nil
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if string(bytes.TrimRight(line, " \t\r\n")) == "---" {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		cur = append(cur, line...)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return docs, nil
}

// readObjects reads every document of a YAML file as generic objects.
func readObjects(path string) ([]object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	docs, err := yamlDocs(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []object
	for _, d := range docs {
		var o object
		if err := decodeStrictInto(d, &o); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// decodeStrictInto decodes YAML (or JSON) into v, refusing duplicate keys,
// unknown fields and trailing data.
func decodeStrictInto(doc []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the document")
	}
	return nil
}

// newStrictDecoder decodes the built-in kinds the kit uses into their
// k8s.io/api types; unknown or duplicate fields, wrongly-cased fields and
// wrong types are errors.
func newStrictDecoder() (runtime.Decoder, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer(), nil
}

func mustDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	d, err := newStrictDecoder()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// decodeTyped decodes one document into its typed Kubernetes object.
func decodeTyped(d runtime.Decoder, doc []byte) (runtime.Object, error) {
	obj, _, err := d.Decode(doc, nil, nil)
	if err != nil {
		return nil, err
	}
	return obj, nil
}

// kustomization is the part of kustomize's file format this kit uses;
// decoding into it strictly catches misspelt keys.
type kustomization struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Namespace  string            `json:"namespace,omitempty"`
	Resources  []string          `json:"resources,omitempty"`
	Components []string          `json:"components,omitempty"`
	Patches    []kustomizePatch  `json:"patches,omitempty"`
	Images     []kustomizeImage  `json:"images,omitempty"`
	Labels     []json.RawMessage `json:"labels,omitempty"`
}

type kustomizePatch struct {
	Path   string           `json:"path,omitempty"`
	Patch  string           `json:"patch,omitempty"`
	Target *kustomizeTarget `json:"target,omitempty"`
}

type kustomizeTarget struct {
	Group     string `json:"group,omitempty"`
	Version   string `json:"version,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
}

func loadKustomization(dir string) (*kustomization, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := decodeStrictInto(data, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	switch {
	case k.Kind == "Kustomization" && k.APIVersion == "kustomize.config.k8s.io/v1beta1":
	case k.Kind == "Component" && k.APIVersion == "kustomize.config.k8s.io/v1alpha1":
	default:
		return nil, fmt.Errorf("%s/kustomization.yaml: unexpected apiVersion %q kind %q", dir, k.APIVersion, k.Kind)
	}
	return &k, nil
}

// render builds a kustomization as `kubectl kustomize` does for the
// features this kit uses: resources (files and directories), components,
// strategic-merge patch files, inline JSON 6902 patches, namespace. When
// kubectl is installed, TestRenderMatchesKubectl checks it agrees.
func render(dir string) ([]object, error) {
	k, err := loadKustomization(dir)
	if err != nil {
		return nil, err
	}
	if k.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s: a %s cannot be rendered on its own", dir, k.Kind)
	}
	objs, err := renderResources(dir, k.Resources)
	if err != nil {
		return nil, err
	}
	for _, c := range k.Components {
		if objs, err = applyComponent(filepath.Join(dir, c), objs); err != nil {
			return nil, err
		}
	}
	if objs, err = applyPatches(dir, k.Patches, objs); err != nil {
		return nil, err
	}
	if len(k.Images) > 0 {
		return nil, fmt.Errorf("%s: images: not supported by the test renderer", dir)
	}
	if k.Namespace != "" {
		for _, o := range objs {
			if kindOf(o) == "Namespace" {
				continue
			}
			meta(o)["namespace"] = k.Namespace
		}
	}
	return objs, nil
}

func renderResources(dir string, resources []string) ([]object, error) {
	var objs []object
	for _, r := range resources {
		p := filepath.Join(dir, r)
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		var more []object
		if st.IsDir() {
			more, err = render(p)
		} else {
			more, err = readObjects(p)
		}
		if err != nil {
			return nil, err
		}
		objs = append(objs, more...)
	}
	return objs, nil
}

func applyComponent(dir string, objs []object) ([]object, error) {
	k, err := loadKustomization(dir)
	if err != nil {
		return nil, err
	}
	if k.Kind != "Component" {
		return nil, fmt.Errorf("%s: listed under components but is a %s", dir, k.Kind)
	}
	if k.Namespace != "" || len(k.Components) > 0 || len(k.Images) > 0 {
		return nil, fmt.Errorf("%s: component features not supported by the test renderer", dir)
	}
	more, err := renderResources(dir, k.Resources)
	if err != nil {
		return nil, err
	}
	return applyPatches(dir, k.Patches, append(objs, more...))
}

func applyPatches(dir string, patches []kustomizePatch, objs []object) ([]object, error) {
	for _, p := range patches {
		switch {
		case p.Path != "" && p.Patch == "" && p.Target == nil:
			pobjs, err := readObjects(filepath.Join(dir, p.Path))
			if err != nil {
				return nil, err
			}
			for _, po := range pobjs {
				target := findObject(objs, po["apiVersion"], kindOf(po), nameOf(po))
				if target == nil {
					return nil, fmt.Errorf("%s/%s: patches %s %q, which the kustomization does not have", dir, p.Path, kindOf(po), nameOf(po))
				}
				strategicMerge(target, po)
			}
		case p.Patch != "" && p.Target != nil:
			var ops []jsonPatchOp
			if err := decodeStrictInto([]byte(p.Patch), &ops); err != nil {
				return nil, fmt.Errorf("%s: inline patch: %w", dir, err)
			}
			apiVersion := p.Target.Version
			if p.Target.Group != "" {
				apiVersion = p.Target.Group + "/" + p.Target.Version
			}
			target := findObject(objs, apiVersion, p.Target.Kind, p.Target.Name)
			if target == nil {
				return nil, fmt.Errorf("%s: patch target %s %q not found", dir, p.Target.Kind, p.Target.Name)
			}
			for _, op := range ops {
				if err := op.apply(target); err != nil {
					return nil, fmt.Errorf("%s: patch on %s %q: %w", dir, p.Target.Kind, p.Target.Name, err)
				}
			}
		default:
			return nil, fmt.Errorf("%s: patch form not supported by the test renderer: %+v", dir, p)
		}
	}
	return objs, nil
}

// strategicMerge merges patch into dst: maps recursively, lists of named
// items by name (how containers, env and volumes merge), other lists
// replaced, null deletes.
func strategicMerge(dst, patch map[string]any) {
	for k, pv := range patch {
		if pv == nil {
			delete(dst, k)
			continue
		}
		dst[k] = mergeValue(dst[k], pv)
	}
}

func mergeValue(dst, patch any) any {
	switch p := patch.(type) {
	case map[string]any:
		d, ok := dst.(map[string]any)
		if !ok {
			return p
		}
		strategicMerge(d, p)
		return d
	case []any:
		d, ok := dst.([]any)
		if !ok || !allNamed(d) || !allNamed(p) {
			return p
		}
		for _, pi := range p {
			pm := pi.(map[string]any)
			found := false
			for _, di := range d {
				if dm := di.(map[string]any); dm["name"] == pm["name"] {
					strategicMerge(dm, pm)
					found = true
				}
			}
			if !found {
				d = append(d, pm)
			}
		}
		return d
	default:
		return p
	}
}

func allNamed(l []any) bool {
	for _, i := range l {
		m, ok := i.(map[string]any)
		if !ok {
			return false
		}
		if _, ok := m["name"].(string); !ok {
			return false
		}
	}
	return len(l) > 0
}

// jsonPatchOp is one RFC 6902 operation; the renderer supports replace.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

func (op jsonPatchOp) apply(doc object) error {
	if op.Op != "replace" {
		return fmt.Errorf("op %q not supported by the test renderer", op.Op)
	}
	parent, last, err := jsonPointerParent(doc, op.Path)
	if err != nil {
		return err
	}
	switch c := parent.(type) {
	case map[string]any:
		if _, ok := c[last]; !ok {
			return fmt.Errorf("replace %s: no such member", op.Path)
		}
		c[last] = op.Value
	case []any:
		i, err := strconv.Atoi(last)
		if err != nil || i < 0 || i >= len(c) {
			return fmt.Errorf("replace %s: no such element", op.Path)
		}
		c[i] = op.Value
	default:
		return fmt.Errorf("replace %s: parent is not a container", op.Path)
	}
	return nil
}

// jsonPointer resolves an RFC 6901 pointer in doc.
func jsonPointer(doc any, ptr string) (any, error) {
	parent, last, err := jsonPointerParent(doc, ptr)
	if err != nil {
		return nil, err
	}
	return step(parent, last, ptr)
}

func jsonPointerParent(doc any, ptr string) (any, string, error) {
	if !strings.HasPrefix(ptr, "/") {
		return nil, "", fmt.Errorf("pointer %q does not start with /", ptr)
	}
	parts := strings.Split(ptr[1:], "/")
	for i := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(parts[i], "~1", "/"), "~0", "~")
	}
	cur := doc
	for _, p := range parts[:len(parts)-1] {
		next, err := step(cur, p, ptr)
		if err != nil {
			return nil, "", err
		}
		cur = next
	}
	return cur, parts[len(parts)-1], nil
}

func step(cur any, p, ptr string) (any, error) {
	switch c := cur.(type) {
	case map[string]any:
		v, ok := c[p]
		if !ok {
			return nil, fmt.Errorf("pointer %s: no member %q", ptr, p)
		}
		return v, nil
	case []any:
		i, err := strconv.Atoi(p)
		if err != nil || i < 0 || i >= len(c) {
			return nil, fmt.Errorf("pointer %s: no element %q", ptr, p)
		}
		return c[i], nil
	}
	return nil, fmt.Errorf("pointer %s: %q is inside a scalar", ptr, p)
}

func meta(o object) map[string]any {
	m, ok := o["metadata"].(map[string]any)
	if !ok {
		m = map[string]any{}
		o["metadata"] = m
	}
	return m
}

func kindOf(o object) string { s, _ := o["kind"].(string); return s }
func nameOf(o object) string { s, _ := meta(o)["name"].(string); return s }
func nsOf(o object) string   { s, _ := meta(o)["namespace"].(string); return s }
func objectKey(o object) string {
	return fmt.Sprintf("%v %s %s/%s", o["apiVersion"], kindOf(o), nsOf(o), nameOf(o))
}

func findObject(objs []object, apiVersion any, kind, name string) object {
	for _, o := range objs {
		if o["apiVersion"] == apiVersion && kindOf(o) == kind && nameOf(o) == name {
			return o
		}
	}
	return nil
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) this kit uses.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path,omitempty"`
			Interval string `json:"interval,omitempty"`
			Scheme   string `json:"scheme,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// kit is a rendered set of manifests, typed.
type kit struct {
	name            string // what was rendered, for messages
	namespace       string // the namespace the pods run in
	statefulSet     *appsv1.StatefulSet
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	serviceAccounts map[string]*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	namespaces      []*corev1.Namespace
	serviceMonitors []*serviceMonitor
	prometheusRules []*prometheusRule
}

// newKit decodes rendered objects strictly into their types; an object of a
// kind the checks do not know is an error, so nothing goes unchecked.
func newKit(name string, objs []object) (*kit, error) {
	dec, err := newStrictDecoder()
	if err != nil {
		return nil, err
	}
	k := &kit{
		name:            name,
		services:        map[string]*corev1.Service{},
		configMaps:      map[string]*corev1.ConfigMap{},
		serviceAccounts: map[string]*corev1.ServiceAccount{},
	}
	for _, o := range objs {
		j, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		if kindOf(o) == "ServiceMonitor" {
			var sm serviceMonitor
			if err := decodeStrictInto(j, &sm); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", name, objectKey(o), err)
			}
			k.serviceMonitors = append(k.serviceMonitors, &sm)
			continue
		}
		if kindOf(o) == "PrometheusRule" {
			var pr prometheusRule
			if err := decodeStrictInto(j, &pr); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", name, objectKey(o), err)
			}
			k.prometheusRules = append(k.prometheusRules, &pr)
			continue
		}
		typed, err := decodeTyped(dec, j)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", name, objectKey(o), err)
		}
		switch v := typed.(type) {
		case *appsv1.StatefulSet:
			if k.statefulSet != nil {
				return nil, fmt.Errorf("%s: more than one StatefulSet", name)
			}
			k.statefulSet = v
		case *corev1.Service:
			k.services[v.Name] = v
		case *corev1.ConfigMap:
			k.configMaps[v.Name] = v
		case *corev1.ServiceAccount:
			k.serviceAccounts[v.Name] = v
		case *policyv1.PodDisruptionBudget:
			k.pdbs = append(k.pdbs, v)
		case *corev1.Namespace:
			k.namespaces = append(k.namespaces, v)
		default:
			return nil, fmt.Errorf("%s: %s: no consistency checks for %T", name, objectKey(o), typed)
		}
	}
	if k.statefulSet == nil {
		return nil, fmt.Errorf("%s: no StatefulSet", name)
	}
	k.namespace = k.statefulSet.Namespace
	if k.namespace == "" {
		k.namespace = "default"
	}
	return k, nil
}

// kits renders the base, the example overlay with monitoring, and the
// example overlay (last).
func kits(t *testing.T) []*kit {
	t.Helper()
	var out []*kit
	for _, dir := range []string{baseDir, monOverlayDir, overlayDir} {
		objs, err := render(dir)
		if err != nil {
			t.Fatal(err)
		}
		k, err := newKit(dir, objs)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

// overlayKit is the example overlay, what the docs tell operators to apply.
func overlayKit(t *testing.T) *kit {
	t.Helper()
	ks := kits(t)
	return ks[len(ks)-1]
}

func (k *kit) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := k.statefulSet.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%s: StatefulSet has %d containers, want 1", k.name, len(cs))
	}
	return cs[0]
}

// sortedKeys lists a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
