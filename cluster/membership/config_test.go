package membership

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMembershipConfigErrors(t *testing.T) {
	t.Parallel()
	ok := Config{ID: "a", GRPCAddr: "10.0.0.1:8081", BindAddr: "127.0.0.1:0"}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no id", func(c *Config) { c.ID = "" }, "Config.ID: required"},
		{"no grpc", func(c *Config) { c.GRPCAddr = "" }, "Config.GRPCAddr"},
		{"grpc without port", func(c *Config) { c.GRPCAddr = "10.0.0.1" }, "Config.GRPCAddr"},
		{"grpc without host", func(c *Config) { c.GRPCAddr = ":8081" }, "Config.GRPCAddr"},
		{"metadata too big", func(c *Config) { c.ID = strings.Repeat("x", 600) }, "512-byte limit"},
		{"bind not host:port", func(c *Config) { c.BindAddr = "7946" }, "Config.BindAddr"},
		{"bind hostname", func(c *Config) { c.BindAddr = "localhost:7946" }, "must be an IP"},
		{"bind port range", func(c *Config) { c.BindAddr = ":70000" }, "Config.BindAddr"},
		{"advertise hostname", func(c *Config) { c.AdvertiseAddr = "pod.example" }, "Config.AdvertiseAddr"},
		{"advertise bad port", func(c *Config) { c.AdvertiseAddr = "10.0.0.1:x" }, "Config.AdvertiseAddr"},
		{"empty join entry", func(c *Config) { c.Join = []string{"10.0.0.2:7946", " "} }, "Config.Join[1]"},
		{"negative rejoin", func(c *Config) { c.RejoinInterval = -time.Second }, "Config.RejoinInterval"},
		{"short key", func(c *Config) { c.SecretKey = []byte("short") }, "Config.SecretKey: 5 bytes"},
		{"short key in keyring", func(c *Config) { c.Keys = [][]byte{make([]byte, 32), []byte("short")} }, "Config.Keys[1]: 5 bytes"},
		{"key and keyring", func(c *Config) { c.SecretKey, c.Keys = make([]byte, 16), [][]byte{make([]byte, 16)} }, "not both"},
		{"unknown preset", func(c *Config) { c.Preset = "wan" }, `unknown preset "wan"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			m, err := New(cfg, nil)
			if err == nil {
				_ = m.Close()
				t.Fatalf("New succeeded, want error containing %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), "membership: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestPickAlive(t *testing.T) {
	t.Parallel()
	mk := func(id, name string, started int64, state string) *row {
		return &row{member: Member{ID: id, Name: name, GRPCAddr: id + ":1", Started: started, State: state}}
	}
	tests := []struct {
		name      string
		nodes     []*row
		wantNames []string
	}{
		{"empty", nil, []string{}},
		{"sorted by id", []*row{mk("c", "c/1", 1, MemberAlive), mk("a", "a/1", 1, MemberAlive), mk("b", "b/1", 1, MemberAlive)}, []string{"a/1", "b/1", "c/1"}},
		{"newest start wins", []*row{mk("b", "b/old", 1, MemberAlive), mk("b", "b/new", 2, MemberAlive)}, []string{"b/new"}},
		{"tie goes to greater name", []*row{mk("b", "b/x", 5, MemberAlive), mk("b", "b/y", 5, MemberAlive)}, []string{"b/y"}},
		{"dead newest falls back to older live", []*row{mk("b", "b/old", 1, MemberAlive), mk("b", "b/new", 2, MemberDead)}, []string{"b/old"}},
		{"left and dead excluded", []*row{mk("a", "a/1", 1, MemberLeft), mk("b", "b/1", 1, MemberDead), mk("c", "c/1", 1, MemberAlive)}, []string{"c/1"}},
		{"ids that are prefixes stay apart", []*row{mk("x-1", "x-1/a", 1, MemberAlive), mk("x-11", "x-11/a", 1, MemberAlive)}, []string{"x-1/a", "x-11/a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := make(map[string]*row)
			for _, n := range tt.nodes {
				nodes[n.member.Name] = n
			}
			got := pickAlive(nodes)
			names := make([]string, len(got))
			for i, m := range got {
				names[i] = m.Name
			}
			if !slices.Equal(names, tt.wantNames) {
				t.Fatalf("got %v, want %v", names, tt.wantNames)
			}
		})
	}
}
