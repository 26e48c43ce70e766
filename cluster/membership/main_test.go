package membership

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/cluster/internal/testkit"
)

// TestMain fails the package if any goroutine outlives the tests by more
// than 20 s. Only the tests outside a synctest bubble (the real-network one
// and the Leave/Close race) can leave memberlist goroutines behind: they end
// within a probe interval of Shutdown, later on a busy machine.
func TestMain(m *testing.M) { testkit.Main(m, 20*time.Second) }
