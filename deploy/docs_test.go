package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsMatchTheKit: the deployment docs name files that exist, the
// Services the kit has, and the key command they promise.
func TestDocsMatchTheKit(t *testing.T) {
	k := overlayKit(t)
	docs := map[string]string{}
	for _, name := range []string{"docs/deployment.md", "docs/migration.md"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		if err != nil {
			t.Fatal(err)
		}
		docs[name] = string(b)
	}
	for name, text := range docs {
		for _, m := range regexp.MustCompile("`((?:deploy|docs)/[^`\\s]*|Dockerfile|\\.dockerignore)`").FindAllStringSubmatch(text, -1) {
			if _, err := os.Stat(filepath.Join(repoRoot, strings.TrimSuffix(m[1], "/"))); err != nil {
				t.Errorf("%s names %s: %v", name, m[1], err)
			}
		}
	}
	dep := docs["docs/deployment.md"]
	for _, svc := range sortedKeys(k.services) {
		if !strings.Contains(dep, "`"+svc+"`") {
			t.Errorf("docs/deployment.md does not describe the Service %s", svc)
		}
	}
	for _, want := range []string{"openssl rand -base64 32", "STRICT_DNS", "publishNotReadyAddresses", "kubectl apply -k deploy/kubernetes/overlays/example", "ringlimit keygen",
		"kubectl apply -k deploy/kubernetes/overlays/example-monitoring", "kind create cluster"} {
		if !strings.Contains(dep, want) {
			t.Errorf("docs/deployment.md does not mention %q", want)
		}
	}
}
