package bucket

// This file holds how two states of one key combine when replicas merge.

// join returns the counter Merge keeps of two counters of one key, ignoring
// expiry. It is commutative, associative and idempotent for any inputs.
//
// Counters of different algorithms (only seen while a rule's algorithm is
// being changed) are ordered by Algorithm: the higher one wins. Within an
// algorithm:
//   - FixedWindow: the later (Window, Unit) wins; of two counters for the
//     same window, the one with the larger count.
//   - SlidingWindow: the larger Unit wins; with equal units, joinSliding.
//   - TokenBucket: the larger Unit wins; with equal units, the later TAT.
//
// Within one algorithm and unit the result never admits more than either
// input would: a fixed or sliding count never drops, and a later TAT never
// admits more.
func join(a, b counter) counter {
	if a.algo != b.algo {
		if b.algo > a.algo {
			return b
		}
		return a
	}
	switch a.algo {
	case SlidingWindow:
		if a.unit != b.unit {
			return largerUnit(a, b)
		}
		return joinSliding(a, b)
	case TokenBucket:
		if a.unit != b.unit {
			return largerUnit(a, b)
		}
		if b.window > a.window {
			return b
		}
		return a
	}
	// FixedWindow, and by the same rule any unknown algorithm.
	switch {
	case a.laterThan(b):
		return a
	case b.laterThan(a):
		return b
	case b.count > a.count:
		return b
	}
	return a
}

// largerUnit returns the counter with the larger unit (a if equal).
func largerUnit(a, b counter) counter {
	if b.unit > a.unit {
		return b
	}
	return a
}
