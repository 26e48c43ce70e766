package membership

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/cluster/clock"
)

// Config configures New. Zero values of optional fields
// select the documented defaults.
type Config struct {
	// ID is the stable identity of this process (required). Processes that
	// share an ID are one ring member (see Alive for which one counts).
	ID string
	// GRPCAddr is the host:port peers dial for this process's gRPC service
	// (required; the host must not be empty).
	GRPCAddr string
	// BindAddr is the gossip (UDP and TCP) listen address, an IP literal and
	// port; default ":7946", an empty host means all interfaces. Port 0
	// picks a free port; Self().Addr reports the real one. Ignored when
	// Transport is set, except that its port is the default port for Join
	// entries that have none.
	BindAddr string
	// AdvertiseAddr is the IP (optionally IP:port) other nodes use to reach
	// this one; in Kubernetes the pod IP. Empty: memberlist picks the bound
	// address, or a private address when bound to all interfaces. Without a
	// port the bind port is advertised. With BindAddr port 0 the picked port
	// is advertised whatever port is given here.
	AdvertiseAddr string
	// Join lists host:port or DNS names of nodes to join; a name resolving
	// to several IPs joins them all. Empty: this node starts a cluster alone
	// and only joins when others join it.
	Join []string
	// RejoinInterval is how often Join is contacted again after the first
	// successful join, so that healed partitions merge. Zero means 15s;
	// negative is an error.
	RejoinInterval time.Duration
	// Label, if set, names the cluster on every gossip packet and stream
	// (memberlist's label, at most MaxLabelLen bytes): nodes with another
	// label, or none, ignore each other and cannot merge.
	Label string
	// SecretKey, if set, is the AES key (16, 24 or 32 bytes) that encrypts
	// and authenticates all gossip. Nodes with a different key cannot join.
	// It is the same as Keys holding just this key; set one or the other.
	SecretKey []byte
	// Keys, if set, is the gossip keyring: AES keys of 16, 24 or 32 bytes
	// each. Keys[0], the primary, encrypts what this node sends; every key
	// decrypts what it receives, so nodes whose primaries differ keep
	// talking as long as each holds the other's primary. SetKeys replaces
	// the keyring while running. A node started without keys stays
	// unencrypted: SetKeys cannot turn encryption on.
	Keys [][]byte
	// Logger receives this package's logs and, at debug level, memberlist's
	// own log lines. Nil discards everything.
	Logger *slog.Logger
	// Transport replaces memberlist's UDP/TCP transport (tests only). Nil
	// uses memberlist's network transport on BindAddr.
	Transport memberlist.Transport
	// Preset selects memberlist's timing: "lan" (default,
	// memberlist.DefaultLANConfig) or "local" (memberlist.DefaultLocalConfig:
	// faster failure detection, for tests on loopback).
	Preset string
	// Clock times this package's own loops and records: join backoff and
	// re-joins, retries of dead members, the settling of event bursts, how
	// long dead and left members are remembered (and left ones admitted,
	// LeftGrace), leave deadlines, the spacing of key warnings, and the
	// start time gossiped in the metadata. memberlist's own timing (probes,
	// gossip, failure detection) is not on it. Nil means clock.Real().
	Clock clock.Clock
}

const (
	defaultBind    = ":7946"
	defaultRejoin  = 15 * time.Second
	joinBackoffMin = 100 * time.Millisecond
	joinBackoffMax = 5 * time.Second
	followUpJoin   = time.Second // first re-join after joining
	defaultLeave   = 5 * time.Second
	// leaveBroadcastWait bounds the wait for memberlist's own leave
	// broadcast, which goes out within a few gossip intervals while any
	// node takes gossip. Peers already know of the leave from the leaving
	// flag; when every peer leaves at the same time, the broadcast finds
	// nobody to go to and would otherwise hold Leave for its whole timeout.
	leaveBroadcastWait = time.Second
	// settleDelay lets a burst of events (a push/pull merging many nodes)
	// land before onChange is computed.
	settleDelay = 20 * time.Millisecond
	// forgetGone is how long All keeps reporting dead and left nodes.
	forgetGone = 2 * time.Minute
	// deadRetry is how often a member that failed (not left) is
	// contacted directly, for forgetGone after it failed: if it was cut
	// off rather than dead, the first contact after the heal merges the two
	// sides, within about this long instead of a RejoinInterval.
	deadRetry = time.Second
	// updateWait bounds how long SetFlags waits for its broadcast.
	updateWait = time.Second
)

// memberlistConfig validates cfg, fills its defaults in place and
// returns the memberlist configuration (without name, delegates or logger).
func memberlistConfig(cfg *Config) (*memberlist.Config, error) {
	if cfg.ID == "" {
		return nil, errors.New("membership: Config.ID: required")
	}
	if host, _, err := splitPort(cfg.GRPCAddr); err != nil || host == "" {
		return nil, fmt.Errorf("membership: Config.GRPCAddr: %q is not host:port", cfg.GRPCAddr)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if _, err := encodeMeta(nodeMeta{ID: cfg.ID, GRPCAddr: cfg.GRPCAddr, Started: cfg.Clock.Now().UnixNano()}); err != nil {
		return nil, err
	}

	var mlc *memberlist.Config
	switch cfg.Preset {
	case "", "lan":
		mlc = memberlist.DefaultLANConfig()
	case "local":
		mlc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("membership: Config.Preset: unknown preset %q (want \"lan\" or \"local\")", cfg.Preset)
	}

	if cfg.BindAddr == "" {
		cfg.BindAddr = defaultBind
	}
	bindHost, bindPort, err := splitPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("membership: Config.BindAddr: %q is not ip:port", cfg.BindAddr)
	}
	if bindHost == "" {
		bindHost = "0.0.0.0"
	}
	if net.ParseIP(bindHost) == nil {
		return nil, fmt.Errorf("membership: Config.BindAddr: %q: host must be an IP address", cfg.BindAddr)
	}
	mlc.BindAddr, mlc.BindPort = bindHost, bindPort
	mlc.AdvertiseAddr, mlc.AdvertisePort = "", bindPort

	if a := cfg.AdvertiseAddr; a != "" {
		host, port := a, bindPort
		if net.ParseIP(a) == nil {
			if host, port, err = splitPort(a); err != nil || net.ParseIP(host) == nil {
				return nil, fmt.Errorf("membership: Config.AdvertiseAddr: %q is not an IP or ip:port", a)
			}
		}
		mlc.AdvertiseAddr, mlc.AdvertisePort = host, port
	}

	for i, j := range cfg.Join {
		if strings.TrimSpace(j) == "" {
			return nil, fmt.Errorf("membership: Config.Join[%d]: empty address", i)
		}
	}
	switch {
	case cfg.RejoinInterval < 0:
		return nil, fmt.Errorf("membership: Config.RejoinInterval: %v is negative", cfg.RejoinInterval)
	case cfg.RejoinInterval == 0:
		cfg.RejoinInterval = defaultRejoin
	}
	keys := cfg.Keys
	if len(cfg.SecretKey) > 0 {
		if len(keys) > 0 {
			return nil, errors.New("membership: Config.SecretKey: set SecretKey or Keys, not both")
		}
		if err := checkKey(cfg.SecretKey); err != nil {
			return nil, fmt.Errorf("membership: Config.SecretKey: %w", err)
		}
		keys = [][]byte{cfg.SecretKey}
	}
	if len(keys) > 0 {
		if err := checkKeys(keys); err != nil {
			return nil, fmt.Errorf("membership: Config.Keys%w", err)
		}
		mlc.Keyring = newKeyring(keys)
	}
	if len(cfg.Label) > MaxLabelLen {
		return nil, fmt.Errorf("membership: Config.Label: %d bytes (at most %d)", len(cfg.Label), MaxLabelLen)
	}
	mlc.Label = cfg.Label
	mlc.Transport = cfg.Transport
	return mlc, nil
}

// splitPort splits host:port and parses the port (0-65535).
func splitPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, err
	}
	return host, int(port), nil
}
