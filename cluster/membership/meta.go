package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// metaMax is memberlist's limit on node metadata (memberlist.MetaMaxSize).
const metaMax = 512

// metaVersion is the first byte of every encoded metadata blob. A decoder
// refuses any other version, so a future format is ignored (and logged) by
// old nodes instead of being misread.
const metaVersion = 1

// Flag bits of the metadata's second byte.
const (
	// flagLeaving marks a node that has started a graceful leave.
	flagLeaving = 1 << 0
	// flagReady marks a node that has synced its counters and
	// may be put in the ring. Old nodes ignore it (unknown flags are).
	flagReady = 1 << 1
	// flagRelaying marks a ready node that still relays what it
	// is sent to the keys' previous owners (Flags.Relaying). Old
	// nodes ignore it.
	flagRelaying = 1 << 2
	// flagDraining marks a node that has started to hand its
	// counters off before it leaves (Flags.Draining). Old nodes ignore it.
	flagDraining = 1 << 3
)

// nodeMeta is what a ringlimit process gossips about itself in memberlist's
// node metadata.
type nodeMeta struct {
	ID       string // stable identity (pod name)
	GRPCAddr string // host:port of its gRPC service
	Started  int64  // process start, Unix ns
	Leaving  bool   // a graceful leave has begun
	Ready    bool   // synced: may be a ring member
	Relaying bool   // just ready: relays to the keys' previous owners
	Draining bool   // handing its counters off before it leaves
}

var errMetaShort = errors.New("membership: metadata: truncated")

// encodeMeta encodes m as
//
//	version(1) flags(1) uvarint(len ID) ID uvarint(len GRPCAddr) GRPCAddr varint(Started)
//
// and fails if a field is empty, not UTF-8, or the result exceeds memberlist's
// 512-byte limit.
func encodeMeta(m nodeMeta) ([]byte, error) {
	if err := checkMeta(m); err != nil {
		return nil, err
	}
	var flags byte
	if m.Leaving {
		flags |= flagLeaving
	}
	if m.Ready {
		flags |= flagReady
	}
	if m.Relaying {
		flags |= flagRelaying
	}
	if m.Draining {
		flags |= flagDraining
	}
	b := make([]byte, 0, 2+2*binary.MaxVarintLen64+len(m.ID)+len(m.GRPCAddr)+binary.MaxVarintLen64)
	b = append(b, metaVersion, flags)
	b = binary.AppendUvarint(b, uint64(len(m.ID)))
	b = append(b, m.ID...)
	b = binary.AppendUvarint(b, uint64(len(m.GRPCAddr)))
	b = append(b, m.GRPCAddr...)
	b = binary.AppendVarint(b, m.Started)
	if len(b) > metaMax {
		return nil, fmt.Errorf("membership: metadata: %d bytes exceeds the %d-byte limit (shorten ID or GRPCAddr)", len(b), metaMax)
	}
	return b, nil
}

// decodeMeta is the inverse of encodeMeta. It rejects unknown
// versions, truncated input, trailing bytes and empty or non-UTF-8 fields.
// Unknown flag bits are ignored so that flags can be added compatibly.
func decodeMeta(b []byte) (nodeMeta, error) {
	var m nodeMeta
	if len(b) > metaMax {
		return m, fmt.Errorf("membership: metadata: %d bytes exceeds the %d-byte limit", len(b), metaMax)
	}
	if len(b) < 2 {
		return m, errMetaShort
	}
	if b[0] != metaVersion {
		return m, fmt.Errorf("membership: metadata: unknown version %d", b[0])
	}
	m.Leaving = b[1]&flagLeaving != 0
	m.Ready = b[1]&flagReady != 0
	m.Relaying = b[1]&flagRelaying != 0
	m.Draining = b[1]&flagDraining != 0
	rest := b[2:]
	var err error
	if m.ID, rest, err = readString(rest); err != nil {
		return nodeMeta{}, err
	}
	if m.GRPCAddr, rest, err = readString(rest); err != nil {
		return nodeMeta{}, err
	}
	started, n := binary.Varint(rest)
	if n <= 0 {
		return nodeMeta{}, errMetaShort
	}
	m.Started = started
	if len(rest) != n {
		return nodeMeta{}, fmt.Errorf("membership: metadata: %d trailing bytes", len(rest)-n)
	}
	if err := checkMeta(m); err != nil {
		return nodeMeta{}, err
	}
	return m, nil
}

func readString(b []byte) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 {
		return "", nil, errMetaShort
	}
	b = b[n:]
	if l > uint64(len(b)) {
		return "", nil, errMetaShort
	}
	return string(b[:l]), b[l:], nil
}

func checkMeta(m nodeMeta) error {
	switch {
	case m.ID == "":
		return errors.New("membership: metadata: empty ID")
	case m.GRPCAddr == "":
		return errors.New("membership: metadata: empty GRPCAddr")
	case !utf8.ValidString(m.ID):
		return errors.New("membership: metadata: ID is not valid UTF-8")
	case !utf8.ValidString(m.GRPCAddr):
		return errors.New("membership: metadata: GRPCAddr is not valid UTF-8")
	}
	return nil
}
