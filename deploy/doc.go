// Package deploy holds ringlimit's deployment kit, as files a platform team
// applies: Kubernetes manifests (kubernetes/, a kustomize base, an example
// overlay and an optional monitoring component), the Grafana dashboard and
// alerting rules (monitoring/), a standalone Envoy
// bootstrap (envoy/), Istio EnvoyFilters (istio/), an Emissary
// RateLimitService (emissary/) and a Contour ExtensionService (contour/).
//
// The package has no Go API. Its tests prove the kit valid without a
// cluster: every manifest decodes strictly into the Kubernetes API types,
// the objects agree with each other and with the Dockerfile, every flag in
// the StatefulSet is accepted by the real `ringlimit serve` parser, the
// Envoy configuration decodes into go-control-plane's types, and three local
// processes started exactly as the StatefulSet starts its pods form one
// cluster.
package deploy
