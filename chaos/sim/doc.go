// Package sim is ringlimit's deterministic cluster simulation: real
// cluster.Node code, 3 to 50 nodes in one process, on a simulated network
// (cluster/simnet) and virtual time (testing/synctest), driven by a seeded
// schedule of joins, leaves, kills, restarts, pauses and partitions while
// simulated Envoys send hits. A Checker holds every answer against the
// bounds of docs/consistency.md (Bounds) and checks that every node ends on
// the same ring once the faults stop. `make sim` runs it over many seeds;
// `make sim SIM_SEED=n` replays one.
//
// The files: schedule.go draws a run from its seed (NewSchedule); node.go
// is the only file that knows cluster.Node's API (build, drain, stop, read
// a node); cluster.go keeps the simulated hosts and their nodes; run.go
// drives one run (Run) and checks it; check.go is the Checker and Bounds.
//
// What a seed fixes: the schedule (cluster size, network, keys, faults,
// every call's time, keys and entry-node pick) and, through simnet, each
// packet's fate by its place on its link. What it does not: the nodes' own
// randomness (memberlist's math/rand, the membership's name suffix, Go's
// map and select order) and the order goroutines run in within one virtual
// instant. A replay runs the same schedule; in the runs measured, runs of a
// seed agree answer for answer up to the first join or drain (whose
// readiness or leave memberlist gossips to random peers) and differ after
// it in up to a few percent of answers, so a violation that needs a narrow
// race may not show on every replay (TestSim's -sim.repeat measures it).
//
// A pause freezes the node's host on the network (simnet.Freeze) and its
// clock.Freezable (its timers stop, as a SIGSTOPped process's loops do; its
// pause detector sees the gap at the thaw and it re-syncs), and its Envoys
// stop calling it. memberlist's own timers, which do not take the node's
// clock, go on: a frozen node's gossip is held by the network, not stopped.
//
// Nothing outside tests imports it.
package sim
