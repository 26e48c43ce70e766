package ring

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// nodeIDs returns prefix-0 .. prefix-(n-1).
func nodeIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return ids
}

// testKeys returns n distinct keys shaped like rate-limit keys.
func testKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "domain\x00remote_address\x0010.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff)
	}
	return keys
}

// mustNew builds a Ring or fails the test.
func mustNew(tb testing.TB, ids []string, cfg Config) *Ring {
	tb.Helper()
	r, err := New(ids, cfg)
	if err != nil {
		tb.Fatalf("New(%d members, %+v): %v", len(ids), cfg, err)
	}
	return r
}

// without returns ids minus drop.
func without(ids []string, drop string) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		if id != drop {
			out = append(out, id)
		}
	}
	return out
}
