package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// clientCAEnv is the reference's client CA variable, GRPC_CLIENT_TLS_CACERT,
// or else GRPC_SERVER_TLS_CA_CERT, which Envoy Gateway sets to the CA that
// also signs the client certificate its Envoys present to the rate limit
// service (the reference does not read it; see docs/security.md). Unlike
// the server certificate variables, both are read whatever
// GRPC_SERVER_USE_TLS says: a client CA without a server certificate is
// refused rather than ignored (serveConfig.validate).
func clientCAEnv(getenv func(string) string) (string, string, bool) {
	for _, name := range []string{"GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"} {
		if v := getenv(name); v != "" {
			return v, name, true
		}
	}
	return "", "", false
}

// validateRLSClientTLS checks the RLS client mTLS flags against the rest.
func (c *serveConfig) validateRLSClientTLS() []error {
	var errs []error
	if c.GRPCTLSClientCA != "" && c.GRPCTLSCert == "" {
		errs = append(errs, errors.New("serve: --grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT, GRPC_SERVER_TLS_CA_CERT) needs server TLS: --grpc-tls-cert and --grpc-tls-key (or GRPC_SERVER_USE_TLS=true with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY)"))
	}
	if c.GRPCTLSClientSAN != "" && c.GRPCTLSClientCA == "" {
		errs = append(errs, errors.New("serve: --grpc-tls-client-san (GRPC_CLIENT_TLS_SAN) needs --grpc-tls-client-ca (GRPC_CLIENT_TLS_CACERT): without a client CA no client certificate is asked for"))
	}
	// Peers dial each other on the gRPC port: plaintext unless peer mTLS is
	// on, which a TLS listener would refuse.
	if c.GRPCTLSCert != "" && c.PeerTLSCert == "" && len(c.joinList()) > 0 {
		errs = append(errs, errors.New("serve: --grpc-tls-cert with --join needs peer mTLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca): peers call each other on the gRPC port, and a TLS listener refuses their plaintext"))
	}
	return errs
}

// rlsClientAuth verifies the client certificate of an RLS client: it must
// chain to the client CA, carry the clientAuth extended key usage (or
// none), and, if san is set, name it. Safe for concurrent use.
type rlsClientAuth struct {
	ca  *caFile
	san string

	mu      sync.Mutex
	log     *slog.Logger  // refused clients, at most once per every; nil is silent
	every   time.Duration // logEvery
	lastLog time.Time
}

// logEvery bounds the warnings about refused RLS clients: a misconfigured
// Envoy retries many times a second.
const logEvery = 10 * time.Second

// newRLSClientAuth reads the client CA once, so that a bad file fails at
// start; it is reloaded on change like the other TLS files.
func newRLSClientAuth(caPath, san string) (*rlsClientAuth, error) {
	a := &rlsClientAuth{ca: &caFile{flag: "grpc-tls-client-ca", path: caPath}, san: san, every: logEvery}
	if _, err := a.ca.get(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *rlsClientAuth) setLogger(log *slog.Logger) {
	a.ca.log = log
	a.mu.Lock()
	a.log = log
	a.mu.Unlock()
}

// configure makes cfg ask every client for a certificate and check it with
// a.verify. The handshake itself checks nothing (RequireAnyClientCert), so
// the connection has no VerifiedChains: the Peer service's gate never
// takes an RLS client's certificate for a peer's.
func (a *rlsClientAuth) configure(cfg *tls.Config) {
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = a.verify
}

// verify checks the client's certificate chain and SAN.
func (a *rlsClientAuth) verify(cs tls.ConnectionState) error {
	err := a.check(cs)
	if err != nil {
		a.warn(err)
	}
	return err
}

func (a *rlsClientAuth) check(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("serve: rls client presented no certificate")
	}
	pool, err := a.ca.get()
	if err != nil {
		return err
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return fmt.Errorf("serve: rls client certificate %q: %w", leaf.Subject.CommonName, err)
	}
	if a.san != "" && !certNames(leaf, a.san) {
		return fmt.Errorf("serve: rls client certificate %q: does not name %q (--grpc-tls-client-san); it names DNS %q, IP %q, URI %q",
			leaf.Subject.CommonName, a.san, leaf.DNSNames, leaf.IPAddresses, leaf.URIs)
	}
	return nil
}

// certNames reports whether cert carries san: a URI SAN equal to it when
// san is a URI (spiffe://cluster.local/ns/istio-system/sa/gateway), else
// a DNS SAN that matches it, wildcards included, or an IP SAN equal to it
// when san is an IP (x509's host name rules, as the reference checks).
func certNames(cert *x509.Certificate, san string) bool {
	if strings.Contains(san, "://") {
		for _, u := range cert.URIs {
			if u.String() == san {
				return true
			}
		}
		return false
	}
	return cert.VerifyHostname(san) == nil
}

// warn logs a refused client, at most once per logEvery.
func (a *rlsClientAuth) warn(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.log == nil || time.Since(a.lastLog) < a.every {
		return
	}
	a.lastLog = time.Now()
	a.log.Warn("tls: refused an rls client's certificate (logged at most every 10s)", "err", err)
}
