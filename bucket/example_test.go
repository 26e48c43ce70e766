package bucket_test

import (
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

func ExampleStore_Apply() {
	s := bucket.NewStore(bucket.StoreConfig{})
	lim := bucket.Limit{Requests: 3, Unit: int64(time.Minute)}
	op := bucket.Op{Key: []byte("api_key=abc"), Limit: lim, Hits: 1}

	// 20 s into a minute window (Unix seconds 1,700,000,000 is 20 s past a minute).
	now := time.Unix(1_700_000_000, 0).UnixNano()
	for range 4 {
		r := s.Apply(now, &op)
		fmt.Printf("over=%v count=%d remaining=%d reset=%v\n", r.Over, r.Count, r.Remaining, time.Duration(r.ResetAfter))
	}

	// The next window starts from zero.
	r := s.Apply(now+int64(40*time.Second), &op)
	fmt.Printf("over=%v count=%d remaining=%d reset=%v\n", r.Over, r.Count, r.Remaining, time.Duration(r.ResetAfter))
	// Output:
	// over=false count=1 remaining=2 reset=40s
	// over=false count=2 remaining=1 reset=40s
	// over=false count=3 remaining=0 reset=40s
	// over=true count=4 remaining=0 reset=40s
	// over=false count=1 remaining=2 reset=1m0s
}

func ExampleStore_Apply_stopOnOver() {
	s := bucket.NewStore(bucket.StoreConfig{})
	now := int64(0)
	lim := bucket.Limit{Requests: 10, Unit: int64(time.Second)}
	key := []byte("k")

	s.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 8})
	r := s.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 5, Mode: bucket.StopOnOver})
	fmt.Println("stop on over:", r.Over, r.Count)
	r = s.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 2, Mode: bucket.Peek})
	fmt.Println("peek:", r.Over, r.Count)
	r = s.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 0})
	fmt.Println("check:", r.Over, r.Count, r.Remaining)
	// Output:
	// stop on over: true 13
	// peek: false 10
	// check: false 8 2
}

func ExampleStore_Merge() {
	s := bucket.NewStore(bucket.StoreConfig{})
	now := time.Unix(1_700_000_000, 0).UnixNano()
	window := now - now%int64(time.Minute)
	key := []byte("k")

	fmt.Println(s.Merge(now, key, bucket.State{Window: window, Unit: int64(time.Minute), Count: 7}))
	fmt.Println(s.Merge(now, key, bucket.State{Window: window, Unit: int64(time.Minute), Count: 5}))
	st, _ := s.Get(now, key)
	fmt.Println(st.Count)
	// Output:
	// true
	// false
	// 7
}
