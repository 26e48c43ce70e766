// Package cluster makes ringlimit processes one rate limiter: a Node joins
// the gossip membership (package membership), builds the ring of the ready
// members and publishes it atomically, decides each op at its key's owner
// (package transport), and keeps counts when nodes come and go: replication
// of every write to the key's replicas, handoff on ring changes and on a
// graceful leave, sync before a node is ready and re-sync after a freeze
// (package replication). A Node is safe for concurrent use.
package cluster
