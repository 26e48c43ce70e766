package replication

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// TestMain fails the package if any goroutine outlives the tests by more
// than 20 s.
func TestMain(m *testing.M) { testkit.Main(m, 20*time.Second) }
