package transport

import (
	"github.com/ringlimit/ringlimit/bucket"
)

// Applier decides one op against this node's counters. *bucket.Store
// implements it. It must be safe for concurrent use and must not retain op.
type Applier interface {
	Apply(now int64, op *bucket.Op) bucket.Result
}

// AnswerCache is implemented by a Local that remembers what owners
// answered (a node's recording store): a key decided here instead of at its
// owner (a fallback, or a replica standing in) then continues from at least
// the owner's last answered count rather than from this node's own, which
// may be zero. Without it, an owner answering late under load lets entry nodes
// allow exhausted keys again.
type AnswerCache interface {
	// Remember notes the owner's answer r to op, decided at now.
	Remember(now int64, op *bucket.Op, r bucket.Result)
	// ApplyInstead decides op here, from at least the remembered count.
	ApplyInstead(now int64, op *bucket.Op) bucket.Result
	// OverUntil answers op here when its owner has already said the key
	// is over its limit for the rest of the current window.
	OverUntil(now int64, op *bucket.Op) (bucket.Result, bool)
}

// asAnswerCache returns l as an AnswerCache, or nil when it is not one.
func asAnswerCache(l Applier) AnswerCache {
	ac, _ := l.(AnswerCache)
	return ac
}
