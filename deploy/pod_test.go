package deploy_test

// What the kubelet gives a container: its environment (with the downward
// API) and its arguments with $(VAR) references expanded.

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// pod is the identity the kubelet would give one StatefulSet replica.
type pod struct {
	name      string // ringlimit-0, -1, ...
	namespace string
	ip        string
}

// podEnv returns the container's environment for p, in order, the way the
// kubelet builds it: downward-API fields resolved, $(VAR) in values
// expanded against the variables defined before them.
func podEnv(c corev1.Container, p pod) ([]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("container %s: envFrom is not simulated by these tests", c.Name)
	}
	vars := map[string]string{}
	var env []string
	for _, e := range c.Env {
		v := expandVars(e.Value, lookupIn(vars))
		if e.ValueFrom != nil {
			if e.Value != "" {
				return nil, fmt.Errorf("env %s: both value and valueFrom", e.Name)
			}
			f := e.ValueFrom.FieldRef
			if f == nil {
				return nil, fmt.Errorf("env %s: only fieldRef is simulated by these tests", e.Name)
			}
			switch f.FieldPath {
			case "metadata.name":
				v = p.name
			case "metadata.namespace":
				v = p.namespace
			case "status.podIP":
				v = p.ip
			default:
				return nil, fmt.Errorf("env %s: fieldRef %q is not simulated by these tests", e.Name, f.FieldPath)
			}
		}
		vars[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// podArgs returns the container's command line after expansion; a $(VAR)
// left unresolved (a typo, a variable the pod does not have) is an error.
func podArgs(c corev1.Container, env []string) ([]string, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	var out []string
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		x := expandVars(a, lookupIn(vars))
		if strings.Contains(strings.ReplaceAll(a, "$$", ""), "$(") && strings.Contains(x, "$(") {
			return nil, fmt.Errorf("argument %q: unresolved variable reference in %q", a, x)
		}
		out = append(out, x)
	}
	return out, nil
}

func lookupIn(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// expandVars applies Kubernetes' $(VAR) syntax: $(NAME) becomes the value
// of a defined variable and stays as written otherwise; $$ is a literal $.
func expandVars(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			ref := s[i : i+3+end]
			if v, ok := lookup(s[i+2 : i+2+end]); ok {
				b.WriteString(v)
			} else {
				b.WriteString(ref)
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func TestExpandVars(t *testing.T) {
	vars := map[string]string{"POD_IP": "10.0.0.7", "NS": "rl"}
	for _, tc := range []struct{ in, want string }{
		{"--advertise-addr=$(POD_IP)", "--advertise-addr=10.0.0.7"},
		{"[$(POD_IP)]:8081", "[10.0.0.7]:8081"},
		{"a.$(NS).svc:7946", "a.rl.svc:7946"},
		{"$(MISSING)", "$(MISSING)"},
		{"$$(POD_IP)", "$(POD_IP)"},
		{"cost: $5", "cost: $5"},
		{"$$", "$"},
		{"$(POD_IP", "$(POD_IP"},
		{"$", "$"},
	} {
		if got := expandVars(tc.in, lookupIn(vars)); got != tc.want {
			t.Errorf("expandVars(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// flagValue finds --name=value, -name=value, --name value or -name value.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		for _, p := range []string{"--" + name, "-" + name} {
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v, true
			}
			if a == p && i+1 < len(args) {
				return args[i+1], true
			}
		}
	}
	return "", false
}

// mustFlag returns a flag's value or fails the test.
func mustFlag(t *testing.T, args []string, name string) string {
	t.Helper()
	v, ok := flagValue(args, name)
	if !ok {
		t.Fatalf("args %q: no --%s", args, name)
	}
	return v
}

// portOf is the port of a host:port flag value.
func portOf(t *testing.T, hostport string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatalf("%q: %v", hostport, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatalf("%q: port: %v", hostport, err)
	}
	return int32(n)
}

// expandedPod returns the env and args of replica i of k's StatefulSet with
// the given pod IP.
func expandedPod(t *testing.T, k *kit, i int, ip string) (pod, []string, []string) {
	t.Helper()
	p := pod{name: fmt.Sprintf("%s-%d", k.statefulSet.Name, i), namespace: k.namespace, ip: ip}
	c := k.container(t)
	env, err := podEnv(c, p)
	if err != nil {
		t.Fatalf("%s: %v", k.name, err)
	}
	args, err := podArgs(c, env)
	if err != nil {
		t.Fatalf("%s: %v", k.name, err)
	}
	return p, env, args
}
