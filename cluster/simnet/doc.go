// Package simnet is a simulated network for tests and deterministic cluster
// simulations that run inside a testing/synctest bubble.
//
// A Network owns named hosts (IP strings such as "10.0.0.1"), the packets in
// flight between them, the stream connections between them and the faults
// laid on them: partitions, one-way cuts, packet loss, crashed and frozen
// hosts. A Host offers what a node process needs: a memberlist transport
// (Host.Transport) for gossip, and in-memory TCP-like streams (Host.Listen,
// Host.Dial) for gRPC. Nothing touches a real socket.
//
// Every type is safe for concurrent use. Everything that waits (Accept,
// Read, Write, Dial, a packet's latency) waits on channels and timers
// created by the Network, never on a held mutex, so inside a bubble a
// waiting goroutine is durably blocked and virtual time advances. Create the
// Network inside the bubble that uses it: its channels and timers belong to
// that bubble. It also works outside a bubble, in real time.
//
// Random choices (a packet's loss and delay) come from the seed and from the
// packet's place on its link: the n-th packet from one address to another
// gets the same fate in every run with the same seed, whatever the other
// goroutines do meanwhile. Packets and stream writes due at the same
// instant arrive in a fixed order (by source, destination and sequence).
//
// A simulated crash cannot stop a node's goroutines: the caller still owns
// them and stops them (memberlist.Shutdown, grpc.Server.Stop). A test ends
// by stopping its nodes, calling Network.Close, which resets every
// connection and closes every listener and transport left, and then letting
// virtual time pass for timers the nodes' goroutines are still waiting on
// (memberlist's probes wait out ProbeTimeout without watching for shutdown).
package simnet
