package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/cluster/membership"
)

// clusterNode is this process's part of a ringlimit cluster.
type clusterNode struct {
	node *cluster.Node
	keys *gossipKeyWatcher // nil without --gossip-key-file, or if it cannot be watched
	c    *serveConfig
	log  *slog.Logger
}

// startCluster joins the cluster named by --join. grpcAddr is the bound gRPC
// listener; peers dial it at the advertised host, with dial (nil:
// plaintext). restore, if not nil, loads the counters saved in --data-dir:
// the node calls it before it syncs from its peers and goes ready. tracer,
// if not nil, traces forwarded decisions.
func startCluster(c *serveConfig, grpcAddr string, store *bucket.Store, reg prometheus.Registerer, log *slog.Logger, dial []grpc.DialOption, restore func(context.Context) error, tracer trace.Tracer) (*clusterNode, error) {
	adv, err := advertisedGRPC(c, grpcAddr)
	if err != nil {
		return nil, err
	}
	if c.nodeNameFromHost {
		log.Warn("cluster: --node-name not set: this node's identity is its hostname; two nodes on one host (or with one hostname) would claim the same identity, and the later one exits: give each node its own --node-name", "node_name", c.NodeName)
	}
	var keys [][]byte
	if c.GossipKeyFile != "" {
		if keys, err = readGossipKeys(c.GossipKeyFile); err != nil {
			return nil, err
		}
	} else {
		log.Warn("cluster: no --gossip-key-file: gossip is neither encrypted nor authenticated, and anyone who reaches the gossip port can join the cluster and own a share of the keys")
	}
	n, err := cluster.NewNode(cluster.NodeConfig{
		Membership: membership.Config{
			ID:            c.NodeName,
			GRPCAddr:      adv,
			BindAddr:      c.GossipAddr,
			AdvertiseAddr: c.AdvertiseAddr,
			Join:          c.joinList(),
			Keys:          keys,
			Label:         c.ClusterName,
			Logger:        log,
		},
		Store:       store,
		Restore:     restore,
		Replicas:    c.Replicas,
		LeaseTTL:    leaseTTL(c.LeaseTTL),
		DialOptions: dial,
		Registerer:  reg,
		Logger:      log,
		Tracer:      tracer,
	})
	if err != nil {
		// memberlist reports a gossip port it cannot bind only in its
		// message ("failed to start TCP listener ...: listen tcp ...").
		if strings.Contains(err.Error(), "listen") {
			return nil, c.flagError("gossip-addr", err)
		}
		return nil, fmt.Errorf("serve: cluster: %w", err)
	}
	log.Info("cluster node started", "id", c.NodeName, "grpc_advertised", adv, "gossip", c.GossipAddr, "join", c.Join, "replicas", c.Replicas, "lease_ttl", c.LeaseTTL)
	cn := &clusterNode{node: n, c: c, log: log}
	if len(keys) > 0 {
		log.Info("cluster: gossip keys", "primary", membership.KeyFingerprint(keys[0]), "keys", n.Membership().KeyFingerprints())
		if cn.keys, err = watchGossipKeys(c.GossipKeyFile, n.Membership(), reg, log); err != nil {
			log.Warn("cluster: --gossip-key-file is not reloaded on change; a key rotation needs a restart", "err", err)
		}
	}
	return cn, nil
}

// advertisedGRPC is the address peers dial for this node's gRPC service:
// the listener's port at the --advertise-addr host, else the listener's host
// when it is specific, else this machine's private IP.
func advertisedGRPC(c *serveConfig, bound string) (string, error) {
	_, port, err := net.SplitHostPort(bound)
	if err != nil {
		return "", err
	}
	host := ""
	if c.AdvertiseAddr != "" {
		host = c.AdvertiseAddr
		if h, _, err := net.SplitHostPort(c.AdvertiseAddr); err == nil {
			host = h
		}
	} else if h, _, _ := net.SplitHostPort(bound); h != "" && !net.ParseIP(h).IsUnspecified() {
		host = h
	} else {
		ip, err := sockaddr.GetPrivateIP()
		if err != nil || ip == "" {
			return "", fmt.Errorf("serve: cannot tell which address peers reach this node at; set --advertise-addr (%v)", err)
		}
		host = ip
	}
	return net.JoinHostPort(host, port), nil
}

func (n *clusterNode) register(g *grpc.Server)    { n.node.Register(g) }
func (n *clusterNode) debugHandler() http.Handler { return n.node.DebugHandler() }

// drain hands this node's counters to their next owners and replicas,
// then leaves the cluster gracefully so peers stop forwarding here, all
// within ctx (--shutdown-timeout). The gRPC server keeps answering peers
// meanwhile: this node stays the owner of its keys until it has left.
func (n *clusterNode) drain(ctx context.Context) {
	start := time.Now()
	if err := n.node.Drain(ctx); err != nil {
		n.log.Warn("cluster drain incomplete", "err", err, "took", time.Since(start))
		return
	}
	n.log.Info("cluster drained", "took", time.Since(start))
}

func (n *clusterNode) close() {
	if n.keys != nil {
		n.keys.close()
	}
	if err := n.node.Close(); err != nil {
		n.log.Warn("cluster close", "err", err)
	}
}

// leaseTTL maps --lease-ttl to cluster.NodeConfig.LeaseTTL: 0 (off) is
// negative there, where 0 means the default.
func leaseTTL(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
