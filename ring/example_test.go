package ring_test

import (
	"fmt"

	"github.com/ringlimit/ringlimit/ring"
)

func Example() {
	r, err := ring.New([]string{"node-c", "node-a", "node-b"}, ring.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	key := []byte("user-42")
	owner, _ := r.Owner(key)
	fmt.Println("owner:", owner)
	fmt.Println("fail-over order:", r.Successors(key, 5, nil))
	fmt.Println("members:", r.Members())

	_, err = ring.New([]string{"node-a", "node-a"}, ring.Config{})
	fmt.Println(err)
	// Output:
	// owner: node-a
	// fail-over order: [node-a node-c node-b]
	// members: [node-a node-b node-c]
	// ring: duplicate member "node-a"
}

func ExampleRing_Partitions() {
	r, _ := ring.New([]string{"a", "b", "c", "d"}, ring.Config{Partitions: 101})
	fmt.Println(r.Partitions())
	// Output:
	// map[a:27 b:27 c:25 d:22]
}
