package ring

import (
	"math"
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	got, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Partitions: 1021, ReplicationFactor: 20, Load: 1.05}
	if got != want {
		t.Fatalf("defaults = %+v, want %+v", got, want)
	}
	set := Config{Partitions: 7, ReplicationFactor: 1, Load: 1}
	if got, _ := set.withDefaults(); got != set {
		t.Fatalf("explicit config changed: %+v", got)
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name    string
		members []string
		cfg     Config
		want    string // substring of the error
	}{
		{"empty id", []string{"a", "", "b"}, Config{}, `ring: members[1]: empty id`},
		{"duplicate", []string{"b", "a", "b"}, Config{}, `ring: duplicate member "b"`},
		{"negative partitions", []string{"a"}, Config{Partitions: -1}, "ring: config: partitions"},
		{"too many partitions", []string{"a"}, Config{Partitions: MaxPartitions + 1}, "ring: config: partitions"},
		{"negative replication", []string{"a"}, Config{ReplicationFactor: -3}, "ring: config: replication factor"},
		{"load below one", []string{"a"}, Config{Load: 0.5}, "ring: config: load"},
		{"negative load", []string{"a"}, Config{Load: -1}, "ring: config: load"},
		{"nan load", []string{"a"}, Config{Load: math.NaN()}, "ring: config: load"},
		{"inf load", []string{"a"}, Config{Load: math.Inf(1)}, "ring: config: load"},
		{"too many virtual nodes", nodeIDs("n", 3), Config{ReplicationFactor: MaxVirtualNodes/2 + 1}, "ring: 3 members x replication factor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.members, tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New() = %v, %v; want error containing %q", r, err, tt.want)
			}
			if r != nil {
				t.Fatalf("New() returned a ring with an error")
			}
		})
	}
}

func TestNewDoesNotTouchCallerSlice(t *testing.T) {
	ids := []string{"c", "a", "b"}
	r := mustNew(t, ids, Config{})
	if got := strings.Join(ids, ","); got != "c,a,b" {
		t.Fatalf("New reordered the caller's slice: %s", got)
	}
	ids[0] = "zzz"
	if got := strings.Join(r.Members(), ","); got != "a,b,c" {
		t.Fatalf("Members() = %s after the caller edited its slice", got)
	}
}
