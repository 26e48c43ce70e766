package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// mshipMetaMax is memberlist's limit on node metadata (memberlist.MetaMaxSize).
const mshipMetaMax = 512

// mshipMetaVersion is the first byte of every encoded metadata blob. A decoder
// refuses any other version, so a future format is ignored (and logged) by
// old nodes instead of being misread.
const mshipMetaVersion = 1

// Flag bits of the metadata's second byte.
const (
	// mshipMetaFlagLeaving marks a node that has started a graceful leave.
	mshipMetaFlagLeaving = 1 << 0
	// mshipMetaFlagReady marks a node that has synced its counters and
	// may be put in the ring. Old nodes ignore it (unknown flags are).
	mshipMetaFlagReady = 1 << 1
	// mshipMetaFlagRelaying marks a ready node that still relays what it
	// is sent to the keys' previous owners (NodeConfig.JoinRelay). Old
	// nodes ignore it.
	mshipMetaFlagRelaying = 1 << 2
	// mshipMetaFlagDraining marks a node that has started to hand its
	// counters off before it leaves (Node.Drain). Old nodes ignore it.
	mshipMetaFlagDraining = 1 << 3
)

// mshipMeta is what a ringlimit process gossips about itself in memberlist's
// node metadata.
type mshipMeta struct {
	ID       string // stable identity (pod name)
	GRPCAddr string // host:port of its gRPC service
	Started  int64  // process start, Unix ns
	Leaving  bool   // a graceful leave has begun
	Ready    bool   // synced: may be a ring member
	Relaying bool   // just ready: relays to the keys' previous owners
	Draining bool   // handing its counters off before it leaves
}

var errMshipMetaShort = errors.New("cluster: metadata: truncated")

// mshipEncodeMeta encodes m as
//
//	version(1) flags(1) uvarint(len ID) ID uvarint(len GRPCAddr) GRPCAddr varint(Started)
//
// and fails if a field is empty, not UTF-8, or the result exceeds memberlist's
// 512-byte limit.
func mshipEncodeMeta(m mshipMeta) ([]byte, error) {
	if err := mshipCheckMeta(m); err != nil {
		return nil, err
	}
	var flags byte
	if m.Leaving {
		flags |= mshipMetaFlagLeaving
	}
	if m.Ready {
		flags |= mshipMetaFlagReady
	}
	if m.Relaying {
		flags |= mshipMetaFlagRelaying
	}
	if m.Draining {
		flags |= mshipMetaFlagDraining
	}
	b := make([]byte, 0, 2+2*binary.MaxVarintLen64+len(m.ID)+len(m.GRPCAddr)+binary.MaxVarintLen64)
	b = append(b, mshipMetaVersion, flags)
	b = binary.AppendUvarint(b, uint64(len(m.ID)))
	b = append(b, m.ID...)
	b = binary.AppendUvarint(b, uint64(len(m.GRPCAddr)))
	b = append(b, m.GRPCAddr...)
	b = binary.AppendVarint(b, m.Started)
	if len(b) > mshipMetaMax {
		return nil, fmt.Errorf("cluster: metadata: %d bytes exceeds the %d-byte limit (shorten ID or GRPCAddr)", len(b), mshipMetaMax)
	}
	return b, nil
}

// mshipDecodeMeta is the inverse of mshipEncodeMeta. It rejects unknown
// versions, truncated input, trailing bytes and empty or non-UTF-8 fields.
// Unknown flag bits are ignored so that flags can be added compatibly.
func mshipDecodeMeta(b []byte) (mshipMeta, error) {
	var m mshipMeta
	if len(b) > mshipMetaMax {
		return m, fmt.Errorf("cluster: metadata: %d bytes exceeds the %d-byte limit", len(b), mshipMetaMax)
	}
	if len(b) < 2 {
		return m, errMshipMetaShort
	}
	if b[0] != mshipMetaVersion {
		return m, fmt.Errorf("cluster: metadata: unknown version %d", b[0])
	}
	m.Leaving = b[1]&mshipMetaFlagLeaving != 0
	m.Ready = b[1]&mshipMetaFlagReady != 0
	m.Relaying = b[1]&mshipMetaFlagRelaying != 0
	m.Draining = b[1]&mshipMetaFlagDraining != 0
	rest := b[2:]
	var err error
	if m.ID, rest, err = mshipReadString(rest); err != nil {
		return mshipMeta{}, err
	}
	if m.GRPCAddr, rest, err = mshipReadString(rest); err != nil {
		return mshipMeta{}, err
	}
	started, n := binary.Varint(rest)
	if n <= 0 {
		return mshipMeta{}, errMshipMetaShort
	}
	m.Started = started
	if len(rest) != n {
		return mshipMeta{}, fmt.Errorf("cluster: metadata: %d trailing bytes", len(rest)-n)
	}
	if err := mshipCheckMeta(m); err != nil {
		return mshipMeta{}, err
	}
	return m, nil
}

func mshipReadString(b []byte) (string, []byte, error) {
	l, n := binary.Uvarint(b)
	if n <= 0 {
		return "", nil, errMshipMetaShort
	}
	b = b[n:]
	if l > uint64(len(b)) {
		return "", nil, errMshipMetaShort
	}
	return string(b[:l]), b[l:], nil
}

func mshipCheckMeta(m mshipMeta) error {
	switch {
	case m.ID == "":
		return errors.New("cluster: metadata: empty ID")
	case m.GRPCAddr == "":
		return errors.New("cluster: metadata: empty GRPCAddr")
	case !utf8.ValidString(m.ID):
		return errors.New("cluster: metadata: ID is not valid UTF-8")
	case !utf8.ValidString(m.GRPCAddr):
		return errors.New("cluster: metadata: GRPCAddr is not valid UTF-8")
	}
	return nil
}
