// Package promreg registers Prometheus collectors all or nothing, for the
// cluster packages that each register their own metrics. It keeps no state:
// RegisterAll is as safe for concurrent use as the Registerer it is given.
package promreg

import "github.com/prometheus/client_golang/prometheus"

// RegisterAll registers every collector on reg, or, when one fails, none
// of them: those registered before it are unregistered again, so that the
// caller can be retried on the same registry.
func RegisterAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}
