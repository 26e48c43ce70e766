// Package deploy holds ringlimit's deployment kit, as files a platform team
// applies: Kubernetes manifests (kubernetes/, a kustomize base, an example
// overlay and an optional monitoring component), the Grafana dashboard and
// alerting rules (monitoring/), a standalone Envoy
// bootstrap (envoy/), Istio EnvoyFilters (istio/), an Emissary
// RateLimitService (emissary/), a Contour ExtensionService (contour/), and
// Envoy Gateway's configuration for running its rate limit Deployment on
// ringlimit (envoy-gateway/).
//
// The package has no Go API. Its tests prove the kit valid without a
// cluster: every manifest decodes strictly into the Kubernetes API types,
// the objects agree with each other and with the Dockerfile, every flag in
// the StatefulSet is accepted by the real `ringlimit serve` parser, the
// Envoy configuration decodes into go-control-plane's types, Envoy Gateway's
// and the Gateway API's resources match their CRDs' schemas (vendored under
// testdata/), the pod Envoy Gateway would run is accepted by `ringlimit
// serve`, and three local processes started exactly as the StatefulSet
// starts its pods form one cluster.
package deploy
