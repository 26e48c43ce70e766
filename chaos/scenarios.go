package chaos

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// scenario runs script on a fresh run and always finishes it, so that a
// step that fails still leaves its numbers and stops every process.
func (s *Suite) scenario(name, dir string, n int, place func(*Cluster) (*Node, error), script func(r *run) error) *Result {
	r, err := s.newRun(name, dir, n, place)
	if err != nil {
		return &Result{Name: name, Failures: []string{"setup: " + err.Error()}}
	}
	if err := r.startLoad(); err != nil {
		r.failf("prime: %v", err)
		return r.finish()
	}
	if err := script(r); err != nil {
		r.failf("%v", err)
	}
	return r.finish()
}

// killRestartRoll SIGKILLs one of three nodes while the fleet keeps hitting
// the two survivors, restarts it with the same identity, then rolls a
// graceful restart through all three. Each fault strikes fresh keys used to
// primeFraction of their limit, which the load then exhausts. Total allowed
// must stay within the tolerance of keys x limit, no key may go far over
// its limit, and not one call may fail.
func (s *Suite) killRestartRoll(dir string) *Result {
	name := "kill-restart-roll"
	if s.P.Algorithm != "" {
		name += "-" + s.P.Algorithm
	}
	return s.scenario(name, dir, 3, nil, func(r *run) error {
		p := s.P
		all := append([]*Node(nil), r.c.Nodes...)
		victim, survivors := all[2], all[:2]

		r.phase("kill", victim)
		if err := r.load.SetTargets(survivors); err != nil {
			return err
		}
		if err := r.load.Drain(victim, 5*time.Second); err != nil {
			return err
		}
		t0 := time.Now()
		if err := victim.Kill(); err != nil {
			return err
		}
		d, err := r.waitRing(t0, 30*time.Second, survivors, survivors)
		if err != nil {
			return fmt.Errorf("after SIGKILL: %w", err)
		}
		r.recovered("kill", "survivors' ring without it after", d)
		r.hold(p.Hold)

		if err := r.freshKeys(); err != nil {
			return err
		}
		r.phase("restart")
		if err := r.restart(victim, all); err != nil {
			return err
		}
		r.hold(p.Hold)

		r.phase("rolling")
		var worst time.Duration
		for _, n := range all {
			if err := r.freshKeys(); err != nil {
				return err
			}
			if err := r.stopNode(n, without(all, n), false); err != nil {
				return err
			}
			if err := r.restart(n, all); err != nil {
				return err
			}
			worst = max(worst, r.recov["restart:"+n.ID])
			r.hold(p.Hold / 2)
		}
		r.recovered("rolling", "slowest rejoin", worst)
		return nil
	})
}

// restart starts n again with the same identity and addresses, waits until
// every node's ring holds all, checks the rejoin time and sends load to all.
func (r *run) restart(n *Node, all []*Node) error {
	t0 := time.Now()
	if err := r.c.Start(n); err != nil {
		return err
	}
	if err := n.WaitReady(30 * time.Second); err != nil {
		return err
	}
	d, err := r.waitRing(t0, 30*time.Second, all, all)
	if err != nil {
		return fmt.Errorf("after restarting %s: %w", n.ID, err)
	}
	r.recov["restart:"+n.ID] = d
	if _, ok := r.recov["restart"]; !ok {
		r.recovered("restart", "rejoined every ring after", d)
	}
	if d > r.s.P.RejoinBound {
		r.failf("%s rejoined every ring after %v, over the %v bound", n.ID, d.Round(time.Millisecond), r.s.P.RejoinBound)
	}
	return r.load.SetTargets(all)
}

// freezeOwner SIGSTOPs one owner for Freeze while the fleet keeps sending
// to every node (Envoys cannot tell a frozen host), then SIGCONTs it. Calls
// to survivors must not fail and their p99 after the first suspect marking
// must stay under the bound; overshoot within the tolerance.
func (s *Suite) freezeOwner(dir string) *Result {
	return s.scenario("freeze-owner", dir, 3, nil, func(r *run) error {
		p := s.P
		all := append([]*Node(nil), r.c.Nodes...)
		victim, survivors := all[1], []*Node{all[0], all[2]}

		// Start from a calm cluster: no survivor suspects the victim yet.
		err := poll(10*time.Second, func() (bool, string) {
			for _, n := range survivors {
				if n.suspects(victim.ID) {
					return false, n.ID + " still suspects " + victim.ID
				}
			}
			return true, ""
		})
		if err != nil {
			// A busy machine: go on, the first marking is then at once.
			r.notef("no calm before the freeze: %v", err)
		}
		if err := r.freshKeys(); err != nil {
			return err
		}
		r.phase("freeze", victim)
		w := watchSuspect(r.load, survivors, victim.ID)
		if err := victim.Freeze(); err != nil {
			w.stop()
			return err
		}
		r.hold(p.Freeze)
		thawErr := victim.Thaw()
		first, seen := w.stop()
		if thawErr != nil {
			return thawErr
		}
		r.phase("thawed")
		thawAt := r.load.Now()
		if seen {
			r.load.MarkAt("suspected", first)
			r.faulty["suspected"] = map[string]bool{victim.ID: true}
			r.notef("first suspect marking %v after SIGSTOP", (first - r.markAt("freeze")).Round(time.Millisecond))
		} else {
			// Survivors forward the fresh keys' ops to the frozen owner; their
			// timeouts must mark it, or nothing routes around it.
			r.failf("no survivor marked %s suspect during the %v freeze", victim.ID, p.Freeze)
		}
		t0 := time.Now()
		err = poll(30*time.Second, func() (bool, string) {
			return r.load.AnsweredSince(victim, thawAt), victim.ID + " answers no call in time"
		})
		if err != nil {
			return fmt.Errorf("after SIGCONT: %w", err)
		}
		if _, err := r.waitRing(t0, 30*time.Second, all, all); err != nil {
			return fmt.Errorf("after SIGCONT: %w", err)
		}
		r.recovered("thawed", "answering in time and in every ring after", time.Since(t0))
		r.hold(p.Hold)
		r.after = append(r.after, func(rec *Record, _ Counts) {
			ph := "suspected"
			if !seen {
				ph = "freeze"
			}
			from, to, _ := rec.Phase(ph)
			st := Summarise(r.survivorCalls(rec, from, to))
			if st.P99 > p.P99Bound {
				r.failf("p99 of survivors while %s was frozen: %v, over the %v bound", victim.ID, st.P99.Round(time.Microsecond), p.P99Bound)
			}
		})
		return nil
	})
}

// markAt is when the phase named name began, on the load's clock.
func (r *run) markAt(name string) time.Duration {
	r.load.mu.Lock()
	defer r.load.mu.Unlock()
	for _, m := range r.load.marks {
		if m.Name == name {
			return m.At
		}
	}
	return 0
}

// scaleOutIn adds a fourth node that joins through the others, then
// retires one of the first three with SIGTERM. Counts must survive both
// ring changes within the tolerance.
func (s *Suite) scaleOutIn(dir string) *Result {
	return s.scenario("scale-out-in", dir, 3, nil, func(r *run) error {
		p := s.P
		r.phase("scale-out")
		n, err := r.addNode(nil)
		if err != nil {
			return err
		}
		all := append([]*Node(nil), r.c.Nodes...)
		t0 := time.Now()
		if err := r.c.Start(n); err != nil {
			return err
		}
		if err := n.WaitReady(30 * time.Second); err != nil {
			return err
		}
		d, err := r.waitRing(t0, 30*time.Second, all, all)
		if err != nil {
			return fmt.Errorf("scale-out: %w", err)
		}
		r.recovered("scale-out", "in every ring after", d)
		if err := r.load.SetTargets(all); err != nil {
			return err
		}
		r.hold(p.Hold)

		if err := r.freshKeys(); err != nil {
			return err
		}
		r.phase("scale-in")
		gone, rest := all[0], all[1:]
		t0 = time.Now()
		if err := r.stopNode(gone, rest, true); err != nil {
			return err
		}
		d, err = r.waitRing(t0, 30*time.Second, rest, rest)
		if err != nil {
			return fmt.Errorf("scale-in: %w", err)
		}
		r.recovered("scale-in", "off every ring after", d)
		r.hold(p.Hold)
		return nil
	})
}

// partition cuts one node of three off the cluster network for Partition
// (network namespaces; the fleet still reaches every node), then heals.
// Both sides must keep answering; each key may be allowed its limit at
// most once more during the split; the cluster must re-merge within the
// bound, and overshoot must stop once it has.
func (s *Suite) partition(dir string) *Result {
	if why := NetnsUnavailable(); why != "" {
		return &Result{Name: "partition", Skipped: why}
	}
	x, err := NewNetns(3)
	if err != nil {
		return &Result{Name: "partition", Failures: []string{"netns: " + err.Error()}}
	}
	defer func() {
		if err := x.Close(); err != nil {
			s.logf("partition: netns cleanup: %v", err)
		}
	}()
	return s.scenario("partition", dir, 3, x.Place, func(r *run) error {
		p := s.P
		all := append([]*Node(nil), r.c.Nodes...)
		victim, majority := all[2], all[:2]

		r.phase("split")
		if err := x.Isolate(2); err != nil {
			return err
		}
		t0 := time.Now()
		var dropped, alone time.Duration
		for end := t0.Add(p.Partition); time.Now().Before(end); {
			if dropped == 0 && ringOf(majority[0]) == ids(majority) && ringOf(majority[1]) == ids(majority) {
				dropped = time.Since(t0)
			}
			if alone == 0 && ringOf(victim) == victim.ID {
				alone = time.Since(t0)
			}
			r.hold(min(250*time.Millisecond, time.Until(end))) // the split's timeline, polling the rings
		}
		describe := func(d time.Duration) string {
			if d == 0 {
				return fmt.Sprintf("not within the %v split", p.Partition)
			}
			return "after " + d.Round(100*time.Millisecond).String()
		}
		r.notef("during the split the majority dropped %s %s; %s was alone %s", victim.ID, describe(dropped), victim.ID, describe(alone))
		if err := x.Heal(2); err != nil {
			return err
		}
		r.phase("healed")
		t0 = time.Now()
		d, err := r.waitRing(t0, max(60*time.Second, p.MergeBound), all, all)
		if err != nil {
			return fmt.Errorf("after the heal: %w", err)
		}
		r.recovered("healed", "re-merged after", d)
		if d > p.MergeBound {
			r.failf("re-merged %v after the heal, over the %v bound", d.Round(time.Millisecond), p.MergeBound)
		}
		r.phase("merged")
		r.hold(p.Hold)
		r.after = append(r.after, func(rec *Record, counts Counts) { r.checkSplit(rec, counts, victim) })
		return nil
	})
}

// checkSplit checks the partition's bounds: both sides answered at least
// SplitAnswered of their calls in time during the split; no key was allowed more than its limit once more from the split
// until the re-merge; and the overshoot after the re-merge stays within
// the tolerance.
func (r *run) checkSplit(rec *Record, counts Counts, victim *Node) {
	p := r.s.P
	from, _, _ := rec.Phase("split")
	_, to, _ := rec.Phase("healed")
	for _, side := range []struct {
		name string
		keep func(string) bool
	}{
		{"the isolated node", func(id string) bool { return id == victim.ID }},
		{"the majority", func(id string) bool { return id != victim.ID }},
	} {
		st := Summarise(rec.Span(from, to, side.keep))
		if in := st.OK + st.Over; st.Calls == 0 || float64(in) < p.SplitAnswered*float64(st.Calls) {
			r.failf("%s answered %d of %d calls in time during the split (%d late, %d failed), fewer than %.0f%%", side.name, in, st.Calls, st.Late, st.Failed, 100*p.SplitAnswered)
		}
	}
	type kv struct {
		k     [2]int64
		extra int
	}
	var worst []kv
	// Each side may allow the limit once more, plus what any membership
	// change may cost (maxKeyExtra): until the majority holds the cut-off
	// owner suspect, each of its entry nodes decides that owner's keys on
	// its own counter.
	for k, e := range rec.PerKeyExtra(p.Limit, from, to) {
		if e > p.Limit+maxKeyExtra(p.Limit) {
			worst = append(worst, kv{k, e})
		}
	}
	if len(worst) > 0 {
		sort.Slice(worst, func(i, j int) bool { return worst[i].extra > worst[j].extra })
		r.failf("%d keys were allowed more than their limit once more during the split (worst: key-%d %d extra)", len(worst), worst[0].k[0], worst[0].extra)
	}
	if e := pct(counts.Extra["merged"], counts.Budget()); e > 100*p.Tolerance {
		r.failf("overshoot went on after the re-merge: %d extra (%.1f%%)", counts.Extra["merged"], e)
	}
}

// suspectWatch polls survivors until one of them marks id suspect (or
// drops it), recording the first time on the load's clock.
type suspectWatch struct {
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	first time.Duration
	seen  bool
}

func watchSuspect(l *Load, survivors []*Node, id string) *suspectWatch {
	w := &suspectWatch{done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			for _, n := range survivors {
				if n.suspects(id) {
					w.mu.Lock()
					w.first, w.seen = l.Now(), true
					w.mu.Unlock()
					return
				}
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop ends the watch and returns the first marking, if any.
func (w *suspectWatch) stop() (time.Duration, bool) {
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first, w.seen
}
