// Package sim is ringlimit's deterministic cluster simulation: real
// cluster.Node code, 3 to 50 nodes in one process, on a simulated network
// (cluster/simnet) and virtual time (testing/synctest), driven by a seeded
// schedule of joins, leaves, kills, restarts, pauses and partitions while
// simulated Envoys send hits. A Checker holds every answer against the
// bounds of docs/consistency.md (Bounds) and checks that every node ends on
// the same ring once the faults stop. `make sim` runs it over many seeds;
// `make sim SIM_SEED=n` replays one.
//
// Nothing outside tests imports it.
package sim
