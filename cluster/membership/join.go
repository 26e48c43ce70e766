package membership

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// joinLoop joins cfg.Join with capped exponential backoff until the
// first success (or until another node joins us), then re-joins once after
// about a second and every RejoinInterval after that, so that nodes that
// joined together and partitions that healed merge. It returns when
// Leave or Close is called; a join in flight finishes first (memberlist's Join
// is synchronous and bounded by its TCP timeout).
func (m *Membership) joinLoop() {
	defer m.wg.Done()
	backoff := joinBackoffMin
	maxBackoff := min(joinBackoffMax, m.rejoin)
	failures := 0
	for !m.joined.Load() {
		if err := m.joinOnce(); err == nil {
			break
		}
		failures++
		if failures == 1 {
			m.logger.Warn("membership: join failed, retrying in the background", "join", m.join, "err", m.JoinError())
		} else {
			m.logger.Debug("membership: join failed", "attempt", failures, "err", m.JoinError())
		}
		// Full backoff plus up to 50% jitter, so restarted pods do not
		// retry in lockstep.
		wait := backoff + rand.N(backoff/2+1)
		if !m.sleep(wait) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
	if failures > 0 {
		m.logger.Info("membership: joined after retrying", "failed_attempts", failures)
	}

	// The first re-join comes soon: nodes that joined the same seed at the
	// same moment may have missed each other's gossip (the seed merges them
	// one by one), and a push/pull with the seed settles that.
	next := m.clock.NewTimer(min(m.rejoin, followUpJoin))
	defer next.Stop()
	dead := m.clock.NewTicker(deadRetry)
	defer dead.Stop()
	failing := false
	for {
		select {
		case <-m.joinStop:
			return
		case <-dead.C():
			// In the background: a Join to an address nobody answers
			// (a crashed pod's old IP) waits for memberlist's TCP timeout.
			addrs := m.deadAddrs(m.clock.Now())
			if len(addrs) > 0 && m.contacting.CompareAndSwap(false, true) {
				m.wg.Add(1)
				go func() {
					defer m.wg.Done()
					defer m.contacting.Store(false)
					m.contactDead(addrs)
				}()
			}
			continue
		case <-next.C():
		}
		err := m.joinOnce()
		switch {
		case err != nil && !failing:
			m.logger.Warn("membership: periodic re-join reached no node", "join", m.join, "err", err)
		case err != nil:
			m.logger.Debug("membership: periodic re-join reached no node", "err", err)
		case failing:
			m.logger.Info("membership: periodic re-join reached a node again")
		}
		failing = err != nil
		next.Reset(m.rejoin)
	}
}

// deadAddrs returns the gossip addresses of the members that failed
// (not left) less than forgetGone before now, except those whose
// address or ID is alive again (a restarted pod, maybe at a new address).
func (m *Membership) deadAddrs(now time.Time) []string {
	var addrs []string
	aliveAddrs, aliveIDs := map[string]bool{}, map[string]bool{}
	m.mu.Lock()
	for _, n := range m.nodes {
		if n.member.State == MemberAlive {
			aliveAddrs[n.member.Addr], aliveIDs[n.member.ID] = true, true
		}
	}
	for _, n := range m.nodes {
		mb := n.member
		if mb.State == MemberDead && now.Sub(n.since) < forgetGone && !aliveAddrs[mb.Addr] && !aliveIDs[mb.ID] {
			addrs = append(addrs, mb.Addr)
		}
	}
	m.mu.Unlock()
	return addrs
}

// contactDead joins, one at a time, the addresses of members thought
// dead (deadAddrs): one that was cut off by a partition rather than
// dead merges back as soon as it can be reached. memberlist alone does not
// re-merge after a long split, and the periodic re-join comes only every
// RejoinInterval. Nothing is contacted once joining stops; a Join to an
// address that does not answer still takes memberlist's TCP timeout, which
// Leave and Close then wait for.
func (m *Membership) contactDead(addrs []string) {
	for _, a := range addrs {
		select {
		case <-m.joinStop:
			return
		default:
		}
		n, err := m.joinAddrs([]string{a})
		if n > 0 {
			m.logger.Info("membership: reached a member thought dead", "addr", a)
			return // one merge brings in the rest of its side
		}
		m.logger.Debug("membership: member thought dead is still unreachable", "addr", a, "err", err)
	}
}

// sleep waits d or until joining stops; it reports whether to go on.
func (m *Membership) sleep(d time.Duration) bool {
	t := m.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.joinStop:
		return false
	case <-t.C():
		return true
	}
}

// joinOnce contacts every Join address once and records the outcome.
func (m *Membership) joinOnce() error {
	select {
	case <-m.joinStop:
		return errors.New("membership: join: stopped")
	default:
	}
	n, err := m.joinSeeds()
	if n > 0 {
		err = nil
		m.joined.Store(true)
	} else if err == nil {
		err = errors.New("no address to contact")
	}
	if err != nil {
		err = fmt.Errorf("membership: join %v: %w", m.join, oneLine{err})
	}
	m.mu.Lock()
	m.joinErr = err
	m.mu.Unlock()
	return err
}

func (m *Membership) joinSeeds() (n int, err error) {
	return m.joinAddrs(m.join)
}

// joinAddrs is memberlist's Join, with its panics turned into errors.
func (m *Membership) joinAddrs(addrs []string) (n int, err error) {
	defer recoverPanic(&err)
	return m.ml.Join(addrs)
}

// oneLine prints memberlist's multi-line join error (a go-multierror
// list) on one line, "; "-separated, and unwraps to it.
type oneLine struct{ err error }

func (e oneLine) Unwrap() error { return e.err }

func (e oneLine) Error() string {
	if l, ok := e.err.(interface{ WrappedErrors() []error }); ok {
		parts := make([]string, 0, len(l.WrappedErrors()))
		for _, x := range l.WrappedErrors() {
			parts = append(parts, x.Error())
		}
		if len(parts) > 0 {
			return strings.Join(parts, "; ")
		}
	}
	return e.err.Error()
}
