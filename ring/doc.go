// Package ring owns key placement: which cluster member owns a key, and
// which distinct members follow it (for fail-over).
//
// Placement is consistent hashing with bounded loads
// (github.com/buraksezer/consistent v1.0.0) over xxhash with its fixed seed
// 0, so every process that is given the same member IDs and Config computes
// the same owners, whatever order the IDs arrive in.
//
// The second successor of a key is the member that owns it once its owner
// leaves (exactly, for rings of up to MaxExactSuccessorMembers members), so a
// copy kept there survives the owner.
//
// A Ring is an immutable snapshot and is safe for concurrent use; its
// lookups take no lock and allocate nothing. Rebuild a Ring with New
// whenever membership changes and publish it (an atomic.Pointer does).
package ring
