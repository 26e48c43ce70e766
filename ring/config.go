package ring

import (
	"fmt"
	"math"

	"github.com/buraksezer/consistent"
)

// Defaults used for the zero fields of Config. Every node of a cluster must
// place keys alike: these are part of the cluster's protocol.
//
// The library's own defaults (271 partitions, load 1.25) gave the busiest of
// three members 38% of the keys (15% over its share). 1021 partitions with a
// load bound of 1.05 give it 35% (5% over), move 27.5% of the keys when a
// fourth member joins (ideal 25%, the library's defaults 21%), and build a
// 50-member ring in about 4 ms, as before.
const (
	// DefaultPartitions is the partition count used when Config.Partitions is 0.
	DefaultPartitions = 1021
	// DefaultReplicationFactor is the number of virtual nodes per member used
	// when Config.ReplicationFactor is 0.
	DefaultReplicationFactor = consistent.DefaultReplicationFactor // 20
	// DefaultLoad is the load bound used when Config.Load is 0.
	DefaultLoad = 1.05
)

// Limits enforced by New so that a bad config is an error, not an
// out-of-memory or a hang.
const (
	// MaxPartitions is the largest accepted Config.Partitions.
	MaxPartitions = 1 << 20
	// MaxVirtualNodes is the largest accepted len(members) * ReplicationFactor.
	MaxVirtualNodes = 1 << 22
)

// Config tunes placement. The zero value is valid and selects the defaults.
// Every node of a cluster must use the same Config, or they disagree on owners.
type Config struct {
	// Partitions is how many partitions keys are hashed into; each partition
	// has one owner. 0 means DefaultPartitions; it must be at most
	// MaxPartitions. A prime spreads keys best.
	Partitions int
	// ReplicationFactor is how many virtual nodes each member has on the hash
	// circle. 0 means DefaultReplicationFactor.
	ReplicationFactor int
	// Load bounds how many partitions one member may own: at most
	// ceil(Partitions/members*Load). 0 means DefaultLoad; otherwise it must be
	// a finite number >= 1 (below 1 the partitions may not fit).
	Load float64
}

// withDefaults validates c and returns it with zero fields replaced by the
// defaults.
func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Partitions < 0 || c.Partitions > MaxPartitions:
		return c, fmt.Errorf("ring: config: partitions: %d not in [0, %d]", c.Partitions, MaxPartitions)
	case c.ReplicationFactor < 0 || c.ReplicationFactor > MaxVirtualNodes:
		return c, fmt.Errorf("ring: config: replication factor: %d not in [0, %d]", c.ReplicationFactor, MaxVirtualNodes)
	case math.IsNaN(c.Load) || math.IsInf(c.Load, 0) || (c.Load != 0 && c.Load < 1):
		return c, fmt.Errorf("ring: config: load: %v is not 0 or a finite number >= 1", c.Load)
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.Load == 0 {
		c.Load = DefaultLoad
	}
	return c, nil
}
