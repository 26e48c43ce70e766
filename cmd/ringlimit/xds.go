package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/rls"
)

// The values of --config-type (CONFIG_TYPE), as the reference spells them.
const (
	configTypeFile = "FILE"
	configTypeXDS  = "GRPC_XDS_SOTW"
)

// xds reports whether the config comes from an xDS server.
func (c *serveConfig) xds() bool { return strings.EqualFold(c.ConfigType, configTypeXDS) }

// validateConfigSource checks --config-type and, for xDS, the --xds-* flags.
func (c *serveConfig) validateConfigSource() []error {
	var errs []error
	switch {
	case strings.EqualFold(c.ConfigType, configTypeFile):
		return nil
	case !c.xds():
		return []error{fmt.Errorf("serve: --config-type: unknown type %q (%s or %s)", c.ConfigType, configTypeFile, configTypeXDS)}
	}
	if c.XDSServer == "" {
		errs = append(errs, errors.New("serve: --xds-server: empty address"))
	}
	if c.XDSNodeID == "" {
		errs = append(errs, errors.New("serve: --xds-node-id: empty"))
	}
	if _, err := splitPairs(c.XDSNodeMetadata, "="); err != nil {
		errs = append(errs, fmt.Errorf("serve: --xds-node-metadata: %w", err))
	}
	if _, err := splitPairs(c.XDSHeaders, ":"); err != nil {
		errs = append(errs, fmt.Errorf("serve: --xds-headers: %w", err))
	}
	if c.XDSConnectRetry <= 0 || c.XDSBackoffInitial <= 0 || c.XDSBackoffMax <= 0 {
		errs = append(errs, errors.New("serve: --xds-connect-retry-interval, --xds-backoff-initial and --xds-backoff-max must be > 0"))
	}
	if c.XDSBackoffFactor < 0 || math.IsNaN(c.XDSBackoffFactor) || math.IsInf(c.XDSBackoffFactor, 0) {
		errs = append(errs, fmt.Errorf("serve: --xds-backoff-factor: %v is not a number >= 0", c.XDSBackoffFactor))
	}
	if c.XDSMaxMessageBytes < 0 {
		errs = append(errs, fmt.Errorf("serve: --xds-max-message-bytes: %d < 0", c.XDSMaxMessageBytes))
	}
	if n := countSet(c.XDSTLSCert, c.XDSTLSKey); n != 0 && n != 2 {
		errs = append(errs, errors.New("serve: --xds-tls-cert and --xds-tls-key go together"))
	}
	if !c.XDSTLS && countSet(c.XDSTLSCert, c.XDSTLSCA, c.XDSTLSSAN) > 0 {
		// The reference ignores them then; a CA given for nothing is a
		// plaintext connection nobody meant.
		errs = append(errs, errors.New("serve: --xds-tls-cert, --xds-tls-ca or --xds-tls-san is set but --xds-tls (CONFIG_GRPC_XDS_SERVER_USE_TLS) is false"))
	}
	return errs
}

// splitPairs parses "k1<sep>v1,k2<sep>v2" (spaces around items trimmed);
// "" is no pair.
func splitPairs(s, sep string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, sep)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key%svalue", item, sep)
		}
		out[k] = v
	}
	return out, nil
}

// xdsDialOption is the transport to the xDS server: plaintext, or TLS
// verified against --xds-tls-ca (the system roots without it) for the name
// --xds-tls-san (the host of --xds-server without it), presenting
// --xds-tls-cert when set (read again when the files change).
func (c *serveConfig) xdsDialOption(log *slog.Logger) (grpc.DialOption, error) {
	if !c.XDSTLS {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.XDSTLSSAN}
	if c.XDSTLSCA != "" {
		pool, err := readCAPool(c.XDSTLSCA)
		if err != nil {
			return nil, fmt.Errorf("serve: --xds-tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if c.XDSTLSCert != "" {
		kp := &keyPairFile{flag: "xds-tls-cert", certPath: c.XDSTLSCert, keyPath: c.XDSTLSKey, log: log}
		if _, err := kp.get(); err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// startXDS subscribes svc to the xDS server: every valid version is applied
// and logged, every rejected one counted and logged by svc.
func startXDS(c *serveConfig, dial grpc.DialOption, svc *rls.Service, reg prometheus.Registerer, log *slog.Logger) (*rls.XDSClient, error) {
	md, _ := splitPairs(c.XDSNodeMetadata, "=") // checked by validate
	headers, _ := splitPairs(c.XDSHeaders, ":")
	return rls.NewXDSClient(rls.XDSOptions{
		Server:               c.XDSServer,
		NodeID:               c.XDSNodeID,
		NodeMetadata:         md,
		Headers:              headers,
		DialOptions:          []grpc.DialOption{dial},
		ConnectRetryInterval: c.XDSConnectRetry,
		Backoff: rls.XDSBackoff{Initial: c.XDSBackoffInitial, Max: c.XDSBackoffMax,
			Factor: c.XDSBackoffFactor, Jitter: c.XDSBackoffJitter},
		MaxMsgSize: c.XDSMaxMessageBytes,
		Load:       rls.LoadOptions{MergeDomains: c.MergeDomains},
		Apply: func(cfg *rls.Config) {
			svc.SetConfig(cfg)
			log.Info("config applied from xds", "version", cfg.Version(), "domains", len(cfg.Domains()), "rules", len(cfg.Rules()))
			warnConfig(log, "xds", cfg)
		},
		Reject:  svc.ConfigError,
		Logger:  log,
		Metrics: rls.NewXDSMetrics(reg),
	})
}
