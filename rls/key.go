package rls

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ringlimit/ringlimit/bucket"
)

// ErrMalformedKey is wrapped by every error ParseKey returns.
var ErrMalformedKey = errors.New("rls: malformed key")

// AppendKey appends the key of a request descriptor to dst and returns the
// extended slice; it is the counter key of a fixed-window rule
// (Domain.AppendKey adds a tag for the other algorithms, and digests long
// values). The key is a sequence of length-prefixed
// strings (a uvarint byte length, then the bytes): the domain, then each
// entry's key and value in order. Unlike the reference's "domain_k_v" keys it
// is unambiguous: distinct (domain, entries) give distinct keys, whatever
// bytes the strings contain. It allocates nothing when dst has the capacity.
func AppendKey(dst []byte, domain string, entries []*rlv3.RateLimitDescriptor_Entry) []byte {
	return appendKeyMax(dst, domain, entries, math.MaxInt)
}

// appendKeyMax is AppendKey with every value longer than maxValue bytes
// replaced by its digest (see keyAppendValue).
func appendKeyMax(dst []byte, domain string, entries []*rlv3.RateLimitDescriptor_Entry, maxValue int) []byte {
	dst = keyAppendString(dst, domain)
	for _, e := range entries {
		dst = keyAppendString(dst, e.GetKey())
		dst = keyAppendValue(dst, e.GetValue(), maxValue)
	}
	return dst
}

func keyAppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// keyTagKey is the entry key of the last part of a counter key for a rule
// whose algorithm is sliding_window or token_bucket: its value is the
// algorithm and the unit (counterTag). Such a rule whose algorithm or unit
// changes then counts on a new counter, as a fixed window does when its unit
// changes, instead of meeting the old state, which would win every merge at
// the replicas until it expired. A fixed window's key has no tag (it is the
// key envoyproxy/ratelimit's descriptors give, and a unit change is already
// a later window). The byte 0xff is never valid UTF-8, so no request entry
// key (a protobuf string) equals it.
const keyTagKey = "\xff"

// counterTag is the tag of a limit's counter key ("" for a fixed window).
func counterTag(l bucket.Limit) string {
	if l.Algorithm == bucket.FixedWindow {
		return ""
	}
	return l.Algorithm.String() + "/" + time.Duration(l.Unit).String()
}

// keyDigestPrefix starts the key part that stands for a value longer than
// the bound: the prefix, then the value's SHA-256 in hex.
const keyDigestPrefix = "sha256:"

// MaxCounterKeyLen bounds the counter keys the Service hands to its
// Counter: a longer key (many entries with long values) is replaced by the
// domain and one entry, keyDigestPrefix as its key and the SHA-256 of the
// whole key as its value (see keyAppendSum). Cluster peers accept keys up to 8 KiB, so
// every key can be decided at its owner.
const MaxCounterKeyLen = 4 << 10

// capKey shortens the key that starts at dst[start:], for domain, to its
// digest form when it is longer than MaxCounterKeyLen.
func capKey(dst []byte, start int, domain string) []byte {
	if len(dst)-start <= MaxCounterKeyLen {
		return dst
	}
	sum := sha256.Sum256(dst[start:]) // before dst[start:] is overwritten
	dst = keyAppendString(dst[:start], domain)
	dst = keyAppendString(dst, keyDigestPrefix)
	return keyAppendSum(dst, sum)
}

// keyAppendSum appends sum as one length-prefixed key string:
// keyDigestPrefix and sum in hex (71 bytes).
func keyAppendSum(dst []byte, sum [sha256.Size]byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(keyDigestPrefix)+hex.EncodedLen(len(sum))))
	dst = append(dst, keyDigestPrefix...)
	return hex.AppendEncode(dst, sum[:])
}

// keyAppendValue appends v as keyAppendString does, or, when it is longer
// than maxValue bytes, keyDigestPrefix and its SHA-256 in hex (71 bytes): a
// long value (a path with a long query string) still gets its own counter,
// without a key of its length. Anyone who could make another value collide
// with a digest could as well send the long value itself.
func keyAppendValue(dst []byte, v string, maxValue int) []byte {
	if len(v) <= maxValue {
		return keyAppendString(dst, v)
	}
	return keyAppendSum(dst, sha256.Sum256(unsafe.Slice(unsafe.StringData(v), len(v)))) // read only: no copy of v
}

// ParseKey is the inverse of AppendKey: it returns the domain and the
// entries as (key, value) pairs. It rejects truncated input, trailing bytes,
// non-minimal length prefixes and an entry key without a value with an error
// wrapping ErrMalformedKey, so that a key it accepts is exactly the one
// AppendKey builds from its result.
func ParseKey(key []byte) (domain string, entries [][2]string, err error) {
	off := 0
	domain, off, err = keyReadString(key, off)
	if err != nil {
		return "", nil, err
	}
	for off < len(key) {
		var k, v string
		if k, off, err = keyReadString(key, off); err != nil {
			return "", nil, err
		}
		if off == len(key) {
			return "", nil, fmt.Errorf("%w: entry key %q has no value", ErrMalformedKey, k)
		}
		if v, off, err = keyReadString(key, off); err != nil {
			return "", nil, err
		}
		entries = append(entries, [2]string{k, v})
	}
	return domain, entries, nil
}

// keyReadString reads one length-prefixed string at off.
func keyReadString(key []byte, off int) (string, int, error) {
	n, w := binary.Uvarint(key[off:])
	switch {
	case w == 0:
		return "", 0, fmt.Errorf("%w: truncated length at byte %d", ErrMalformedKey, off)
	case w < 0:
		return "", 0, fmt.Errorf("%w: length overflows at byte %d", ErrMalformedKey, off)
	case w != keyUvarintLen(n):
		return "", 0, fmt.Errorf("%w: non-minimal length at byte %d", ErrMalformedKey, off)
	}
	off += w
	if n > uint64(len(key)-off) {
		return "", 0, fmt.Errorf("%w: length %d at byte %d exceeds the %d bytes left", ErrMalformedKey, n, off-w, len(key)-off)
	}
	end := off + int(n)
	return string(key[off:end]), end, nil
}

// keyUvarintLen is the number of bytes binary.AppendUvarint writes for v.
func keyUvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
