package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// mshipJoinLoop joins cfg.Join with capped exponential backoff until the
// first success (or until another node joins us), then re-joins once after
// about a second and every RejoinInterval after that, so that nodes that
// joined together and partitions that healed merge. It returns when
// Leave or Close is called; a join in flight finishes first (memberlist's Join
// is synchronous and bounded by its TCP timeout).
func (m *Membership) mshipJoinLoop() {
	defer m.wg.Done()
	backoff := mshipJoinBackoffMin
	maxBackoff := min(mshipJoinBackoffMax, m.rejoin)
	failures := 0
	for !m.joined.Load() {
		if err := m.mshipJoinOnce(); err == nil {
			break
		}
		failures++
		if failures == 1 {
			m.logger.Warn("cluster: join failed, retrying in the background", "join", m.join, "err", m.JoinError())
		} else {
			m.logger.Debug("cluster: join failed", "attempt", failures, "err", m.JoinError())
		}
		// Full backoff plus up to 50% jitter, so restarted pods do not
		// retry in lockstep.
		wait := backoff + rand.N(backoff/2+1)
		if !m.mshipSleep(wait) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
	if failures > 0 {
		m.logger.Info("cluster: joined after retrying", "failed_attempts", failures)
	}

	// The first re-join comes soon: nodes that joined the same seed at the
	// same moment may have missed each other's gossip (the seed merges them
	// one by one), and a push/pull with the seed settles that.
	next := time.NewTimer(min(m.rejoin, mshipFollowUpJoin))
	defer next.Stop()
	dead := time.NewTicker(mshipDeadRetry)
	defer dead.Stop()
	failing := false
	for {
		select {
		case <-m.joinStop:
			return
		case <-dead.C:
			// In the background: a Join to an address nobody answers
			// (a crashed pod's old IP) waits for memberlist's TCP timeout.
			addrs := m.mshipDeadAddrs(time.Now())
			if len(addrs) > 0 && m.contacting.CompareAndSwap(false, true) {
				m.wg.Add(1)
				go func() {
					defer m.wg.Done()
					defer m.contacting.Store(false)
					m.mshipContactDead(addrs)
				}()
			}
			continue
		case <-next.C:
		}
		err := m.mshipJoinOnce()
		switch {
		case err != nil && !failing:
			m.logger.Warn("cluster: periodic re-join reached no node", "join", m.join, "err", err)
		case err != nil:
			m.logger.Debug("cluster: periodic re-join reached no node", "err", err)
		case failing:
			m.logger.Info("cluster: periodic re-join reached a node again")
		}
		failing = err != nil
		next.Reset(m.rejoin)
	}
}

// mshipDeadAddrs returns the gossip addresses of the members that failed
// (not left) less than mshipForgetGone before now, except those whose
// address or ID is alive again (a restarted pod, maybe at a new address).
func (m *Membership) mshipDeadAddrs(now time.Time) []string {
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
		if mb.State == MemberDead && now.Sub(n.since) < mshipForgetGone && !aliveAddrs[mb.Addr] && !aliveIDs[mb.ID] {
			addrs = append(addrs, mb.Addr)
		}
	}
	m.mu.Unlock()
	return addrs
}

// mshipContactDead joins, one at a time, the addresses of members thought
// dead (mshipDeadAddrs): one that was cut off by a partition rather than
// dead merges back as soon as it can be reached. memberlist alone does not
// re-merge after a long split, and the periodic re-join comes only every
// RejoinInterval. Nothing is contacted once joining stops; a Join to an
// address that does not answer still takes memberlist's TCP timeout, which
// Leave and Close then wait for.
func (m *Membership) mshipContactDead(addrs []string) {
	for _, a := range addrs {
		select {
		case <-m.joinStop:
			return
		default:
		}
		n, err := m.mshipJoinAddrs([]string{a})
		if n > 0 {
			m.logger.Info("cluster: reached a member thought dead", "addr", a)
			return // one merge brings in the rest of its side
		}
		m.logger.Debug("cluster: member thought dead is still unreachable", "addr", a, "err", err)
	}
}

// mshipSleep waits d or until joining stops; it reports whether to go on.
func (m *Membership) mshipSleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.joinStop:
		return false
	case <-t.C:
		return true
	}
}

// mshipJoinOnce contacts every Join address once and records the outcome.
func (m *Membership) mshipJoinOnce() error {
	select {
	case <-m.joinStop:
		return errors.New("cluster: join: stopped")
	default:
	}
	n, err := m.mshipJoin()
	if n > 0 {
		err = nil
		m.joined.Store(true)
	} else if err == nil {
		err = errors.New("no address to contact")
	}
	if err != nil {
		err = fmt.Errorf("cluster: join %v: %w", m.join, mshipOneLine{err})
	}
	m.mu.Lock()
	m.joinErr = err
	m.mu.Unlock()
	return err
}

func (m *Membership) mshipJoin() (n int, err error) {
	return m.mshipJoinAddrs(m.join)
}

// mshipJoinAddrs is memberlist's Join, with its panics turned into errors.
func (m *Membership) mshipJoinAddrs(addrs []string) (n int, err error) {
	defer mshipRecover(&err)
	return m.ml.Join(addrs)
}

// mshipOneLine prints memberlist's multi-line join error (a go-multierror
// list) on one line, "; "-separated, and unwraps to it.
type mshipOneLine struct{ err error }

func (e mshipOneLine) Unwrap() error { return e.err }

func (e mshipOneLine) Error() string {
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
