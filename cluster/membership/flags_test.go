package membership

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// SetFlags gossips the ready, relaying and draining flags: every peer's
// Alive and onChange see them, a process starts with none, a process that
// is not ready does not relay, draining cannot be undone, and SetFlags
// after Leave is an error.
func TestMembershipSetFlags(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		n := newTestNet(t)
		nodes := startCluster(t, n, []string{"a", "b"})
		a, b := nodes[0], nodes[1]
		flagsOf := func(ms []Member, id string) Flags {
			for _, m := range ms {
				if m.ID == id {
					return Flags{m.Ready, m.Relaying, m.Draining}
				}
			}
			return Flags{}
		}
		if flagsOf(b.Alive(), "a").Ready || a.Self().Ready || a.Flags() != (Flags{}) {
			t.Fatal("a is ready before SetFlags")
		}
		for _, tc := range []struct{ set, want Flags }{
			{Flags{Ready: true, Relaying: true}, Flags{Ready: true, Relaying: true}},
			{Flags{Ready: true}, Flags{Ready: true}},
			{Flags{}, Flags{}},
			{Flags{Relaying: true}, Flags{}},
			{Flags{Ready: true}, Flags{Ready: true}},
			{Flags{Ready: true, Draining: true}, Flags{Ready: true, Draining: true}},
			{Flags{Ready: true}, Flags{Ready: true, Draining: true}},
		} {
			if err := a.SetFlags(tc.set); err != nil {
				t.Fatalf("SetFlags(%+v): %v", tc.set, err)
			}
			if got := flagsOf([]Member{a.Self()}, "a"); got != tc.want || a.Flags() != tc.want {
				t.Errorf("a.Self() has %+v, a.Flags() %+v after SetFlags(%+v), want %+v", got, a.Flags(), tc.set, tc.want)
			}
			testkit.WaitFor(t, quick, fmt.Sprintf("b to see a %+v", tc.want), func() bool {
				return flagsOf(b.Alive(), "a") == tc.want && flagsOf(b.rec.last(), "a") == tc.want
			})
		}
		if err := a.SetFlags(Flags{Ready: true}); err != nil {
			t.Errorf("repeated SetFlags(%+v): %v", Flags{Ready: true}, err)
		}
		if err := a.Leave(quick); err != nil {
			t.Fatal(err)
		}
		if err := a.SetFlags(Flags{}); err == nil || !strings.HasPrefix(err.Error(), "membership: ") {
			t.Errorf("SetFlags after Leave = %v, want a membership: error", err)
		}
	})
}
