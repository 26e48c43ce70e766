package bucket

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
)

// This file holds the snapshot codec: a store's counters as bytes, to be
// kept somewhere (a file, for the caller to write) and merged back later.
// It reads and writes no files itself.
//
// Format, version 1 (integers are encoding/binary varints: u = unsigned,
// s = signed, zig-zag):
//
//	magic    8 bytes "RLSNAP\r\n"
//	version  u (1)
//	node     u length (<= MaxSnapshotNodeLen), then the bytes
//	written  s Unix ns
//	entries, each:
//	  1 byte 1
//	  key    u length (1 to MaxSnapshotKeyLen), then the bytes
//	  algo   1 byte (Algorithm)
//	  FixedWindow:   window s, unit s, count u
//	  SlidingWindow: window s, unit s, count u, prev u
//	  TokenBucket:   unit s, tat s
//	end:
//	  1 byte 0
//	  count  u (the number of entries)
//	  crc    4 bytes, little-endian CRC-32C (Castagnoli) of every byte before it

const (
	// snapshotMagic opens every snapshot; the \r\n catches a transfer
	// that rewrote line endings.
	snapshotMagic = "RLSNAP\r\n"
	// snapshotVersion is the format version written.
	snapshotVersion = 1

	// MaxSnapshotKeyLen bounds a key in a snapshot, in bytes: the peer
	// protocol's bound (a key the cluster cannot carry is never stored).
	MaxSnapshotKeyLen = 8 << 10
	// MaxSnapshotNodeLen bounds SnapshotHeader.Node, in bytes.
	MaxSnapshotNodeLen = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBadSnapshot marks bytes that are not a valid snapshot: another kind of
// file, an unknown format version, a checksum that does not match (a
// truncated or damaged file), or an entry out of bounds. ReadSnapshot's
// errors wrap it, except those of the reader itself.
var ErrBadSnapshot = errors.New("bucket: bad snapshot")

// SnapshotHeader is what a snapshot says about itself.
type SnapshotHeader struct {
	// Node names whoever wrote the snapshot, as the writer chose (a node's
	// identity, for instance): at most MaxSnapshotNodeLen bytes. A reader
	// compares it; the codec does not interpret it.
	Node string
	// Written is when the snapshot was taken, Unix ns: the entries are
	// those live at that instant.
	Written int64
}

// WriteSnapshot writes the entries live at h.Written (Unix ns) for which
// keep returns true (every live entry when keep is nil) to w, in one pass
// and buffered, and returns how many it wrote. keep is called without any
// store lock held, with a key valid only during the call; entries changed
// while the snapshot is taken may be written as they were before the
// change (as Range reports them).
//
// The snapshot is complete only when err is nil: a reader refuses anything
// shorter. A caller that replaces an older snapshot writes to a new place
// and swaps it in only then.
func (s *Store) WriteSnapshot(w io.Writer, h SnapshotHeader, keep func(key []byte, st State) bool) (entries int, err error) {
	if len(h.Node) > MaxSnapshotNodeLen {
		return 0, fmt.Errorf("bucket: snapshot: node name is %d bytes, more than %d", len(h.Node), MaxSnapshotNodeLen)
	}
	sw := snapshotWriter{w: bufio.NewWriterSize(w, 64<<10)}
	buf := append(make([]byte, 0, 128), snapshotMagic...)
	buf = binary.AppendUvarint(buf, snapshotVersion)
	buf = binary.AppendUvarint(buf, uint64(len(h.Node)))
	buf = append(buf, h.Node...)
	buf = binary.AppendVarint(buf, h.Written)
	sw.write(buf)
	s.Range(h.Written, func(key []byte, st State) bool {
		if len(key) == 0 || len(key) > MaxSnapshotKeyLen || (keep != nil && !keep(key, st)) {
			return true
		}
		buf = appendSnapshotEntry(buf[:0], key, st)
		sw.write(buf)
		entries++
		return sw.err == nil
	})
	buf = append(buf[:0], 0)
	buf = binary.AppendUvarint(buf, uint64(entries))
	sw.write(buf)
	sw.write(binary.LittleEndian.AppendUint32(buf[:0], sw.crc))
	if sw.err == nil {
		sw.err = sw.w.Flush()
	}
	if sw.err != nil {
		return entries, fmt.Errorf("bucket: snapshot: %w", sw.err)
	}
	return entries, nil
}

// snapshotWriter writes through a buffer and checksums what it wrote; the
// first error sticks.
type snapshotWriter struct {
	w   *bufio.Writer
	crc uint32
	err error
}

func (sw *snapshotWriter) write(b []byte) {
	if sw.err != nil {
		return
	}
	sw.crc = crc32.Update(sw.crc, castagnoli, b)
	_, sw.err = sw.w.Write(b)
}

// appendSnapshotEntry appends one entry, tag byte included.
func appendSnapshotEntry(b, key []byte, st State) []byte {
	b = append(b, 1)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	b = append(b, byte(st.Algorithm))
	switch st.Algorithm {
	case TokenBucket:
		b = binary.AppendVarint(b, st.Unit)
		b = binary.AppendVarint(b, st.TAT)
	case SlidingWindow:
		b = binary.AppendVarint(b, st.Window)
		b = binary.AppendVarint(b, st.Unit)
		b = binary.AppendUvarint(b, st.Count)
		b = binary.AppendUvarint(b, st.Prev)
	default:
		b = binary.AppendVarint(b, st.Window)
		b = binary.AppendVarint(b, st.Unit)
		b = binary.AppendUvarint(b, st.Count)
	}
	return b
}

// Snapshot is a snapshot read and checked by ReadSnapshot: its header and
// its entries, every one of them valid. It is read-only, so concurrent
// calls of its methods are safe.
type Snapshot struct {
	// Header is what the snapshot says about itself.
	Header SnapshotHeader
	// entries is the entry count; body holds exactly the entries' bytes.
	entries int
	body    []byte
}

// ReadSnapshot reads a whole snapshot from r and checks it before it
// returns: the magic, the format version, the checksum over every byte, and
// every entry (a key of 1 to MaxSnapshotKeyLen bytes; a state whose limit
// would pass Limit.Validate, a window on its unit's grid and, for a sliding
// window, counts of at most math.MaxUint32), the entry count and that
// nothing follows. So a snapshot that is damaged anywhere, truncated or
// padded yields an error wrapping ErrBadSnapshot and no entries at all;
// it never panics. It keeps the bytes of the entries in memory (about 30
// bytes per entry plus the keys) until the Snapshot is dropped. It does not
// check the entries' times: Store.Merge skips those expired at its now.
func ReadSnapshot(r io.Reader) (*Snapshot, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("bucket: snapshot: %w", err)
	}
	return DecodeSnapshot(b)
}

func badSnapshot(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadSnapshot, fmt.Sprintf(format, args...))
}

// DecodeSnapshot is ReadSnapshot on a snapshot already in memory (a file
// read whole with os.ReadFile, say). The Snapshot keeps b: the caller must
// not change it while the Snapshot is in use.
func DecodeSnapshot(b []byte) (*Snapshot, error) {
	if len(b) < len(snapshotMagic) || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return nil, badSnapshot("not a ringlimit snapshot (no %q at the start)", snapshotMagic)
	}
	if len(b) < len(snapshotMagic)+4 {
		return nil, badSnapshot("truncated: %d bytes", len(b))
	}
	content, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(content, castagnoli); got != sum {
		return nil, badSnapshot("checksum mismatch (damaged or truncated): computed %08x, stored %08x", got, sum)
	}
	d := snapDecoder{b: content[len(snapshotMagic):]}
	if v := d.uvarint("format version"); d.err == nil && v != snapshotVersion {
		return nil, badSnapshot("format version %d, this build reads %d", v, snapshotVersion)
	}
	n := d.uvarint("node name length")
	if d.err == nil && n > MaxSnapshotNodeLen {
		return nil, badSnapshot("node name is %d bytes, more than %d", n, MaxSnapshotNodeLen)
	}
	var h SnapshotHeader
	h.Node = string(d.bytes(n, "node name"))
	h.Written = d.varint("write time")
	if d.err != nil {
		return nil, d.err
	}
	body := d.b
	entries := 0
	for {
		tag := d.byte1("entry tag")
		if d.err != nil {
			return nil, d.err
		}
		if tag == 0 {
			break
		}
		if tag != 1 {
			return nil, badSnapshot("entry %d: tag %d, want 0 or 1", entries, tag)
		}
		d.entry()
		if d.err != nil {
			return nil, fmt.Errorf("%w (entry %d)", d.err, entries)
		}
		entries++
	}
	body = body[:len(body)-len(d.b)-1] // the entries, without the end tag
	count := d.uvarint("entry count")
	switch {
	case d.err != nil:
		return nil, d.err
	case count != uint64(entries):
		return nil, badSnapshot("%d entries, the trailer says %d", entries, count)
	case len(d.b) != 0:
		return nil, badSnapshot("%d bytes after the trailer", len(d.b))
	}
	return &Snapshot{Header: h, entries: entries, body: body}, nil
}

// Len returns the number of entries.
func (s *Snapshot) Len() int { return s.entries }

// Range calls fn for each entry, in the order written, until fn returns
// false. key is valid only during the call.
func (s *Snapshot) Range(fn func(key []byte, st State) bool) {
	d := snapDecoder{b: s.body}
	for len(d.b) > 0 {
		d.byte1("entry tag")
		key, st := d.entry()
		if d.err != nil || !fn(key, st) {
			return // d.err: cannot happen, the body was checked
		}
	}
}

// snapDecoder reads a snapshot's fields; the first error sticks and every
// later read returns zero values.
type snapDecoder struct {
	b   []byte
	err error
}

func (d *snapDecoder) fail(what string) {
	if d.err == nil {
		d.err = badSnapshot("truncated or malformed %s", what)
	}
}

func (d *snapDecoder) byte1(what string) byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail(what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *snapDecoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *snapDecoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *snapDecoder) bytes(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(what)
		return nil
	}
	b := d.b[:n]
	d.b = d.b[n:]
	return b
}

// entry reads one entry after its tag and checks it.
func (d *snapDecoder) entry() ([]byte, State) {
	n := d.uvarint("key length")
	if d.err == nil && (n == 0 || n > MaxSnapshotKeyLen) {
		d.err = badSnapshot("key is %d bytes, want 1 to %d", n, MaxSnapshotKeyLen)
	}
	key := d.bytes(n, "key")
	st := State{Algorithm: Algorithm(d.byte1("algorithm"))}
	switch st.Algorithm {
	case FixedWindow:
		st.Window, st.Unit, st.Count = d.varint("window"), d.varint("unit"), d.uvarint("count")
	case SlidingWindow:
		st.Window, st.Unit, st.Count, st.Prev = d.varint("window"), d.varint("unit"), d.uvarint("count"), d.uvarint("previous count")
	case TokenBucket:
		st.Unit, st.TAT = d.varint("unit"), d.varint("arrival time")
	default:
		if d.err == nil {
			d.err = badSnapshot("unknown algorithm %d", uint8(st.Algorithm))
		}
	}
	if d.err != nil {
		return nil, State{}
	}
	if err := (Limit{Algorithm: st.Algorithm, Unit: st.Unit}).Validate(); err != nil {
		d.err = badSnapshot("%v", err)
	} else if st.Algorithm == SlidingWindow && max(st.Count, st.Prev) > math.MaxUint32 {
		d.err = badSnapshot("sliding window counts above %d", uint64(math.MaxUint32))
	} else if st.Algorithm != TokenBucket && !OnWindowGrid(st.Window, st.Unit) {
		d.err = badSnapshot("window %d is not a multiple of its unit %d", st.Window, st.Unit)
	}
	if d.err != nil {
		return nil, State{}
	}
	return key, st
}
