package ring

import (
	"strconv"
	"testing"
)

var benchSizes = []int{3, 50, 500}

func BenchmarkOwner(b *testing.B) {
	keys := testKeys(1024)
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r := mustNew(b, nodeIDs("node", n), Config{})
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, _ = r.Owner(keys[i&1023])
				i++
			}
		})
	}
}

func BenchmarkSuccessors(b *testing.B) {
	keys := testKeys(1024)
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n)+"/n=3", func(b *testing.B) {
			r := mustNew(b, nodeIDs("node", n), Config{})
			dst := make([]string, 0, 3)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				dst = r.Successors(keys[i&1023], 3, dst[:0])
				i++
			}
		})
	}
}

func BenchmarkNew(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			ids := nodeIDs("node", n)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(ids, Config{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
