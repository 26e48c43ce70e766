package membership

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/memberlist"
)

// checkKey reports whether key has an AES key size.
func checkKey(key []byte) error {
	switch len(key) {
	case 16, 24, 32:
		return nil
	}
	return fmt.Errorf("%d bytes (want 16, 24 or 32)", len(key))
}

// checkKeys checks a keyring: at least one key, each of an AES size. Its
// errors start with the index ("[1]: 5 bytes ...") for the caller to
// prefix with the field's name.
func checkKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New(": no keys")
	}
	for i, k := range keys {
		if err := checkKey(k); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return nil
}

// newKeyring returns a memberlist keyring holding copies of keys (checked
// by checkKeys), keys[0] primary.
func newKeyring(keys [][]byte) *memberlist.Keyring {
	kr, _ := memberlist.NewKeyring(nil, slices.Clone(keys[0])) // cannot fail on a checked key
	for _, k := range keys[1:] {
		_ = kr.AddKey(slices.Clone(k))
	}
	return kr
}

// KeyFingerprint is a short, stable name for a gossip key that is safe to
// log: the first 8 hex digits of the key's SHA-256.
func KeyFingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:4])
}

// KeyFingerprints returns the fingerprints (KeyFingerprint) of the gossip
// keys this node holds: the primary first, then the others in the order
// they were installed; nil when gossip is not encrypted.
func (m *Membership) KeyFingerprints() []string {
	if m.keyring == nil {
		return nil
	}
	keys := m.keyring.GetKeys()
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = KeyFingerprint(k)
	}
	return out
}

// SetKeys replaces the gossip keyring of the running node: keys[0] becomes
// the primary, which encrypts what this node sends, and every key in keys
// decrypts what it receives; keys held before and not in keys are removed.
// Each key must have 16, 24 or 32 bytes; duplicates are ignored. It fails,
// changing nothing, when keys is empty or holds a bad key, or when the node
// was started without keys (gossip unencrypted).
//
// A rotation without a split sets, on every node in turn, [old, new], then
// [new, old], then [new]: at every step each node can decrypt what every
// other sends.
//
// SetKeys calls may not overlap (the caller serialises them); gossip goes
// on meanwhile.
func (m *Membership) SetKeys(keys [][]byte) error {
	if m.keyring == nil {
		return errors.New("membership: SetKeys: gossip was started without a key and stays unencrypted")
	}
	if err := checkKeys(keys); err != nil {
		return fmt.Errorf("membership: SetKeys: keys%w", err)
	}
	var want [][]byte
	held := func(k []byte) bool {
		return slices.ContainsFunc(want, func(w []byte) bool { return bytes.Equal(w, k) })
	}
	for _, k := range keys {
		if !held(k) {
			want = append(want, slices.Clone(k))
		}
	}
	kr := m.keyring
	for _, k := range want {
		if err := kr.AddKey(k); err != nil { // not reached: checked above
			return fmt.Errorf("membership: SetKeys: %w", err)
		}
	}
	// memberlist reads the key slice without its lock while decrypting,
	// and Keyring.RemoveKey shifts the keys after the removed one in that
	// slice. So removals take only the last key, which shifts nothing:
	// when a key to remove is not behind every key to keep, the kept keys
	// are brought to the front first (UseKey moves a key to the front and
	// builds a new slice), the primary last. While they move, for the
	// few microseconds of those calls, what this node sends is encrypted
	// with whichever of them is in front, which a peer that lacks it drops
	// as undecryptable: a key to remove that is followed by a key to keep
	// only arises outside the three rotation steps (which remove only the
	// last key), and gossip resends what is lost.
	cur := kr.GetKeys()
	if tail := slices.IndexFunc(cur, func(k []byte) bool { return !held(k) }); tail >= 0 &&
		slices.ContainsFunc(cur[tail:], held) {
		for _, k := range slices.Backward(want) {
			if err := kr.UseKey(k); err != nil {
				return fmt.Errorf("membership: SetKeys: %w", err)
			}
		}
	}
	if err := kr.UseKey(want[0]); err != nil {
		return fmt.Errorf("membership: SetKeys: %w", err)
	}
	for {
		cur := kr.GetKeys()
		last := cur[len(cur)-1]
		if len(cur) == 1 || held(last) {
			break
		}
		if err := kr.RemoveKey(last); err != nil {
			return fmt.Errorf("membership: SetKeys: %w", err)
		}
	}
	return nil
}
