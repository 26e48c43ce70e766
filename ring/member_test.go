package ring

import (
	"strconv"
	"testing"

	"github.com/buraksezer/consistent"
)

// TestMemberIdentityTerminated checks that the labels given to the library
// keep every virtual node key distinct, both in v1.0.0's "<index>:<label>"
// scheme and in the older "<label><index>" scheme, where raw IDs collide
// ("x-1"+"10" == "x-11"+"0").
func TestMemberIdentityTerminated(t *testing.T) {
	schemes := []struct {
		name string
		key  func(label string, idx int) string
	}{
		{"v1.0.0 index:label", func(l string, i int) string { return string(vnodeKey(l, i)) }},
		{"v0.10.0 label+index", func(l string, i int) string { return l + strconv.Itoa(i) }},
	}
	ids := append(nodeIDs("x", 12), "1", "11", "1:1", ":", "a\x00", "a\x001")
	for _, s := range schemes {
		t.Run(s.name, func(t *testing.T) {
			seen := map[string]string{}
			for _, id := range ids {
				for i := range 40 {
					k := s.key(memberLabel(id), i)
					if prev, dup := seen[k]; dup {
						t.Fatalf("virtual node key %q of %q replica %d also belongs to %q", k, id, i, prev)
					}
					seen[k] = id
				}
			}
		})
	}
}

func TestVnodeKeyMatchesLibraryFormat(t *testing.T) {
	// consistent v1.0.0 replicaKey is fmt.Sprintf("%d:%s", idx, name).
	if got := string(vnodeKey("5:x-11", 13)); got != "13:5:x-11" {
		t.Fatalf("vnodeKey = %q", got)
	}
	if got := memberLabel("x-11"); got != "4:x-11" {
		t.Fatalf("memberLabel = %q", got)
	}
}

// TestLibraryTwelveMembersRemove drives the library directly the way New
// feeds it: twelve members x-0..x-11, then Remove x-11.
func TestLibraryTwelveMembersRemove(t *testing.T) {
	ids := nodeIDs("x", 12)
	ms := make([]consistent.Member, len(ids))
	for i, id := range ids {
		ms[i] = newMember(id)
	}
	c := consistent.New(ms, consistent.Config{Hasher: hasher{}})
	c.Remove(memberLabel("x-11"))
	if got := len(c.GetMembers()); got != 11 {
		t.Fatalf("members after remove = %d, want 11", got)
	}
	for _, k := range testKeys(5000) {
		m := c.LocateKey(k)
		if m == nil || m.(member).id == "x-11" {
			t.Fatalf("LocateKey(%q) = %v after removing x-11", k, m)
		}
	}
}
