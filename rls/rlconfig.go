package rls

import (
	"fmt"
	"io"
	"net/http"
)

// ConfigHandler serves /rlconfig: the loaded limits, one per line, after a
// line "# xds version_info: V" when the config came over xDS.
func (s *Service) ConfigHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		cfg := s.Config()
		if v := cfg.Version(); v != "" {
			fmt.Fprintf(w, "# xds version_info: %s\n", v)
		}
		io.WriteString(w, cfg.Dump())
	})
}
