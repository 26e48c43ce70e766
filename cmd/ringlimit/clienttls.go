package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsClientTLS holds the flags with which check and bench reach an RLS
// listener that serves TLS (serve --grpc-tls-cert/--grpc-tls-key), and
// present a client certificate to one that asks for it
// (serve --grpc-tls-client-ca).
type rlsClientTLS struct {
	on         bool
	ca         string
	serverName string
	skipVerify bool
	cert, key  string
}

// register adds --tls, --tls-ca, --tls-server-name,
// --tls-insecure-skip-verify, --tls-cert and --tls-key to fs.
func (c *rlsClientTLS) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "tls", false, "speak TLS to the server, verifying it against the system roots (implied by the other --tls flags)")
	fs.StringVar(&c.ca, "tls-ca", "", "PEM file of the CA(s) that signed the server's certificate")
	fs.StringVar(&c.serverName, "tls-server-name", "", "name to verify the server's certificate against (default: the host of the address)")
	fs.BoolVar(&c.skipVerify, "tls-insecure-skip-verify", false, "speak TLS without verifying the server's certificate (tests only)")
	fs.StringVar(&c.cert, "tls-cert", "", "PEM client certificate to present, for a server that verifies RLS clients (with --tls-key)")
	fs.StringVar(&c.key, "tls-key", "", "PEM private key of --tls-cert")
}

// dialOption returns the transport credentials the flags ask for:
// plaintext when no --tls flag is set.
func (c *rlsClientTLS) dialOption() (grpc.DialOption, error) {
	if countSet(c.cert, c.key) == 1 {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if !c.on && c.ca == "" && c.serverName == "" && !c.skipVerify && c.cert == "" {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName, InsecureSkipVerify: c.skipVerify}
	if c.cert != "" {
		kp, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	if c.ca != "" {
		pool, err := readCAPool(c.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}
