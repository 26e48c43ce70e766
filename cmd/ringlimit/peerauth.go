package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ringlimit/ringlimit/cluster/membership"
	"github.com/ringlimit/ringlimit/cluster/transport"
)

// peerServerName is the TLS server name peers dial each other with: it
// tells the gRPC listener to present the peer certificate rather than the
// RLS one. Peers check each other's certificate against --peer-tls-ca only
// (not against a host name): belonging to the cluster's CA is the identity.
const peerServerName = "ringlimit-peer"

// fileStamp tells whether a file changed since it was last read.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{fi.ModTime(), fi.Size()}, nil
}

// keyPairFile is a certificate and key read from PEM files, read again on
// use when either file's modification time or size changed. A reload that
// fails (e.g. a half-written file) keeps the last good pair. Safe for
// concurrent use.
type keyPairFile struct {
	flag, certPath, keyPath string
	log                     *slog.Logger // failed reloads; nil is silent

	mu    sync.Mutex
	stamp [2]fileStamp
	bad   [2]fileStamp // the files' state when a reload last failed, logged once
	cert  *tls.Certificate
}

// get returns the current pair, reloading it if the files changed.
func (k *keyPairFile) get() (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cs, err1 := stampOf(k.certPath)
	ks, err2 := stampOf(k.keyPath)
	if err := errors.Join(err1, err2); err != nil || (k.cert != nil && cs == k.stamp[0] && ks == k.stamp[1]) {
		if k.cert == nil {
			return nil, fmt.Errorf("serve: --%s: %w", k.flag, err)
		}
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.certPath, k.keyPath)
	if err != nil {
		if k.cert == nil {
			return nil, fmt.Errorf("serve: --%s: %w", k.flag, err)
		}
		if st := [2]fileStamp{cs, ks}; st != k.bad && k.log != nil {
			k.bad = st
			k.log.Warn("tls: reloading a changed certificate failed; still using the last good one", "flag", "--"+k.flag, "err", err)
		}
		return k.cert, nil
	}
	k.cert, k.stamp = &c, [2]fileStamp{cs, ks}
	return k.cert, nil
}

// caFile is a PEM CA bundle, reloaded like keyPairFile. Safe for concurrent
// use.
type caFile struct {
	flag, path string
	log        *slog.Logger // failed reloads; nil is silent

	mu    sync.Mutex
	stamp fileStamp
	bad   fileStamp // the file's state when a reload last failed, logged once
	pool  *x509.CertPool
}

// get returns the current pool, reloading it if the file changed.
func (c *caFile) get() (*x509.CertPool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := stampOf(c.path)
	if err != nil || (c.pool != nil && st == c.stamp) {
		if c.pool == nil {
			return nil, fmt.Errorf("serve: --%s: %w", c.flag, err)
		}
		return c.pool, nil
	}
	pool, err := readCAPool(c.path)
	if err != nil {
		if c.pool == nil {
			return nil, fmt.Errorf("serve: --%s: %w", c.flag, err)
		}
		if st != c.bad && c.log != nil {
			c.bad = st
			c.log.Warn("tls: reloading a changed CA bundle failed; still using the last good one", "flag", "--"+c.flag, "err", err)
		}
		return c.pool, nil
	}
	c.pool, c.stamp = pool, st
	return c.pool, nil
}

// readCAPool reads a PEM CA bundle into a pool.
func readCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}

// tlsFiles holds the certificates named by the TLS flags. A nil field is
// a feature turned off.
type tlsFiles struct {
	peer *keyPairFile // --peer-tls-cert/--peer-tls-key: peer mTLS
	ca   *caFile      // --peer-tls-ca, set with peer
	rls  *keyPairFile // --grpc-tls-cert/--grpc-tls-key: server TLS for RLS clients
	// --grpc-tls-client-ca/--grpc-tls-client-san: RLS clients need a
	// certificate (set with rls).
	clients *rlsClientAuth
}

// setLogger makes the files log reloads that fail (once per change of the
// files). Call it before the files are in use.
func (f *tlsFiles) setLogger(log *slog.Logger) {
	for _, k := range []*keyPairFile{f.peer, f.rls} {
		if k != nil {
			k.log = log
		}
	}
	if f.ca != nil {
		f.ca.log = log
	}
	if f.clients != nil {
		f.clients.setLogger(log)
	}
}

// newTLSFiles reads the files once, so that a bad one fails at start.
func newTLSFiles(c *serveConfig) (*tlsFiles, error) {
	f := &tlsFiles{}
	if c.PeerTLSCert != "" {
		f.peer = &keyPairFile{flag: "peer-tls-cert", certPath: c.PeerTLSCert, keyPath: c.PeerTLSKey}
		f.ca = &caFile{flag: "peer-tls-ca", path: c.PeerTLSCA}
		if _, err := f.peer.get(); err != nil {
			return nil, err
		}
		if _, err := f.ca.get(); err != nil {
			return nil, err
		}
	}
	if c.GRPCTLSCert != "" {
		f.rls = &keyPairFile{flag: "grpc-tls-cert", certPath: c.GRPCTLSCert, keyPath: c.GRPCTLSKey}
		if _, err := f.rls.get(); err != nil {
			return nil, err
		}
	}
	if c.GRPCTLSClientCA != "" {
		if f.rls == nil {
			return nil, errors.New("serve: --grpc-tls-client-ca needs --grpc-tls-cert")
		}
		var err error
		if f.clients, err = newRLSClientAuth(c.GRPCTLSClientCA, c.GRPCTLSClientSAN); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// serverConfig is the gRPC listener's TLS, or nil for plaintext. With peer
// mTLS, a client certificate is verified against the CA when one is given
// (VerifyClientCertIfGiven), so RLS clients need none; the Peer service
// itself demands one (see grpcServerOptions). With RLS client mTLS
// (f.clients), a connection that does not ask for ringlimit-peer must
// present a certificate of the client CA, and one that does must present
// a peer certificate: no connection goes without a verified certificate.
// An RLS client's certificate is checked by f.clients, not by the
// handshake, so its connection has no VerifiedChains and the Peer
// service's gate (which admits verified chains) refuses it even when the
// client CA is the peer CA.
func (f *tlsFiles) serverConfig() *tls.Config {
	if f.peer == nil && f.rls == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			kp := f.rls
			peerConn := kp == nil || (f.peer != nil && hello.ServerName == peerServerName)
			if peerConn {
				kp = f.peer
			}
			cert, err := kp.get()
			if err != nil {
				return nil, err
			}
			cfg := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				NextProtos:   []string{"h2"},
			}
			switch {
			case f.clients != nil && !peerConn:
				f.clients.configure(cfg)
			case f.peer != nil:
				pool, err := f.ca.get()
				if err != nil {
					return nil, err
				}
				cfg.ClientAuth, cfg.ClientCAs = tls.VerifyClientCertIfGiven, pool
				if f.clients != nil {
					cfg.ClientAuth = tls.RequireAndVerifyClientCert
				}
			}
			return cfg, nil
		},
	}
}

// peerDialConfig is the TLS peers dial each other with, or nil without
// peer mTLS: it presents this node's peer certificate and accepts a server
// whose certificate chains to the CA, whatever host name it names.
func (f *tlsFiles) peerDialConfig() *tls.Config {
	if f.peer == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: peerServerName,
		// The default check wants a host name; VerifyConnection checks the
		// chain against the (reloadable) CA instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("serve: peer presented no certificate")
			}
			pool, err := f.ca.get()
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("serve: peer certificate: %w", err)
			}
			return nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return f.peer.get()
		},
	}
}

// peerDialOptions are the cluster's dial options: nil (plaintext) without
// peer mTLS.
func (f *tlsFiles) peerDialOptions() []grpc.DialOption {
	cfg := f.peerDialConfig()
	if cfg == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
}

// aliveLister lists the members of the cluster whose peer calls are
// admitted (*membership.Membership: the alive ones, and those that left in the
// last minute, which may still be draining).
type aliveLister interface {
	Admitted() []membership.Member
}

// grpcServerOptions are the gRPC server's TLS and, for a cluster node
// (members non-nil), the Peer service's gate: with peer mTLS it admits
// only a client whose certificate the handshake verified against the CA;
// without, only a caller at the IP of a member (memberIP).
func grpcServerOptions(f *tlsFiles, members aliveLister) []grpc.ServerOption {
	var opts []grpc.ServerOption
	if cfg := f.serverConfig(); cfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	if members != nil {
		g := transport.Gate{MTLS: f.peer != nil, Admit: memberIP(members)}
		opts = append(opts, g.ServerOptions()...)
	}
	return opts
}

// memberIP reports whether an IP is the host of the gRPC or gossip address
// of a member that members admits: a current one, or one that left
// gracefully in the last minute.
func memberIP(members aliveLister) func(ip net.IP) bool {
	return func(ip net.IP) bool {
		for _, m := range members.Admitted() {
			for _, a := range []string{m.GRPCAddr, m.Addr} {
				if h, _, err := net.SplitHostPort(a); err == nil && ip.Equal(net.ParseIP(h)) {
					return true
				}
			}
		}
		return false
	}
}
