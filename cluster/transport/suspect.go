package transport

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster/peerpb"
)

// A peer that fails to answer in time becomes suspect: Apply decides its
// keys locally at once instead of waiting for it. The peer's probe goroutine
// pings it every probeInterval and clears the suspicion as soon as it
// answers, or when SuspectFor has passed (the next failure makes it suspect
// again) while its connection is not failing: a peer whose connection is
// refused stays suspect until a probe answers. SetPeers with a new address
// replaces the client, suspicion and all.

// peerSuspectAfter is how many failures in a row (timeouts or errors with
// no answer between them) make a peer suspect. One slow answer on a busy
// machine is not a dead peer; a refused connection is (see noteFailure).
const peerSuspectAfter = 3

// peerQuietFor is how long a peer must also have given no waiter an answer
// in time before timeouts make it suspect. On a saturated machine a batch
// that carries many callers' ops can make all of them late at once, while
// the next batches answer in time: that peer is busy, not gone, and routing
// around it would cost exactness for nothing. A frozen or dead peer answers
// nobody, and is suspect after this long.
const peerQuietFor = 100 * time.Millisecond

// noteFailure counts a failed or late answer and makes p suspect after
// peerSuspectAfter of them in a row, or at once when the connection itself
// is refused or broken (codes.Unavailable): a crashed peer costs one
// timeout, not three. Timeouts count only once p has answered no waiter in
// time for peerQuietFor. Failures during the grace that follows a freeze of
// this process are ignored (see Forwarder.Forgive).
func (p *peerClient) noteFailure(reason string, err error) {
	now := p.f.mono()
	if now < p.f.graceUntil.Load() {
		return // this process was frozen: the failure is its own
	}
	if t := p.onTime.Load(); reason == "timeout" && t != 0 && time.Duration(now-t) < peerQuietFor {
		return // late now, but it answered others in time just before
	}
	n := p.fails.Add(1)
	if n >= peerSuspectAfter || status.Code(err) == codes.Unavailable {
		p.markSuspect(reason, err)
	}
}

// markSuspect makes p suspect, if it is not already, and wakes its probe.
func (p *peerClient) markSuspect(reason string, err error) {
	if !p.suspect.CompareAndSwap(false, true) {
		return
	}
	p.suspectSince.Store(p.f.mono())
	p.f.log.Warn("transport: peer suspect", "peer", p.id, "addr", p.addr, "reason", reason, "err", err)
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// clearSuspect ends p's suspicion.
func (p *peerClient) clearSuspect(why string) {
	if p.suspect.CompareAndSwap(true, false) {
		p.f.log.Info("transport: peer no longer suspect", "peer", p.id, "addr", p.addr, "why", why)
	}
}

// probeLoop sleeps until p becomes suspect, then pings it every
// probeInterval until the suspicion ends. It returns when p closes.
func (p *peerClient) probeLoop() {
	defer p.wg.Done()
	t := p.f.clock.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-p.wake:
		case <-p.done:
			return
		}
		for p.suspect.Load() {
			t.Reset(p.f.probeInterval)
			select {
			case <-t.C():
			case <-p.done:
				return
			}
			switch err := p.ping(); {
			case err == nil:
				p.clearSuspect("probe answered")
			case p.conn.GetState() == connectivity.TransientFailure:
				// Its connection is refused or broken (a crashed process, a
				// lost machine that sent a reset): trying it again would only
				// decide another batch here. It stays suspect until a probe
				// answers or the ring drops it.
			case time.Duration(p.f.mono()-p.suspectSince.Load()) >= p.f.suspectFor:
				p.clearSuspect("suspicion expired")
			}
		}
	}
}

// ping checks that the node answering at p.addr is p.id.
func (p *peerClient) ping() error {
	ctx, cancel := context.WithTimeout(p.ctx, p.f.probeTimeout)
	defer cancel()
	resp, err := p.client.Ping(ctx, &peerpb.PingRequest{From: p.f.self}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if resp.GetId() != p.id {
		return fmt.Errorf("transport: %s answers as %q, want %q", p.addr, resp.GetId(), p.id)
	}
	return nil
}
