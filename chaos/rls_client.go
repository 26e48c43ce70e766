package chaos

import (
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial opens one long-lived gRPC connection, as Envoy holds to each host.
func Dial(addr string) (*grpc.ClientConn, pb.RateLimitServiceClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return conn, pb.NewRateLimitServiceClient(conn), nil
}

// Request builds a one-descriptor request from alternating key, value pairs.
func Request(domain string, kv ...string) *pb.RateLimitRequest {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}}
}
