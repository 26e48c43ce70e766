package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/bucket"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/cluster/membership"
)

// clusterNode is this process's part of a ringlimit cluster.
type clusterNode struct {
	node *cluster.Node
	c    *serveConfig
	log  *slog.Logger
}

// startCluster joins the cluster named by --join. grpcAddr is the bound gRPC
// listener; peers dial it at the advertised host, with dial (nil:
// plaintext). restore, if not nil, loads the counters saved in --data-dir:
// the node calls it before it syncs from its peers and goes ready.
func startCluster(c *serveConfig, grpcAddr string, store *bucket.Store, reg prometheus.Registerer, log *slog.Logger, dial []grpc.DialOption, restore func(context.Context) error) (*clusterNode, error) {
	adv, err := advertisedGRPC(c, grpcAddr)
	if err != nil {
		return nil, err
	}
	if c.nodeNameFromHost {
		log.Warn("cluster: --node-name not set: this node's identity is its hostname; two nodes on one host (or with one hostname) would claim the same identity, and the later one exits: give each node its own --node-name", "node_name", c.NodeName)
	}
	var key []byte
	if c.GossipKeyFile != "" {
		if key, err = readGossipKey(c.GossipKeyFile); err != nil {
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
			SecretKey:     key,
			Label:         c.ClusterName,
			Logger:        log,
		},
		Store:       store,
		Restore:     restore,
		Replicas:    c.Replicas,
		DialOptions: dial,
		Registerer:  reg,
		Logger:      log,
	})
	if err != nil {
		// memberlist reports a gossip port it cannot bind only in its
		// message ("failed to start TCP listener ...: listen tcp ...").
		if strings.Contains(err.Error(), "listen") {
			return nil, c.flagError("gossip-addr", err)
		}
		return nil, fmt.Errorf("serve: cluster: %w", err)
	}
	log.Info("cluster node started", "id", c.NodeName, "grpc_advertised", adv, "gossip", c.GossipAddr, "join", c.Join, "replicas", c.Replicas)
	return &clusterNode{node: n, c: c, log: log}, nil
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
	if err := n.node.Close(); err != nil {
		n.log.Warn("cluster close", "err", err)
	}
}

// readGossipKey reads a base64 AES key, as `openssl rand -base64 32` writes.
func readGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("serve: --gossip-key-file: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("serve: --gossip-key-file: %s: not base64: %w", path, err)
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("serve: --gossip-key-file: %s: key is %d bytes, want 16, 24 or 32", path, len(key))
}
