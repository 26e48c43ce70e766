package deploy_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// dryRun runs `ringlimit serve <args> --config <dir> --dry-run` with exactly
// env, and returns the settings it printed. The extra --config (left out
// when configDir is "") points at a copy of the ConfigMap so the path exists
// here; --dry-run stops after parsing flags and environment and loading the
// config.
func dryRun(t *testing.T, bin string, args, env []string, configDir string) (map[string]string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := append([]string(nil), args[1:]...)
	if configDir != "" {
		full = append(full, "--config="+configDir)
	}
	full = append(full, "--dry-run")
	cmd := exec.CommandContext(ctx, bin, append([]string{args[0]}, full...)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	settings := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if name, value, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			settings[name] = value
		}
	}
	return settings, stdout.String() + stderr.String(), err
}

// writeConfigMap lays the kit's ConfigMap out as plain files in a new
// directory.
func writeConfigMap(t *testing.T, k *kit) string {
	t.Helper()
	vol, _ := volumeFor(t, k, func(v corev1.Volume) bool { return v.ConfigMap != nil })
	dir := t.TempDir()
	for name, data := range k.configMaps[vol.ConfigMap.Name].Data {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestArgsAcceptedByServe runs the real `ringlimit serve` flag parser on the
// StatefulSet's args and env, as the kubelet would expand them, for an IPv4
// and an IPv6 pod, and checks the settings it ends up with.
func TestArgsAcceptedByServe(t *testing.T) {
	bin := needBinary(t)
	for _, k := range kits(t) {
		configDir := writeConfigMap(t, k)
		for _, ip := range []string{"10.244.1.17", "fd00:10:244::17"} {
			t.Run(k.name+"/"+ip, func(t *testing.T) {
				p, env, args := expandedPod(t, k, 2, ip)
				got, out, err := dryRun(t, bin, args, env, configDir)
				if err != nil {
					t.Fatalf("ringlimit %q refused the manifest's args: %v\n%s", args, err, out)
				}
				keyFile := mustFlag(t, args, "gossip-key-file")
				bracketed := "[" + ip + "]"
				for field, want := range map[string]string{
					"node-name":        p.name,
					"advertise-addr":   ip,
					"grpc-addr":        bracketed + ":8081",
					"http-addr":        bracketed + ":8080",
					"debug-addr":       bracketed + ":6070",
					"gossip-addr":      bracketed + ":7946",
					"join":             "ringlimit-peers." + k.namespace + ".svc.cluster.local:7946",
					"gossip-key-file":  keyFile,
					"log-format":       "json", // from LOG_FORMAT, envoyproxy/ratelimit's variable
					"log-level":        "info",
					"shutdown-timeout": "30s",
					"data-dir":         "/var/lib/ringlimit",
				} {
					if got[field] != want {
						t.Errorf("%s = %q, want %q\n%s", field, got[field], want, out)
					}
				}
			})
		}
	}
}

// TestDryRunCatchesBadArgs shows the check above bites: the same parser
// refuses a misspelt flag and a bad value.
func TestDryRunCatchesBadArgs(t *testing.T) {
	bin := needBinary(t)
	k := overlayKit(t)
	configDir := writeConfigMap(t, k)
	_, env, args := expandedPod(t, k, 0, "10.0.0.1")
	for _, tc := range []struct {
		name  string
		extra []string
		env   []string
	}{
		{"unknown flag", []string{"--gossip-keyfile=/x"}, nil},
		{"bad duration", []string{"--shutdown-timeout=soon"}, nil},
		{"bad address", []string{"--grpc-addr=10.0.0.1"}, nil},
		{"bad env value", nil, []string{"LOG_LEVEL=loud"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := append(append([]string(nil), args...), tc.extra...)
			e := append(append([]string(nil), env...), tc.env...)
			if _, out, err := dryRun(t, bin, a, e, configDir); err == nil {
				t.Errorf("accepted:\n%s", out)
			}
		})
	}
}

// TestMigrationEnvVars holds docs/migration.md to what the binary does: the
// envoyproxy/ratelimit variables it lists keep working, and the Redis/statsd
// ones are accepted with one warning.
func TestMigrationEnvVars(t *testing.T) {
	bin := needBinary(t)
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs/migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cfgDir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	seed, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), seed, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		want map[string]string
	}{
		{[]string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "RUNTIME_APPDIRECTORY=config"}, map[string]string{"config": cfgDir}},
		{[]string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl"}, map[string]string{"config": cfgDir}},
		{[]string{"MERGE_DOMAIN_CONFIG=true"}, map[string]string{"merge-domains": "true"}},
		{[]string{"GRPC_HOST=127.0.0.9", "GRPC_PORT=9081"}, map[string]string{"grpc-addr": "127.0.0.9:9081"}},
		{[]string{"HOST=127.0.0.9", "PORT=9080"}, map[string]string{"http-addr": "127.0.0.9:9080"}},
		{[]string{"DEBUG_HOST=127.0.0.9", "DEBUG_PORT=9070"}, map[string]string{"debug-addr": "127.0.0.9:9070"}},
		// A host alone binds that host on the reference's default port.
		{[]string{"DEBUG_HOST=127.0.0.9"}, map[string]string{"debug-addr": "127.0.0.9:6070"}},
		{[]string{"GRPC_HOST=127.0.0.9"}, map[string]string{"grpc-addr": "127.0.0.9:8081"}},
		{[]string{"HOST=127.0.0.9"}, map[string]string{"http-addr": "127.0.0.9:8080"}},
		{[]string{"GRPC_PORT=9081"}, map[string]string{"grpc-addr": ":9081"}},
		{[]string{"LOG_LEVEL=debug", "LOG_FORMAT=json"}, map[string]string{"log-level": "debug", "log-format": "json"}},
		// The reference's logrus levels that slog lacks start too.
		{[]string{"LOG_LEVEL=trace"}, map[string]string{"log-level": "trace"}},
		{[]string{"LOG_LEVEL=fatal"}, map[string]string{"log-level": "fatal"}},
		{[]string{"SHADOW_MODE=true"}, map[string]string{"shadow-mode": "true"}},
		{[]string{"QUOTA_MODE=true"}, map[string]string{"quota-mode": "true"}},
		{[]string{"RESPONSE_DYNAMIC_METADATA=true"}, map[string]string{"response-dynamic-metadata": "true"}},
		{[]string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"}, map[string]string{"healthy-with-config": "true"}},
		{[]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true"}, map[string]string{"stop-increment-when-over-limit": "true"}},
		{[]string{"NEAR_LIMIT_RATIO=0.9"}, map[string]string{"near-limit-ratio": "0.9"}},
		{[]string{"LIMIT_RESPONSE_HEADERS_ENABLED=true"}, map[string]string{"response-headers": "true"}},
		{[]string{"LIMIT_LIMIT_HEADER=X-L", "LIMIT_REMAINING_HEADER=X-R", "LIMIT_RESET_HEADER=X-S"},
			map[string]string{"header-limit": "X-L", "header-remaining": "X-R", "header-reset": "X-S"}},
		// The reference's server TLS, only when turned on, as there.
		{[]string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/tls/cert.pem", "GRPC_SERVER_TLS_KEY=/tls/key.pem"},
			map[string]string{"grpc-tls-cert": "/tls/cert.pem", "grpc-tls-key": "/tls/key.pem"}},
		{[]string{"GRPC_SERVER_USE_TLS=false", "GRPC_SERVER_TLS_CERT=/tls/cert.pem", "GRPC_SERVER_TLS_KEY=/tls/key.pem"},
			map[string]string{"grpc-tls-cert": "", "grpc-tls-key": ""}},
		// TLS turned on the reference's way, with the certificate given ringlimit's way.
		{[]string{"GRPC_SERVER_USE_TLS=true", "RINGLIMIT_GRPC_TLS_CERT=/tls/c.pem", "RINGLIMIT_GRPC_TLS_KEY=/tls/k.pem"},
			map[string]string{"grpc-tls-cert": "/tls/c.pem", "grpc-tls-key": "/tls/k.pem"}},
		// RLS client mTLS: the reference's variables, and Envoy Gateway's CA variable.
		{[]string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/tls/cert.pem", "GRPC_SERVER_TLS_KEY=/tls/key.pem", "GRPC_CLIENT_TLS_CACERT=/tls/ca.pem", "GRPC_CLIENT_TLS_SAN=envoy"},
			map[string]string{"grpc-tls-client-ca": "/tls/ca.pem", "grpc-tls-client-san": "envoy"}},
		{[]string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/certs/tls.crt", "GRPC_SERVER_TLS_KEY=/certs/tls.key", "GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt"},
			map[string]string{"grpc-tls-client-ca": "/certs/ca.crt"}},
		// OpenTelemetry tracing.
		{[]string{"TRACING_ENABLED=true", "TRACING_SERVICE_NAME=rl", "TRACING_SERVICE_NAMESPACE=edge", "TRACING_SERVICE_INSTANCE_ID=pod-1",
			"TRACING_SAMPLING_RATE=0.25", "TRACING_EXPORTER_PROTOCOL=grpc"},
			map[string]string{"tracing": "true", "tracing-service-name": "rl", "tracing-service-namespace": "edge", "tracing-service-instance-id": "pod-1",
				"tracing-sampling-rate": "0.25", "tracing-exporter-protocol": "grpc"}},
		// A RINGLIMIT_ variable wins over the reference's.
		{[]string{"GRPC_PORT=9081", "RINGLIMIT_GRPC_ADDR=127.0.0.9:9999"}, map[string]string{"grpc-addr": "127.0.0.9:9999"}},
	} {
		var names []string
		for _, kv := range tc.env {
			name, _, _ := strings.Cut(kv, "=")
			names = append(names, name)
		}
		t.Run(strings.Join(names, ","), func(t *testing.T) {
			for _, name := range names {
				if !bytes.Contains(doc, []byte("`"+name+"`")) && !strings.HasPrefix(name, "RINGLIMIT_") {
					t.Errorf("docs/migration.md does not list %s", name)
				}
			}
			dir := cfgDir
			if strings.HasPrefix(tc.env[0], "RUNTIME_") {
				dir = "" // the variables name the config path
			}
			got, out, err := dryRun(t, bin, []string{"serve"}, tc.env, dir)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}

	t.Run("ignored with a warning", func(t *testing.T) {
		ignored := []string{"REDIS_URL=redis:6379", "REDIS_SOCKET_TYPE=tcp", "REDIS_AUTH=x", "MEMCACHE_HOST_PORT=m:11211",
			"BACKEND_TYPE=redis", "USE_STATSD=true", "STATSD_HOST=s", "LOCAL_CACHE_SIZE_IN_BYTES=1000", "PROMETHEUS_ADDR=:9090"}
		_, out, err := dryRun(t, bin, []string{"serve"}, ignored, cfgDir)
		if err != nil {
			t.Fatalf("refused: %v\n%s", err, out)
		}
		var warnings []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "level=WARN") {
				warnings = append(warnings, l)
			}
		}
		if len(warnings) != 1 {
			t.Fatalf("want one warning, got %q", warnings)
		}
		for _, kv := range ignored {
			name, _, _ := strings.Cut(kv, "=")
			if !strings.Contains(warnings[0], name) {
				t.Errorf("warning %q does not name %s", warnings[0], name)
			}
			prefix := name
			if i := strings.Index(name, "_"); i > 0 && (strings.HasPrefix(name, "REDIS_") || strings.HasPrefix(name, "MEMCACHE_") || strings.HasPrefix(name, "STATSD_") || strings.HasPrefix(name, "PROMETHEUS_")) {
				prefix = name[:i+1] + "*"
			}
			if !bytes.Contains(doc, []byte("`"+prefix+"`")) {
				t.Errorf("docs/migration.md does not list %s", prefix)
			}
		}
	})
	// Settings that cannot be honoured and must not be ignored (a weaker
	// listener than configured, or one where Envoy does not look) refuse
	// to start, naming the variable.
	for _, tc := range []struct{ env, want string }{
		{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_USE_TLS is true but no server certificate and key are set"},
		{"GRPC_SERVER_USE_TLS=yes", `GRPC_SERVER_USE_TLS="yes": not a boolean`},
		{"GRPC_CLIENT_TLS_CACERT=/tls/ca.pem", "--grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT, GRPC_SERVER_TLS_CA_CERT) needs server TLS"},
		{"GRPC_SERVER_TLS_CA_CERT=/tls/ca.pem", "--grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT, GRPC_SERVER_TLS_CA_CERT) needs server TLS"},
		{"GRPC_CLIENT_TLS_SAN=envoy", "--grpc-tls-client-san (GRPC_CLIENT_TLS_SAN) needs --grpc-tls-client-ca"},
		{"TRACING_SAMPLING_RATE=2", "--tracing-sampling-rate (TRACING_SAMPLING_RATE): 2 is not in [0, 1]"},
		{"TRACING_EXPORTER_PROTOCOL=zipkin", `unknown protocol "zipkin" (http, grpc)`},
		{"GRPC_UDS=/var/run/rl.sock", "GRPC_UDS is set, but ringlimit serves gRPC on TCP only"},
		{"CONFIG_TYPE=GRPC_XDS_DELTA", `--config-type: unknown type "GRPC_XDS_DELTA" (FILE or GRPC_XDS_SOTW)`},
		{"PORT=abc", `--http-addr ":abc": port "abc" is not a number from 0 to 65535`},
		{"SHADOW_MODE=yes", `SHADOW_MODE="yes": parse error`},
	} {
		name, _, _ := strings.Cut(tc.env, "=")
		t.Run("refused "+name, func(t *testing.T) {
			if !bytes.Contains(doc, []byte("`"+name+"`")) {
				t.Errorf("docs/migration.md does not list %s", name)
			}
			_, out, err := dryRun(t, bin, []string{"serve"}, []string{tc.env}, cfgDir)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("err %v, output %q; want a refusal containing %q", err, out, tc.want)
			}
		})
	}
}
