package rls

import (
	"io"
	"net/http"
)

// ConfigHandler serves /rlconfig: the loaded limits, one per line.
func (s *Service) ConfigHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, s.Config().Dump())
	})
}
