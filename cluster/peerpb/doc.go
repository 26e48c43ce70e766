// Package peerpb holds the generated Go code for ringlimit's node-to-node
// gRPC protocol (peer.proto, package ringlimit.peer.v1): the Peer service
// with Decide, Ping, Replicate and Sync. Regenerate with the command at the top of
// peer.proto; do not edit the .pb.go files by hand. The generated messages
// are not safe for concurrent mutation; the client and server stubs are safe
// for concurrent use.
package peerpb
