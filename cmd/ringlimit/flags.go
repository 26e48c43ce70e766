package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/cluster/membership"
)

// serveConfig is everything `ringlimit serve` is told, after flags and
// environment variables are merged (flags win over RINGLIMIT_* variables,
// which win over the reference's variables, which win over defaults).
type serveConfig struct {
	Config       string
	MergeDomains bool
	GRPCAddr     string
	HTTPAddr     string
	DebugAddr    string
	LogLevel     string
	LogFormat    string

	ShadowMode bool
	QuotaMode  bool
	// DynamicMetadata: RESPONSE_DYNAMIC_METADATA.
	DynamicMetadata bool
	// HealthyWithConfig: not ready while the config holds no domain.
	HealthyWithConfig bool
	StopIncrement     bool
	NearLimitRatio    float64
	ResponseHeaders   bool
	HeaderLimit       string
	HeaderRemaining   string
	HeaderReset       string
	MaxKeys           int
	MaxStoreBytes     int64
	MaxDescriptors    int
	MaxEntries        int
	MaxValueLen       int
	MaxKeyLen         int
	MaxRequestSize    int
	ShutdownTimeout   time.Duration
	DataDir           string

	NodeName string
	// nodeNameFromHost: --node-name was not set and is the hostname.
	nodeNameFromHost bool
	GossipAddr       string
	AdvertiseAddr    string
	Join             string
	GossipKeyFile    string
	ClusterName      string
	Replicas         int
	// LeaseTTL is how long a quota lease lasts at most; 0 turns leases
	// off.
	LeaseTTL time.Duration

	PeerTLSCert string
	PeerTLSKey  string
	PeerTLSCA   string
	GRPCTLSCert string
	GRPCTLSKey  string
	// GRPCTLSClientCA and GRPCTLSClientSAN: RLS clients need a certificate
	// (rlsmtls.go).
	GRPCTLSClientCA  string
	GRPCTLSClientSAN string

	// OpenTelemetry tracing (tracing.go).
	TracingEnabled      bool
	TracingServiceName  string
	TracingNamespace    string
	TracingInstanceID   string
	TracingSamplingRate float64
	TracingProtocol     string

	// ConfigType is FILE (--config) or GRPC_XDS_SOTW (the xDS settings below).
	ConfigType string
	// ForceStart: with xDS, be ready before the first config arrives.
	ForceStart         bool
	XDSServer          string
	XDSNodeID          string
	XDSNodeMetadata    string
	XDSConnectRetry    time.Duration
	XDSHeaders         string
	XDSTLS             bool
	XDSTLSCert         string
	XDSTLSKey          string
	XDSTLSCA           string
	XDSTLSSAN          string
	XDSBackoffInitial  time.Duration
	XDSBackoffMax      time.Duration
	XDSBackoffFactor   float64
	XDSBackoffJitter   bool
	XDSMaxMessageBytes int

	DryRun bool

	// parsed is how the settings were given, for writeSettings and
	// flagError (a pointer: serveConfig stays comparable).
	parsed *parsedFlags
}

// parsedFlags is the parsed flag set and where each flag not left at its
// default was set: "--name", its RINGLIMIT_ variable, or the reference's
// variables.
type parsedFlags struct {
	flags  *flag.FlagSet
	origin map[string]string
}

// legacyEnv names the envoyproxy/ratelimit variables that set a flag's
// default when neither the flag nor its RINGLIMIT_ variable is given.
// It returns the value and the variables it came from, for errors.
type legacyEnv func(getenv func(string) string) (value, from string, ok bool)

func plainEnv(name string) legacyEnv {
	return func(getenv func(string) string) (string, string, bool) {
		v := getenv(name)
		return v, name, v != ""
	}
}

// hostPortEnv joins a reference HOST/PORT pair; either may be missing, and
// a missing port is the reference's default for it (a host alone must still
// bind that host, not every interface).
func hostPortEnv(hostVar, portVar, defPort string) legacyEnv {
	return func(getenv func(string) string) (string, string, bool) {
		h, p := getenv(hostVar), getenv(portVar)
		if h == "" && p == "" {
			return "", "", false
		}
		if p == "" {
			p = defPort
		}
		return net.JoinHostPort(h, p), hostVar + "/" + portVar, true
	}
}

// runtimePathEnv builds the reference's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
// RUNTIME_APPDIRECTORY config path.
func runtimePathEnv(getenv func(string) string) (string, string, bool) {
	root, sub, app := getenv("RUNTIME_ROOT"), getenv("RUNTIME_SUBDIRECTORY"), getenv("RUNTIME_APPDIRECTORY")
	if root == "" && sub == "" && app == "" {
		return "", "", false
	}
	if root == "" {
		root = "/srv/runtime_data/current"
	}
	if app == "" {
		app = "config"
	}
	return filepath.Join(root, sub, app), "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY", true
}

// ignoredEnvPrefixes are reference settings that mean nothing here (there is
// no Redis, no statsd, and metrics are always on the debug listener); they
// are accepted and reported once.
var ignoredEnvPrefixes = []string{"REDIS_", "USE_STATSD", "STATSD_", "LOCAL_CACHE_SIZE_IN_BYTES", "BACKEND_TYPE", "MEMCACHE_", "PROMETHEUS_"}

// useTLSEnv reads GRPC_SERVER_USE_TLS; a value that is set but not a
// boolean is an error (refusedEnv reports it), never false.
func useTLSEnv(getenv func(string) string) (on bool, err error) {
	v := getenv("GRPC_SERVER_USE_TLS")
	if v == "" {
		return false, nil
	}
	on, err = strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("serve: GRPC_SERVER_USE_TLS=%q: not a boolean (true or false)", v)
	}
	return on, nil
}

// serverTLSEnv is the reference's server certificate variable name, used
// only when GRPC_SERVER_USE_TLS is true, as there.
func serverTLSEnv(name string) legacyEnv {
	return func(getenv func(string) string) (string, string, bool) {
		if on, _ := useTLSEnv(getenv); !on {
			return "", "", false
		}
		v := getenv(name)
		return v, name, v != ""
	}
}

// refusedEnv checks the reference settings ringlimit cannot honour and must
// not ignore: each would leave the listener less secure than configured, or
// listening somewhere Envoy does not look. c is the configuration resolved
// from flags and environment: TLS asked for by GRPC_SERVER_USE_TLS may come
// from the --grpc-tls-* flags or their RINGLIMIT_ variables too.
func refusedEnv(getenv func(string) string, c *serveConfig) error {
	var errs []error
	if on, err := useTLSEnv(getenv); err != nil {
		errs = append(errs, err)
	} else if on && (c.GRPCTLSCert == "" || c.GRPCTLSKey == "") {
		errs = append(errs, errors.New("serve: GRPC_SERVER_USE_TLS is true but no server certificate and key are set (GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY, or --grpc-tls-cert and --grpc-tls-key)"))
	}
	if getenv("GRPC_UDS") != "" {
		errs = append(errs, errors.New("serve: GRPC_UDS is set, but ringlimit serves gRPC on TCP only (--grpc-addr): unset it and point Envoy at the TCP port"))
	}
	return errors.Join(errs...)
}

// newServeFlags defines serve's flags on a fresh FlagSet, with the legacy
// variable of each flag that has one.
func newServeFlags(c *serveConfig, stderr io.Writer) (*flag.FlagSet, map[string]legacyEnv) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	legacy := map[string]legacyEnv{}
	str := func(p *string, name, def, usage string, l legacyEnv) {
		fs.StringVar(p, name, def, usage)
		if l != nil {
			legacy[name] = l
		}
	}
	boolean := func(p *bool, name string, def bool, usage string, l legacyEnv) {
		fs.BoolVar(p, name, def, usage)
		if l != nil {
			legacy[name] = l
		}
	}
	str(&c.Config, "config", "/srv/runtime_data/current/config", "config file or directory (every regular file, dotfiles skipped); watched for changes", runtimePathEnv)
	boolean(&c.MergeDomains, "merge-domains", false, "merge config files that share a domain instead of rejecting them", plainEnv("MERGE_DOMAIN_CONFIG"))
	str(&c.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (RLS v3, gRPC health, peer RPCs)", hostPortEnv("GRPC_HOST", "GRPC_PORT", "8081"))
	str(&c.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/healthcheck, /json)", hostPortEnv("HOST", "PORT", "8080"))
	str(&c.DebugAddr, "debug-addr", ":6070", "debug listen address (/metrics, /rlconfig, /debug/pprof/, /debug/cluster)", hostPortEnv("DEBUG_HOST", "DEBUG_PORT", "6070"))
	str(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error (the reference's trace counts as debug, fatal and panic as error)", plainEnv("LOG_LEVEL"))
	str(&c.LogFormat, "log-format", "text", "log format: text or json", plainEnv("LOG_FORMAT"))
	boolean(&c.ShadowMode, "shadow-mode", false, "global shadow mode: count as usual but always answer OK overall", plainEnv("SHADOW_MODE"))
	boolean(&c.HealthyWithConfig, "healthy-with-config", false, "not ready (/healthcheck 500, gRPC health NOT_SERVING) while the loaded config holds no domain", plainEnv("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"))
	boolean(&c.DynamicMetadata, "response-dynamic-metadata", false, "set the response's dynamic_metadata: domain, descriptors and the metadata of the rules not over their limit", plainEnv("RESPONSE_DYNAMIC_METADATA"))
	boolean(&c.QuotaMode, "quota-mode", false, "global quota mode: every rule is a quota_mode rule (over-limit statuses stay, the overall code is OVER_LIMIT only from rules not in quota mode or when every quota-mode descriptor is over)", plainEnv("QUOTA_MODE"))
	boolean(&c.StopIncrement, "stop-increment-when-over-limit", false, "when a request would put some descriptors over their limit, only those count its hits", plainEnv("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"))
	fs.Float64Var(&c.NearLimitRatio, "near-limit-ratio", 0.8, "fraction of a limit above which hits count as near_limit")
	legacy["near-limit-ratio"] = plainEnv("NEAR_LIMIT_RATIO")
	boolean(&c.ResponseHeaders, "response-headers", false, "add RateLimit-Limit/-Remaining/-Reset headers from the most constrained descriptor", plainEnv("LIMIT_RESPONSE_HEADERS_ENABLED"))
	str(&c.HeaderLimit, "header-limit", "RateLimit-Limit", "name of the limit header", plainEnv("LIMIT_LIMIT_HEADER"))
	str(&c.HeaderRemaining, "header-remaining", "RateLimit-Remaining", "name of the remaining header", plainEnv("LIMIT_REMAINING_HEADER"))
	str(&c.HeaderReset, "header-reset", "RateLimit-Reset", "name of the reset header", plainEnv("LIMIT_RESET_HEADER"))
	fs.IntVar(&c.MaxKeys, "max-keys", 1<<20, "most counters kept in memory on this node; beyond it expired then least recently used ones are evicted (0: unbounded)")
	fs.Int64Var(&c.MaxStoreBytes, "max-store-bytes", 256<<20, "approximate memory of the counters on this node (key bytes plus 100 per counter); beyond it they are evicted as for --max-keys (0: unbounded)")
	fs.IntVar(&c.MaxDescriptors, "max-descriptors", 64, "most descriptors in one request")
	fs.IntVar(&c.MaxEntries, "max-entries", 16, "most entries in one descriptor")
	fs.IntVar(&c.MaxValueLen, "max-value-len", 1024, "longest descriptor value kept in a counter key as is; a longer one is counted under its SHA-256 digest")
	fs.IntVar(&c.MaxKeyLen, "max-key-len", 256, "longest descriptor entry key (and domain) in bytes")
	fs.IntVar(&c.MaxRequestSize, "max-request-bytes", 256<<10, "largest encoded RLS request in bytes (gRPC and /json)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM may take to drain before exiting")
	str(&c.DataDir, "data-dir", "", "directory where this node saves its counters (windows of a minute or more) every second and at shutdown, and restores them from at start; one per node; empty keeps counters in memory only", nil)
	str(&c.NodeName, "node-name", "", "stable identity of this node in the cluster (default: the hostname)", nil)
	str(&c.GossipAddr, "gossip-addr", ":7946", "gossip (memberlist) listen address; used when --join is set", nil)
	str(&c.AdvertiseAddr, "advertise-addr", "", "IP or IP:port other nodes reach this node's gossip at (in Kubernetes: the pod IP)", nil)
	str(&c.Join, "join", "", "comma-separated host:port or DNS names of peers; empty runs a single node", nil)
	str(&c.GossipKeyFile, "gossip-key-file", "", "file of base64 AES keys (16, 24 or 32 bytes), one per line: the first encrypts gossip, all decrypt it; reloaded on change, so keys rotate without a restart", nil)
	str(&c.ClusterName, "cluster-name", "ringlimit", "label on every gossip message: nodes with another cluster name ignore each other (give each ringlimit cluster that can reach another its own)", nil)
	str(&c.PeerTLSCert, "peer-tls-cert", "", "PEM certificate this node presents to peers (with --peer-tls-key and --peer-tls-ca: peer RPCs need mTLS; reloaded on change)", nil)
	str(&c.PeerTLSKey, "peer-tls-key", "", "PEM private key of --peer-tls-cert", nil)
	str(&c.PeerTLSCA, "peer-tls-ca", "", "PEM CA bundle that signs every node's peer certificate", nil)
	str(&c.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate the gRPC listener presents to RLS clients (server TLS; with --grpc-tls-key; reloaded on change)", serverTLSEnv("GRPC_SERVER_TLS_CERT"))
	str(&c.GRPCTLSKey, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert", serverTLSEnv("GRPC_SERVER_TLS_KEY"))
	str(&c.ConfigType, "config-type", configTypeFile, "where the rate limit config comes from: FILE (--config, watched) or GRPC_XDS_SOTW (an xDS management server, --xds-*)", plainEnv("CONFIG_TYPE"))
	boolean(&c.ForceStart, "force-start-without-initial-config", false, "with GRPC_XDS_SOTW: be ready at once (unless --healthy-with-config); until the first config every request fails with gRPC Unknown (without it the node is not ready until then)", plainEnv("FORCE_START_WITHOUT_INITIAL_CONFIG"))
	str(&c.XDSServer, "xds-server", "localhost:18000", "host:port of the xDS management server", plainEnv("CONFIG_GRPC_XDS_SERVER_URL"))
	str(&c.XDSNodeID, "xds-node-id", "default", "node id sent to the xDS server (its snapshots are keyed by it)", plainEnv("CONFIG_GRPC_XDS_NODE_ID"))
	str(&c.XDSNodeMetadata, "xds-node-metadata", "", "node metadata sent to the xDS server: key=value,key2=value2", plainEnv("CONFIG_GRPC_XDS_NODE_METADATA"))
	fs.DurationVar(&c.XDSConnectRetry, "xds-connect-retry-interval", 3*time.Second, "wait between attempts to reach an xDS server that does not answer")
	legacy["xds-connect-retry-interval"] = plainEnv("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")
	str(&c.XDSHeaders, "xds-headers", "", "gRPC metadata sent to the xDS server: key:value,key2:value2", plainEnv("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"))
	boolean(&c.XDSTLS, "xds-tls", false, "speak TLS to the xDS server (verified against --xds-tls-ca, or the system roots)", plainEnv("CONFIG_GRPC_XDS_SERVER_USE_TLS"))
	str(&c.XDSTLSCert, "xds-tls-cert", "", "PEM client certificate presented to the xDS server (with --xds-tls-key; reloaded on change)", plainEnv("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"))
	str(&c.XDSTLSKey, "xds-tls-key", "", "PEM private key of --xds-tls-cert", plainEnv("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"))
	str(&c.XDSTLSCA, "xds-tls-ca", "", "PEM CA bundle the xDS server's certificate must chain to (default: the system roots)", plainEnv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"))
	str(&c.XDSTLSSAN, "xds-tls-san", "", "name the xDS server's certificate must carry (default: the host of --xds-server)", plainEnv("CONFIG_GRPC_XDS_SERVER_TLS_SAN"))
	fs.DurationVar(&c.XDSBackoffInitial, "xds-backoff-initial", 10*time.Second, "first wait before reopening a lost xDS stream")
	legacy["xds-backoff-initial"] = plainEnv("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
	fs.DurationVar(&c.XDSBackoffMax, "xds-backoff-max", time.Minute, "longest wait before reopening a lost xDS stream")
	legacy["xds-backoff-max"] = plainEnv("XDS_CLIENT_BACKOFF_MAX_INTERVAL")
	fs.Float64Var(&c.XDSBackoffFactor, "xds-backoff-factor", 0.5, "each wait in a row is the first times this to the power of the attempt, within [initial, max] (below 1: always the first wait)")
	legacy["xds-backoff-factor"] = plainEnv("XDS_CLIENT_BACKOFF_RANDOM_FACTOR")
	boolean(&c.XDSBackoffJitter, "xds-backoff-jitter", true, "draw each wait uniformly between the first wait and its value", plainEnv("XDS_CLIENT_BACKOFF_JITTER"))
	fs.IntVar(&c.XDSMaxMessageBytes, "xds-max-message-bytes", 0, "largest xDS response accepted (0: 4 MiB)")
	legacy["xds-max-message-bytes"] = plainEnv("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	str(&c.GRPCTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle RLS clients' certificates must chain to: every RLS client then needs one (mTLS; needs --grpc-tls-cert; reloaded on change)", clientCAEnv)
	str(&c.GRPCTLSClientSAN, "grpc-tls-client-san", "", "name an RLS client's certificate must carry: a DNS name (wildcard SANs match) or IP, or a URI such as spiffe://...; needs --grpc-tls-client-ca", plainEnv("GRPC_CLIENT_TLS_SAN"))
	fs.IntVar(&c.Replicas, "replicas", 2, "how many nodes hold each counter: its owner and replicas-1 replicas that take over with its count when it dies (1 disables replication; at most 16)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", cluster.DefaultLeaseTTL, "how long a node may decide a key's hits from a share of its quota leased by the key's owner (never past the key's window; fixed and sliding windows); 0 turns leases off, so every hit for a key another node owns is forwarded to it")
	registerTracingFlags(fs, legacy, c)
	boolean(&c.DryRun, "dry-run", false, "parse flags and environment, load the config, print the settings and exit", nil)
	return fs, legacy
}

// parseServeFlags merges defaults, the reference's variables, RINGLIMIT_*
// variables and flags, and validates the result.
func parseServeFlags(args []string, env environment, stderr io.Writer) (*serveConfig, []string, error) {
	getenv := env.get
	c := &serveConfig{parsed: &parsedFlags{origin: map[string]string{}}}
	fs, legacy := newServeFlags(c, stderr)
	var notes []string
	var errs []error
	set := func(name, value, source string) {
		if err := fs.Set(name, value); err != nil {
			errs = append(errs, fmt.Errorf("serve: %s=%q: %v", source, value, err))
		}
		c.parsed.origin[name] = source
	}
	fs.VisitAll(func(f *flag.Flag) {
		if l, ok := legacy[f.Name]; ok {
			if v, from, ok := l(getenv); ok {
				set(f.Name, v, from)
			}
		}
		env := envName(f.Name)
		if v := getenv(env); v != "" {
			set(f.Name, v, env)
		}
	})
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	c.parsed.flags = fs
	// fs counts the variables' values as set too: a second parse of args
	// alone tells which flags the command line gave.
	cmdline, _ := newServeFlags(&serveConfig{}, io.Discard)
	if cmdline.Parse(args) == nil {
		cmdline.Visit(func(f *flag.Flag) { c.parsed.origin[f.Name] = "--" + f.Name })
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	if err := refusedEnv(getenv, c); err != nil {
		return nil, nil, err
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, nil, fmt.Errorf("serve: --node-name not set and no hostname: %w", err)
		}
		c.NodeName, c.nodeNameFromHost = h, true
	}
	for _, name := range env.names() {
		for _, p := range ignoredEnvPrefixes {
			if strings.HasPrefix(name, p) {
				notes = append(notes, name)
			}
		}
	}
	return c, notes, c.validate()
}

func (c *serveConfig) validate() error {
	var errs []error
	if c.Config == "" {
		errs = append(errs, errors.New("serve: --config: empty path"))
	}
	for _, a := range []struct{ flag, addr string }{{"grpc-addr", c.GRPCAddr}, {"http-addr", c.HTTPAddr}, {"debug-addr", c.DebugAddr}, {"gossip-addr", c.GossipAddr}} {
		_, port, err := net.SplitHostPort(a.addr)
		if err == nil {
			// A number (":0" asks for a random port explicitly); an empty
			// port would listen on a random one where nobody looks.
			if _, perr := strconv.ParseUint(port, 10, 16); perr != nil {
				err = fmt.Errorf("port %q is not a number from 0 to 65535", port)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("serve: --%s %q: %v", a.flag, a.addr, err))
		}
	}
	if !(c.NearLimitRatio > 0 && c.NearLimitRatio <= 1) { // also refuses NaN
		errs = append(errs, fmt.Errorf("serve: --near-limit-ratio: %v is not in (0, 1]", c.NearLimitRatio))
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "warning", "error", "trace", "fatal", "panic": // the last three: the reference's logrus levels
	default:
		errs = append(errs, fmt.Errorf("serve: --log-level: unknown level %q (debug, info, warn, error)", c.LogLevel))
	}
	switch strings.ToLower(c.LogFormat) {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("serve: --log-format: unknown format %q (text, json)", c.LogFormat))
	}
	if c.MaxKeys < 0 || c.MaxStoreBytes < 0 || c.MaxDescriptors < 1 || c.MaxEntries < 1 || c.MaxValueLen < 1 || c.MaxKeyLen < 1 || c.MaxRequestSize < 1 {
		errs = append(errs, errors.New("serve: --max-keys and --max-store-bytes must be >= 0 and --max-descriptors, --max-entries, --max-value-len, --max-key-len, --max-request-bytes >= 1"))
	}
	if c.Replicas < 1 || c.Replicas > cluster.MaxReplicas {
		errs = append(errs, fmt.Errorf("serve: --replicas: %d is not in [1, %d]", c.Replicas, cluster.MaxReplicas))
	}
	if c.LeaseTTL < 0 {
		errs = append(errs, fmt.Errorf("serve: --lease-ttl: %v is negative (0 turns leases off)", c.LeaseTTL))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("serve: --shutdown-timeout must be > 0"))
	}
	if n := countSet(c.PeerTLSCert, c.PeerTLSKey, c.PeerTLSCA); n != 0 && n != 3 {
		errs = append(errs, errors.New("serve: --peer-tls-cert, --peer-tls-key and --peer-tls-ca go together"))
	}
	if n := countSet(c.GRPCTLSCert, c.GRPCTLSKey); n != 0 && n != 2 {
		errs = append(errs, errors.New("serve: --grpc-tls-cert and --grpc-tls-key go together"))
	}
	errs = append(errs, c.validateConfigSource()...)
	errs = append(errs, c.validateRLSClientTLS()...)
	errs = append(errs, c.validateTracing()...)
	if len(c.ClusterName) > membership.MaxLabelLen {
		errs = append(errs, fmt.Errorf("serve: --cluster-name: %d bytes, at most %d", len(c.ClusterName), membership.MaxLabelLen))
	}
	return errors.Join(errs...)
}

// writeSettings prints the effective settings, one "name=value" line per
// flag in name order, as flags, RINGLIMIT_* and the reference's variables
// resolved them (--dry-run). The value of a flag that holds a secret itself
// (see secretFlag) is printed as <redacted>; file paths are printed.
func (c *serveConfig) writeSettings(w io.Writer) {
	c.parsed.flags.VisitAll(func(f *flag.Flag) {
		v := f.Value.String()
		switch {
		case v == "":
		case secretFlag(f.Name):
			v = "<redacted>"
		case f.Name == "xds-headers":
			v = redactPairValues(v, ":") // often authorization:Bearer ...
		}
		fmt.Fprintf(w, "%s=%s\n", f.Name, v)
	})
}

// redactPairValues is "k1<sep>v1,k2<sep>v2" with every value replaced by
// <redacted>; an item without sep is redacted whole.
func redactPairValues(s, sep string) string {
	items := strings.Split(s, ",")
	for i, item := range items {
		item = strings.TrimSpace(item)
		if k, _, ok := strings.Cut(item, sep); ok {
			items[i] = k + sep + "<redacted>"
		} else if item != "" {
			items[i] = "<redacted>"
		}
	}
	return strings.Join(items, ",")
}

// secretFlag reports whether a flag's value is a secret: a name with
// secret, password, token or credential in it, or ending in -key or -keys
// (but the --*-tls-key flags name PEM files, and --max-keys is a count:
// those are printed).
func secretFlag(name string) bool {
	for _, w := range []string{"secret", "password", "token", "credential"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	keyed := strings.HasSuffix(name, "-key") || strings.HasSuffix(name, "-keys")
	return keyed && !strings.HasSuffix(name, "-tls-key") && !strings.HasPrefix(name, "max-")
}

// flagError is a start-up error about the value of a flag: it names the
// flag, its value, where the value came from and the flag's default, so
// that a user who set nothing learns what to set.
//
//	serve: --grpc-addr :8081 (the default; set --grpc-addr or RINGLIMIT_GRPC_ADDR): listen tcp :8081: bind: address already in use
//	serve: --config /etc/rl (from RINGLIMIT_CONFIG; default /srv/runtime_data/current/config): no such file or directory
func (c *serveConfig) flagError(name string, err error) error {
	var f *flag.Flag
	if c.parsed != nil {
		f = c.parsed.flags.Lookup(name)
	}
	if f == nil { // not parsed from flags (a test), or no such flag
		return fmt.Errorf("serve: --%s: %w", name, err)
	}
	src := fmt.Sprintf("the default; set --%s or %s", name, envName(name))
	if o, ok := c.parsed.origin[name]; ok {
		src = fmt.Sprintf("from %s; default %s", o, orNone(f.DefValue))
	}
	return fmt.Errorf("serve: --%s %s (%s): %w", name, orNone(f.Value.String()), src, err)
}

// orNone prints an empty value as "".
func orNone(v string) string {
	if v == "" {
		return `""`
	}
	return v
}

// countSet counts the non-empty strings.
func countSet(s ...string) int {
	n := 0
	for _, v := range s {
		if v != "" {
			n++
		}
	}
	return n
}

// joinList splits --join.
func (c *serveConfig) joinList() []string {
	var out []string
	for _, s := range strings.Split(c.Join, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// envName is the RINGLIMIT_ variable of a flag: --grpc-addr is RINGLIMIT_GRPC_ADDR.
func envName(flagName string) string {
	return "RINGLIMIT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// environment is the process environment as "NAME=value" strings.
type environment []string

// get returns the value of name, or "" (the last assignment wins, as in a shell).
func (e environment) get(name string) string {
	for i := len(e) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(e[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}

// names lists the variables set, sorted.
func (e environment) names() []string {
	var out []string
	for _, kv := range e {
		if k, _, ok := strings.Cut(kv, "="); ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// envBool reads a boolean variable the way the reference does; anything
// unparsable is false.
func envBool(getenv func(string) string, name string) bool {
	b, _ := strconv.ParseBool(getenv(name))
	return b
}
