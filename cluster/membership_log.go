package cluster

import (
	"context"
	"log/slog"
	"strings"
)

// mshipLogWriter is the io.Writer behind the *log.Logger handed to
// memberlist. Each line memberlist prints ("[WARN] memberlist: ...") becomes
// one debug-level record; memberlist's own level goes into the
// "memberlist_level" attribute.
type mshipLogWriter struct{ l *slog.Logger }

func (w mshipLogWriter) Write(p []byte) (int, error) {
	ctx := context.Background()
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
