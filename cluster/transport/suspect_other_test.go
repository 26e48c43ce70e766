//go:build !unix

package transport

import (
	"net"
	"testing"
)

// fwdRefusingAddr returns a loopback address nothing listens on (a closed
// listener's; on unix a bound socket keeps the port, see
// suspect_unix_test.go).
func fwdRefusingAddr(t testing.TB) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}
