package rls

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// matchNode is one descriptor of the config tree (or a domain's root).
type matchNode struct {
	rule *Rule                // nil: no rate_limit at this node
	next map[string]*matchKey // children by descriptor key; nil for a leaf
	// share is the descriptor's value pattern when it has share_threshold:
	// counter keys carry it in place of the request's value.
	share string
}

// matchKey holds a level's descriptors that share one key.
type matchKey struct {
	exact map[string]*matchNode // by value, for every descriptor with a value
	globs []matchGlob           // values containing '*', in config order
	bare  *matchNode            // the descriptor with the key and no value
}

// matchGlob is a value pattern: '*' matches any run of bytes, possibly empty.
type matchGlob struct {
	parts []string // the pattern split at '*'; len >= 2
	node  *matchNode
}

// Match returns the rule for a request descriptor's entries, or nil when it
// has no limit. It walks one level per entry, trying at each level the exact
// key and value, then the key's value patterns containing '*' in config
// order, then the key without a value. The rule is the rate_limit of the node
// the last entry reaches: a request shorter or deeper than the config, or
// ending on a node without rate_limit, gets nil. A nil Domain (unknown
// domain) and an empty entry list also give nil. Match allocates nothing and
// is safe for concurrent use.
func (d *Domain) Match(entries []*rlv3.RateLimitDescriptor_Entry) *Rule {
	if d == nil || len(entries) == 0 {
		return nil
	}
	n := &d.root
	for _, e := range entries {
		k := n.next[e.GetKey()]
		if k == nil {
			return nil
		}
		if n = k.find(e.GetValue()); n == nil {
			return nil
		}
	}
	return n.rule
}

// AppendKey appends the counter key of a request descriptor whose rule is
// r (as Match returned it for entries) to dst, like the package's AppendKey,
// except that a value longer than maxValue bytes is replaced by its SHA-256
// and, when r.SharedCounter, each level matched by a share_threshold
// pattern contributes the pattern instead of the request's value. For a
// sliding_window or token_bucket rule the key ends with one more part, the
// algorithm and the unit (see keyTagKey), so that changing either starts a
// new counter. It allocates nothing when dst has the capacity.
func (d *Domain) AppendKey(dst []byte, domain string, entries []*rlv3.RateLimitDescriptor_Entry, r *Rule, maxValue int) []byte {
	if d == nil || r == nil || !r.SharedCounter {
		dst = appendKeyMax(dst, domain, entries, maxValue)
	} else {
		dst = d.appendSharedKey(dst, domain, entries, maxValue)
	}
	if r != nil && r.counterTag != "" {
		dst = keyAppendString(dst, keyTagKey)
		dst = keyAppendString(dst, r.counterTag)
	}
	return dst
}

// appendSharedKey is AppendKey for a rule with SharedCounter.
func (d *Domain) appendSharedKey(dst []byte, domain string, entries []*rlv3.RateLimitDescriptor_Entry, maxValue int) []byte {
	dst = keyAppendString(dst, domain)
	n := &d.root
	for _, e := range entries {
		v := e.GetValue()
		if n != nil {
			if k := n.next[e.GetKey()]; k != nil {
				n = k.find(v)
			} else {
				n = nil
			}
		}
		if n != nil && n.share != "" {
			v = n.share
		}
		dst = keyAppendString(dst, e.GetKey())
		dst = keyAppendValue(dst, v, maxValue)
	}
	return dst
}

// find picks the node for one entry value, or nil.
func (k *matchKey) find(value string) *matchNode {
	if n, ok := k.exact[value]; ok {
		return n
	}
	for i := range k.globs {
		if matchGlobParts(k.globs[i].parts, value) {
			return k.globs[i].node
		}
	}
	return k.bare
}

// matchGlobParts reports whether s matches the pattern whose '*'-separated
// parts are given (at least two). The first part must be a prefix, the last a
// suffix, and the middle ones appear in order in between; taking the leftmost
// occurrence of each middle part is optimal, so no backtracking is needed.
func matchGlobParts(parts []string, s string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// child returns the node's matchKey for key, creating it.
func (n *matchNode) child(key string) *matchKey {
	if n.next == nil {
		n.next = make(map[string]*matchKey)
	}
	k := n.next[key]
	if k == nil {
		k = &matchKey{}
		n.next[key] = k
	}
	return k
}

// add attaches a child descriptor node under key and value ("" for none).
// The caller has rejected duplicates.
func (n *matchNode) add(key, value string, c *matchNode) {
	k := n.child(key)
	if value == "" {
		k.bare = c
		return
	}
	if k.exact == nil {
		k.exact = make(map[string]*matchNode)
	}
	k.exact[value] = c
	if strings.Contains(value, "*") {
		k.globs = append(k.globs, matchGlob{parts: strings.Split(value, "*"), node: c})
	}
}
