package simnet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"

	"github.com/ringlimit/ringlimit/cluster/simnet"
)

// Two hosts, a stream between them, a partition and a crash. In a test this
// runs inside synctest.Test, where latencies and timeouts cost no wall time.
func Example() {
	n := simnet.New(1, simnet.Config{})
	defer n.Close()
	a, _ := n.Host("10.0.0.1")
	b, _ := n.Host("10.0.0.2")

	l, _ := b.Listen(9000)
	c, _ := a.Dial(context.Background(), "10.0.0.2:9000")
	s, _ := l.Accept()
	fmt.Println(c.RemoteAddr(), s.LocalAddr())

	// Bytes written across a partition arrive at Heal, as TCP would
	// retransmit them.
	n.Partition([]string{"10.0.0.1"})
	c.Write([]byte("hello"))
	n.Heal()
	buf := make([]byte, 5)
	io.ReadFull(s, buf)
	fmt.Printf("%s\n", buf)

	// A crash resets the host's connections and refuses dials to it.
	n.Crash("10.0.0.2")
	_, err := c.Write([]byte("x"))
	fmt.Println(errors.Is(err, syscall.ECONNRESET))
	_, err = a.Dial(context.Background(), "10.0.0.2:9000")
	fmt.Println(errors.Is(err, syscall.ECONNREFUSED))
	// Output:
	// 10.0.0.2:9000 10.0.0.2:9000
	// hello
	// true
	// true
}
