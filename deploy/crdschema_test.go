package deploy_test

// Checking custom resources against their CRDs' published OpenAPI v3
// schemas, for the kinds that have no Go types in this module (Envoy
// Gateway's and the Gateway API's). The CRDs are test fixtures under
// testdata/; see testdata/envoy-gateway/README.md.

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// crdSchemas maps "group/version Kind" to the served version's schema.
type crdSchemas map[string]map[string]any

// crd is the part of apiextensions.k8s.io/v1 CustomResourceDefinition the
// checks read; decoding strictly into it is not the point, so it is loose.
type crd struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Group string `json:"group"`
		Names struct {
			Kind string `json:"kind"`
		} `json:"names"`
		Versions []struct {
			Name   string `json:"name"`
			Served bool   `json:"served"`
			Schema struct {
				OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// loadCRDs reads every CustomResourceDefinition in the files.
func loadCRDs(files ...string) (crdSchemas, error) {
	out := crdSchemas{}
	for _, f := range files {
		objs, err := readObjects(f)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			j, err := json.Marshal(o)
			if err != nil {
				return nil, err
			}
			var c crd
			if err := json.Unmarshal(j, &c); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if c.Kind != "CustomResourceDefinition" || c.APIVersion != "apiextensions.k8s.io/v1" {
				return nil, fmt.Errorf("%s: %s %s is not a CustomResourceDefinition", f, c.APIVersion, c.Kind)
			}
			for _, v := range c.Spec.Versions {
				if v.Served && v.Schema.OpenAPIV3Schema != nil {
					out[c.Spec.Group+"/"+v.Name+" "+c.Spec.Names.Kind] = v.Schema.OpenAPIV3Schema
				}
			}
		}
	}
	return out, nil
}

// check validates a custom resource: its metadata strictly as ObjectMeta,
// everything else against the schema of its apiVersion and kind.
func (s crdSchemas) check(o object) error {
	key := fmt.Sprintf("%v %s", o["apiVersion"], kindOf(o))
	schema, ok := s[key]
	if !ok {
		return fmt.Errorf("%s: no served CRD version for %s", objectKey(o), key)
	}
	var errs []string
	body := object{}
	for k, v := range o {
		switch k {
		case "apiVersion", "kind":
		case "metadata":
			j, err := json.Marshal(v)
			if err != nil {
				return err
			}
			var m metav1.ObjectMeta
			if err := decodeStrictInto(j, &m); err != nil {
				errs = append(errs, "metadata: "+err.Error())
			}
		default:
			body[k] = v
		}
	}
	props, _ := schema["properties"].(map[string]any)
	trimmed := map[string]any{"type": "object", "properties": map[string]any{}}
	for k, v := range props {
		if k != "apiVersion" && k != "kind" && k != "metadata" {
			trimmed["properties"].(map[string]any)[k] = v
		}
	}
	if r, ok := schema["required"]; ok {
		trimmed["required"] = r
	}
	errs = append(errs, checkSchema(trimmed, body, "")...)
	if len(errs) > 0 {
		return fmt.Errorf("%s:\n  %s", objectKey(o), strings.Join(errs, "\n  "))
	}
	return nil
}

// checkSchema checks v against a structural OpenAPI v3 schema as the API
// server would before admission: types, unknown fields (pruned there,
// refused here), required fields, enums, string patterns and lengths,
// numeric bounds and list sizes. CEL rules (x-kubernetes-validations) and
// formats are not evaluated.
func checkSchema(schema map[string]any, v any, path string) []string {
	at := path
	if at == "" {
		at = "."
	}
	fail := func(format string, a ...any) []string { return []string{at + ": " + fmt.Sprintf(format, a...)} }
	if v == nil {
		if b, _ := schema["nullable"].(bool); b {
			return nil
		}
		return fail("null")
	}
	if b, _ := schema["x-kubernetes-int-or-string"].(bool); b {
		switch x := v.(type) {
		case string:
			return nil
		case float64:
			if x != math.Trunc(x) {
				return fail("%v is not an integer or a string", x)
			}
			return nil
		}
		return fail("%T is not an integer or a string", v)
	}
	var errs []string
	if enum, ok := schema["enum"].([]any); ok && !slices.Contains(enum, v) {
		errs = append(errs, fail("%v is not one of %v", v, enum)...)
	}
	switch t, _ := schema["type"].(string); t {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fail("%T is not an object", v)
		}
		props, _ := schema["properties"].(map[string]any)
		preserve, _ := schema["x-kubernetes-preserve-unknown-fields"].(bool)
		for _, k := range sortedKeys(m) {
			if ps, ok := props[k].(map[string]any); ok {
				errs = append(errs, checkSchema(ps, m[k], path+"."+k)...)
				continue
			}
			switch ap := schema["additionalProperties"].(type) {
			case map[string]any:
				errs = append(errs, checkSchema(ap, m[k], path+"."+k)...)
			case bool:
				if !ap {
					errs = append(errs, fail("unknown field %q", k)...)
				}
			default:
				if !preserve {
					errs = append(errs, fail("unknown field %q", k)...)
				}
			}
		}
		req, _ := schema["required"].([]any)
		for _, r := range req {
			if _, ok := m[r.(string)]; !ok {
				errs = append(errs, fail("missing required field %q", r)...)
			}
		}
		errs = append(errs, checkCount(schema, "Properties", len(m), fail)...)
	case "array":
		l, ok := v.([]any)
		if !ok {
			return fail("%T is not a list", v)
		}
		if items, ok := schema["items"].(map[string]any); ok {
			for i, x := range l {
				errs = append(errs, checkSchema(items, x, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
		errs = append(errs, checkCount(schema, "Items", len(l), fail)...)
	case "string":
		s, ok := v.(string)
		if !ok {
			return fail("%T is not a string", v)
		}
		if p, ok := schema["pattern"].(string); ok {
			// Kubernetes evaluates ECMA 262 patterns; the ones RE2 cannot
			// compile (lookarounds) are skipped.
			if re, err := regexp.Compile(p); err == nil && !re.MatchString(s) {
				errs = append(errs, fail("%q does not match %s", s, p)...)
			}
		}
		errs = append(errs, checkCount(schema, "Length", len([]rune(s)), fail)...)
	case "integer", "number":
		n, ok := v.(float64)
		if !ok || (t == "integer" && n != math.Trunc(n)) {
			return fail("%v is not an %s", v, t)
		}
		if lo, ok := schema["minimum"].(float64); ok && n < lo {
			errs = append(errs, fail("%v is below the minimum %v", n, lo)...)
		}
		if hi, ok := schema["maximum"].(float64); ok && n > hi {
			errs = append(errs, fail("%v is above the maximum %v", n, hi)...)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fail("%T is not a boolean", v)
		}
	case "":
		// Untyped (x-kubernetes-preserve-unknown-fields alone): anything.
	default:
		return fail("schema type %q not handled by the checker", t)
	}
	return errs
}

// checkCount applies minX/maxX (Items, Length, Properties) to n.
func checkCount(schema map[string]any, what string, n int, fail func(string, ...any) []string) []string {
	var errs []string
	if lo, ok := schema["min"+what].(float64); ok && float64(n) < lo {
		errs = append(errs, fail("%d %s, at least %v", n, strings.ToLower(what), lo)...)
	}
	if hi, ok := schema["max"+what].(float64); ok && float64(n) > hi {
		errs = append(errs, fail("%d %s, at most %v", n, strings.ToLower(what), hi)...)
	}
	return errs
}

// TestSchemaCheckerRejects shows the checker the Envoy Gateway tests rely
// on refuses what the API server would.
func TestSchemaCheckerRejects(t *testing.T) {
	schemas := mustEGSchemas(t)
	const btp = "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata:\n  name: x\nspec:\n"
	const rule = "  rateLimit:\n    global:\n      rules:\n        - limit:\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", btp + "  rateLimt: {}\n", `unknown field "rateLimt"`},
		{"unknown nested field", btp + rule + "            requests: 1\n            unit: Minute\n            burst: 2\n", `unknown field "burst"`},
		{"bad enum", btp + rule + "            requests: 1\n            unit: Fortnight\n", "Fortnight is not one of"},
		{"wrong type", btp + rule + "            requests: many\n            unit: Minute\n", "many is not an integer"},
		{"missing required", btp + rule + "            unit: Minute\n", `missing required field "requests"`},
		{"bad metadata", "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  nmae: x\nspec:\n  gatewayClassName: eg\n  listeners: []\n", "metadata"},
		{"pattern", "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata:\n  name: x\nspec:\n  gatewayClassName: eg\n  listeners:\n    - name: Not_A_Name\n      protocol: HTTP\n      port: 80\n", "does not match"},
		{"unknown kind", "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolice\nmetadata:\n  name: x\n", "no served CRD version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o object
			if err := decodeStrictInto([]byte(tc.doc), &o); err != nil {
				t.Fatal(err)
			}
			err := schemas.check(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}
