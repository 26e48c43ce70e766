package ring

import (
	"encoding/binary"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// hasher is the consistent.Hasher of the ring: xxhash64 with seed 0. It is
// fixed so that all processes agree (never hash/maphash).
type hasher struct{}

// Sum64 returns the xxhash64 (seed 0) of b.
func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// member is how a node ID is shown to the consistent library. The library
// hashes label (member.String()) together with a replica index to place
// virtual nodes; v1.0.0 builds "<index>:<label>", older versions built
// "<label><index>", where "x-1"+"10" equals "x-11"+"0". The label is
// length-prefixed ("<len(id)>:<id>") so that no label+index can equal
// another label+index in either scheme, whatever bytes the IDs hold.
type member struct {
	id    string
	label string
}

// newMember wraps a node ID.
func newMember(id string) member {
	return member{id: id, label: memberLabel(id)}
}

// String returns the terminated identity hashed by the library.
func (m member) String() string { return m.label }

// memberLabel returns the length-prefixed form of id.
func memberLabel(id string) string {
	return strconv.Itoa(len(id)) + ":" + id
}

// vnodeKey returns the bytes consistent v1.0.0 hashes for replica idx of a
// member whose String() is label (its replicaKey: "%d:%s").
func vnodeKey(label string, idx int) []byte {
	b := strconv.AppendInt(make([]byte, 0, 24+len(label)), int64(idx), 10)
	b = append(b, ':')
	return append(b, label...)
}

// partitionPoint returns where consistent v1.0.0 puts partition p on the
// hash circle: the hash of p as 8 little-endian bytes.
func partitionPoint(p int) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(p))
	return xxhash.Sum64(b[:])
}
