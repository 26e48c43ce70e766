package main

import (
	"crypto/tls"
	"flag"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// rlsClientTLS holds the flags with which check and bench reach an RLS
// listener that serves TLS (serve --grpc-tls-cert/--grpc-tls-key).
type rlsClientTLS struct {
	on         bool
	ca         string
	serverName string
	skipVerify bool
}

// register adds --tls, --tls-ca, --tls-server-name and
// --tls-insecure-skip-verify to fs.
func (c *rlsClientTLS) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "tls", false, "speak TLS to the server, verifying it against the system roots (implied by the other --tls flags)")
	fs.StringVar(&c.ca, "tls-ca", "", "PEM file of the CA(s) that signed the server's certificate")
	fs.StringVar(&c.serverName, "tls-server-name", "", "name to verify the server's certificate against (default: the host of the address)")
	fs.BoolVar(&c.skipVerify, "tls-insecure-skip-verify", false, "speak TLS without verifying the server's certificate (tests only)")
}

// dialOption returns the transport credentials the flags ask for:
// plaintext when no --tls flag is set.
func (c *rlsClientTLS) dialOption() (grpc.DialOption, error) {
	if !c.on && c.ca == "" && c.serverName == "" && !c.skipVerify {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName, InsecureSkipVerify: c.skipVerify}
	if c.ca != "" {
		pool, err := readCAPool(c.ca)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}
