package membership

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/cluster/clock"
)

// logWriter is the io.Writer behind the *log.Logger handed to
// memberlist. Each line memberlist prints ("[WARN] memberlist: ...") becomes
// one debug-level record; memberlist's own level goes into the
// "memberlist_level" attribute. The exception is gossip this node cannot
// decrypt, which means a node sending with a key this node does not hold
// (or with none) is trying to talk to it: that is logged at warn level, at most once per
// keyWarnEvery (on clock), since memberlist reports it for every packet.
type logWriter struct {
	l          *slog.Logger
	clock      clock.Clock
	lastKeyErr *atomic.Int64 // Unix ns of the last key warning
}

// keyWarnEvery spaces out the warnings about undecryptable gossip.
const keyWarnEvery = 10 * time.Second

func newLogWriter(l *slog.Logger, c clock.Clock) logWriter {
	return logWriter{l: l, clock: c, lastKeyErr: new(atomic.Int64)}
}

func (w logWriter) Write(p []byte) (int, error) {
	ctx := context.Background()
	if strings.Contains(strings.ToLower(string(p)), "decrypt") && w.l.Enabled(ctx, slog.LevelWarn) {
		now, last := w.clock.Now().UnixNano(), w.lastKeyErr.Load()
		if now-last >= int64(keyWarnEvery) && w.lastKeyErr.CompareAndSwap(last, now) {
			w.l.Warn("membership: gossip that this node cannot decrypt: a node whose primary gossip key this node does not hold (another --gossip-key-file, none, or a key rotation step taken before every node had the previous one) is trying to talk to it; its gossip is dropped",
				"memberlist", strings.TrimSpace(string(p)))
		}
	}
	if !w.l.Enabled(ctx, slog.LevelDebug) {
		return len(p), nil
	}
	line := strings.TrimRight(string(p), "\r\n")
	level := ""
	if strings.HasPrefix(line, "[") {
		if i := strings.IndexByte(line, ']'); i > 0 {
			level, line = line[1:i], strings.TrimSpace(line[i+1:])
		}
	}
	w.l.Log(ctx, slog.LevelDebug, line, "memberlist_level", level)
	return len(p), nil
}
