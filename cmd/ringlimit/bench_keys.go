package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// maxBenchKeys bounds --keys: {ip} maps key k to 10.0.0.0/8 + k + 1.
const maxBenchKeys = 1<<24 - 2

// keyChooser picks the key index, in [0, keys), of the next request. Each
// bench worker owns one; it is not safe for concurrent use.
type keyChooser interface {
	next() int
}

// uniformKeys picks every key with the same probability.
type uniformKeys struct {
	r *rand.Rand
	n int
}

func (u *uniformKeys) next() int { return u.r.IntN(u.n) }

// zipfKeys picks key k with probability proportional to 1/(k+1)^s: key 0 is
// the hottest.
type zipfKeys struct{ z *rand.Zipf }

func (z *zipfKeys) next() int { return int(z.z.Uint64()) }

// constKey is the one key when --keys is 1.
type constKey struct{}

func (constKey) next() int { return 0 }

// newKeyChooser returns worker w's chooser, seeded from (seed, w) so a run
// with the same flags sends the same keys in the same order per worker.
// dist is "uniform" or "zipf"; s (> 1) is the zipf exponent.
func newKeyChooser(dist string, keys int, s float64, seed uint64, w int) (keyChooser, error) {
	if keys < 1 || keys > maxBenchKeys {
		return nil, fmt.Errorf("bench: --keys: %d is not in [1, %d]", keys, maxBenchKeys)
	}
	r := rand.New(rand.NewPCG(seed, uint64(w)))
	switch dist {
	case "uniform":
		if keys == 1 {
			return constKey{}, nil
		}
		return &uniformKeys{r: r, n: keys}, nil
	case "zipf":
		if !(s > 1) {
			return nil, fmt.Errorf("bench: --zipf-s: %v must be > 1", s)
		}
		if keys == 1 {
			return constKey{}, nil
		}
		return &zipfKeys{z: rand.NewZipf(r, s, 1, uint64(keys-1))}, nil
	}
	return nil, fmt.Errorf("bench: --dist: unknown distribution %q (uniform, zipf)", dist)
}

// templatePart is a literal or a placeholder of a descriptor value.
type templatePart struct {
	lit  string
	kind byte // 0: literal, 'i': {ip}, 'k': {key}
}

// templateEntry is one k=v of a descriptor template.
type templateEntry struct {
	key   string
	value string         // the whole value when it has no placeholder
	parts []templatePart // nil when value is constant
}

// descTemplate is the request a bench sends, with {ip} and {key} in
// descriptor values replaced by the chosen key. It is immutable once parsed.
type descTemplate struct {
	domain string
	hits   uint32
	descs  [][]templateEntry
}

// parseTemplate reads --descriptor values ("k=v,k2=v2", one per
// descriptor). In a value, {ip} becomes an IPv4 address (key k is
// 10.0.0.0 + k + 1) and {key} the key's decimal index; any other {word} is
// an error.
func parseTemplate(domain string, hits uint, descs []string) (*descTemplate, error) {
	if domain == "" {
		return nil, errors.New("bench: --domain: empty")
	}
	if len(descs) == 0 {
		return nil, errors.New("bench: --descriptor: none given")
	}
	if hits > 1<<32-1 {
		return nil, fmt.Errorf("bench: --hits: %d does not fit in 32 bits", hits)
	}
	t := &descTemplate{domain: domain, hits: uint32(hits)}
	for di, s := range descs {
		var d []templateEntry
		for _, part := range strings.Split(s, ",") {
			k, v, _ := strings.Cut(part, "=")
			if k == "" {
				return nil, fmt.Errorf("bench: --descriptor[%d] %q: empty key", di, s)
			}
			parts, err := splitPlaceholders(v)
			if err != nil {
				return nil, fmt.Errorf("bench: --descriptor[%d] %q: %w", di, s, err)
			}
			e := templateEntry{key: k, value: v}
			if len(parts) > 1 || (len(parts) == 1 && parts[0].kind != 0) {
				e.parts = parts
			}
			d = append(d, e)
		}
		t.descs = append(t.descs, d)
	}
	return t, nil
}

// descriptors returns the template's descriptors as --descriptor takes
// them ("k=v,k2=v2", {ip} and {key} unexpanded).
func (t *descTemplate) descriptors() []string {
	out := make([]string, 0, len(t.descs))
	for _, d := range t.descs {
		entries := make([]string, 0, len(d))
		for _, e := range d {
			entries = append(entries, e.key+"="+e.value)
		}
		out = append(out, strings.Join(entries, ","))
	}
	return out
}

// splitPlaceholders splits a value into literals and {ip}/{key}.
func splitPlaceholders(v string) ([]templatePart, error) {
	var out []templatePart
	for v != "" {
		i := strings.IndexByte(v, '{')
		if i < 0 {
			out = append(out, templatePart{lit: v})
			break
		}
		j := strings.IndexByte(v[i:], '}')
		if j < 0 {
			out = append(out, templatePart{lit: v})
			break
		}
		if i > 0 {
			out = append(out, templatePart{lit: v[:i]})
		}
		switch name := v[i+1 : i+j]; name {
		case "ip":
			out = append(out, templatePart{kind: 'i'})
		case "key":
			out = append(out, templatePart{kind: 'k'})
		default:
			return nil, fmt.Errorf("unknown placeholder {%s} (use {ip} or {key})", name)
		}
		v = v[i+j+1:]
	}
	return out, nil
}

// appendKeyIP appends key k as an IPv4 address in 10.0.0.0/8.
func appendKeyIP(b []byte, k int) []byte {
	a := uint32(10)<<24 | uint32(k+1)&(1<<24-1)
	b = strconv.AppendUint(b, uint64(a>>24), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(a>>16&255), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(a>>8&255), 10)
	b = append(b, '.')
	return strconv.AppendUint(b, uint64(a&255), 10)
}

// expand returns entry e's value for key k, using buf as scratch.
func (e *templateEntry) expand(buf []byte, k int) (string, []byte) {
	if e.parts == nil {
		return e.value, buf
	}
	buf = buf[:0]
	for _, p := range e.parts {
		switch p.kind {
		case 'i':
			buf = appendKeyIP(buf, k)
		case 'k':
			buf = strconv.AppendInt(buf, int64(k), 10)
		default:
			buf = append(buf, p.lit...)
		}
	}
	return string(buf), buf
}

// newRequest builds a request shaped like the template, for one worker to
// refill with fill before every call (gRPC does not keep a unary request
// after the call returns).
func (t *descTemplate) newRequest() *pb.RateLimitRequest {
	req := &pb.RateLimitRequest{Domain: t.domain, HitsAddend: t.hits}
	for _, d := range t.descs {
		desc := &rlv3.RateLimitDescriptor{}
		for _, e := range d {
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e.key, Value: e.value})
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	return req
}

// fill sets req's values for key k; req came from newRequest. buf is
// scratch and is returned for reuse.
func (t *descTemplate) fill(req *pb.RateLimitRequest, k int, buf []byte) []byte {
	for i, d := range t.descs {
		for j := range d {
			if d[j].parts == nil {
				continue
			}
			req.Descriptors[i].Entries[j].Value, buf = d[j].expand(buf, k)
		}
	}
	return buf
}
