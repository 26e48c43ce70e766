package cluster

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// TestMain fails the package if any goroutine outlives the tests by more
// than 20 s. Every node here runs in a synctest bubble, which ends only
// once all of its goroutines have (memberlist's too), so the grace is
// waited only for a goroutine started outside one.
func TestMain(m *testing.M) { testkit.Main(m, 20*time.Second) }
