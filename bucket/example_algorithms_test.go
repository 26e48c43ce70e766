package bucket_test

import (
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/bucket"
)

func ExampleStore_Apply_slidingWindow() {
	s := bucket.NewStore(bucket.StoreConfig{})
	lim := bucket.Limit{Algorithm: bucket.SlidingWindow, Requests: 10, Unit: int64(time.Minute)}
	key := []byte("api_key=abc")
	minute := time.Unix(1_699_999_980, 0).UnixNano() // the start of a minute

	// 10 in the last second of a minute...
	r := s.Apply(minute-int64(time.Second), &bucket.Op{Key: key, Limit: lim, Hits: 10})
	fmt.Printf("over=%v count=%d remaining=%d\n", r.Over, r.Count, r.Remaining)
	// ...weigh fully at the start of the next: a fixed window would let 10 more through.
	r = s.Apply(minute, &bucket.Op{Key: key, Limit: lim, Hits: 1})
	fmt.Printf("over=%v count=%d retry in %v\n", r.Over, r.Count, time.Duration(r.ResetAfter))
	// 15 s in, they weigh ceil(10 * 45/60) = 8: two more fit.
	for range 3 {
		r = s.Apply(minute+int64(15*time.Second), &bucket.Op{Key: key, Limit: lim, Hits: 1})
		fmt.Printf("over=%v count=%d remaining=%d\n", r.Over, r.Count, r.Remaining)
	}
	// Output:
	// over=false count=10 remaining=0
	// over=true count=11 retry in 6s
	// over=false count=9 remaining=1
	// over=false count=10 remaining=0
	// over=true count=11 remaining=0
}

func ExampleStore_Apply_tokenBucket() {
	s := bucket.NewStore(bucket.StoreConfig{})
	// 10 per second, and up to 5 at once.
	lim := bucket.Limit{Algorithm: bucket.TokenBucket, Requests: 10, Unit: int64(time.Second), Burst: 5}
	key := []byte("api_key=abc")
	now := time.Unix(1_700_000_000, 0).UnixNano()

	for range 6 {
		r := s.Apply(now, &bucket.Op{Key: key, Limit: lim, Hits: 1})
		fmt.Printf("over=%v remaining=%d reset=%v\n", r.Over, r.Remaining, time.Duration(r.ResetAfter))
	}
	// One token comes back every 100 ms.
	r := s.Apply(now+int64(250*time.Millisecond), &bucket.Op{Key: key, Limit: lim, Hits: 1})
	fmt.Printf("over=%v remaining=%d reset=%v\n", r.Over, r.Remaining, time.Duration(r.ResetAfter))
	st, _ := s.Get(now, key)
	fmt.Println("full again at +", time.Duration(st.TAT-now))
	// Output:
	// over=false remaining=4 reset=100ms
	// over=false remaining=3 reset=200ms
	// over=false remaining=2 reset=300ms
	// over=false remaining=1 reset=400ms
	// over=false remaining=0 reset=500ms
	// over=true remaining=0 reset=100ms
	// over=false remaining=1 reset=350ms
	// full again at + 600ms
}

func ExampleMaxState() {
	minute := int64(time.Minute)
	w := time.Unix(1_699_999_980, 0).UnixNano()

	// Two replicas of a sliding window, one a window behind: the later
	// window wins and keeps the earlier window's count as its prev.
	a := bucket.State{Algorithm: bucket.SlidingWindow, Window: w, Unit: minute, Count: 9}
	b := bucket.State{Algorithm: bucket.SlidingWindow, Window: w + minute, Unit: minute, Count: 2, Prev: 4}
	m := bucket.MaxState(a, b)
	fmt.Println(m.Window == b.Window, m.Count, m.Prev)

	// Token buckets keep the later theoretical arrival time.
	x := bucket.State{Algorithm: bucket.TokenBucket, Unit: minute, TAT: w + 5}
	y := bucket.State{Algorithm: bucket.TokenBucket, Unit: minute, TAT: w + 7}
	fmt.Println(bucket.MaxState(x, y).TAT - w)
	// Output:
	// true 2 9
	// 7
}
