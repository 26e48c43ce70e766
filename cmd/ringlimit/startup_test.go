package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A start-up error about a flag's value names the flag, the value, where
// it came from and the flag's default.
func TestStartupErrorsNameFlagAndDefault(t *testing.T) {
	leakCheck(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	taken := busy.Addr().String()
	missing := filepath.Join(t.TempDir(), "missing")
	free := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"}
	cfg := []string{"--config", "../../deploy/examples/config", "--node-name", "n1"}
	tests := []struct {
		name string
		args []string
		env  environment
		want string
	}{
		{"config from a flag", []string{"--config", missing}, nil,
			"serve: --config " + missing + " (from --config; default /srv/runtime_data/current/config): no such file or directory"},
		{"config from RINGLIMIT_CONFIG", nil, environment{"RINGLIMIT_CONFIG=" + missing},
			"serve: --config " + missing + " (from RINGLIMIT_CONFIG; default /srv/runtime_data/current/config): no such file or directory"},
		{"grpc port taken", append(append(append([]string(nil), cfg...), free...), "--grpc-addr", taken), nil,
			"serve: --grpc-addr " + taken + " (from --grpc-addr; default :8081): listen tcp " + taken + ": bind: address already in use"},
		{"http port from RINGLIMIT_HTTP_ADDR taken", append(append([]string(nil), cfg...), "--grpc-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"),
			environment{"RINGLIMIT_HTTP_ADDR=" + taken}, "serve: --http-addr " + taken + " (from RINGLIMIT_HTTP_ADDR; default :8080): listen tcp"},
		{"gossip port taken", append(append(append([]string(nil), cfg...), free...), "--gossip-addr", taken, "--join", taken), nil,
			"serve: --gossip-addr " + taken + " (from --gossip-addr; default :7946): "},
	}
	if _, err := os.Stat("/srv/runtime_data/current/config"); os.IsNotExist(err) {
		tests = append(tests, struct {
			name string
			args []string
			env  environment
			want string
		}{"config left at its default", nil, nil,
			"serve: --config /srv/runtime_data/current/config (the default; set --config or RINGLIMIT_CONFIG): no such file or directory"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := serveCmd(context.Background(), tt.args, tt.env, &out, &errb)
			if code != 1 || !strings.Contains(errb.String(), tt.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, errb.String(), tt.want)
			}
		})
	}
}
