package rls

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// LoadOptions changes how Load reads a config directory. The zero value is
// the reference's default.
type LoadOptions struct {
	// MergeDomains lets several files share a domain (the reference's
	// MERGE_DOMAIN_CONFIG): their top-level descriptors are merged into one
	// tree, and a descriptor defined twice is still an error. When false, a
	// domain in two files is an error.
	MergeDomains bool
	// IgnoreDotfiles mirrors the reference's RUNTIME_IGNOREDOTFILES. Load
	// skips files whose name starts with "." whatever its value (so the
	// Kubernetes ConfigMap entries "..data" and "..2026_..." and editor swap
	// files are never read); it exists so that settings carrying the
	// variable keep working.
	IgnoreDotfiles bool
}

// Parse parses one config file: file names it in errors and data is its
// content. It returns every problem found, joined with errors.Join (each a
// *FieldError); a file with any problem yields no Config.
//
// The format is envoyproxy/ratelimit's: a mapping with domain (required) and
// descriptors, each descriptor a mapping with key (required), value,
// rate_limit {unit, requests_per_unit, unlimited, name, replaces: [{name}]},
// shadow_mode, detailed_metric and nested descriptors. rate_limit may also
// have ringlimit's algorithm (fixed_window, the default, sliding_window or
// token_bucket, in any case) and burst (token_bucket only, at least 1,
// default requests_per_unit); a rule using them carries Rule.Extension. Units are second,
// minute, hour, day, week, month and year, in any case. A descriptor's
// quota_mode sets Rule.QuotaMode and its metadata Rule.Metadata; the newer
// reference field value_to_metric is accepted and ignored, and so are
// quota_mode and metadata inside rate_limit, as the reference does;
// share_threshold (only on a value containing '*', as the reference checks)
// makes every value the pattern matches count on one counter (see
// Rule.SharedCounter). Any other key is an error, at any level.
func Parse(file string, data []byte) (*Config, error) {
	b := cfgNewBuilder(false)
	b.addFile(file, data)
	return b.finish()
}

// Load reads a config file, or every regular file of a directory and of its
// subdirectories, at any depth (whatever the file's extension, following
// symlinks, in name order, depth first), skipping names that start with "."
// at every level, as envoyproxy/ratelimit reads its runtime directory. An
// empty directory gives an empty, valid Config. Errors are those of Parse
// for every file, joined, plus a duplicate domain across files when
// opt.MergeDomains is false.
func Load(path string, opt LoadOptions) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	b := cfgNewBuilder(opt.MergeDomains)
	if !st.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("rls: %w", err)
		}
		b.addFile(path, data)
		return b.finish()
	}
	var readErrs []error
	walkErrs := walkConfigDir(path, func(file string) {
		data, err := os.ReadFile(file)
		if err != nil {
			readErrs = append(readErrs, fmt.Errorf("rls: %w", err))
			return
		}
		b.addFile(file, data)
	}, nil)
	b.errs = append(append(walkErrs, readErrs...), b.errs...)
	return b.finish()
}

// A file may expand to at most cfgBaseNodes + cfgNodesPerByte*len(data)
// YAML mapping entries and descriptors, aliases included, so that a small
// file of nested aliases cannot take the process down; plain YAML never
// comes close. After cfgMaxErrors errors in one file the rest are counted,
// not listed.
const (
	cfgBaseNodes    = 1 << 16
	cfgNodesPerByte = 16
	cfgMaxErrors    = 100
	// cfgMaxDepth bounds descriptor nesting (Envoy sends far fewer entries)
	// and cfgMaxMerge the nesting of merge keys; both also stop cycles of
	// aliases early.
	cfgMaxDepth = 64
	cfgMaxMerge = 16
)

// cfgDesc is one parsed descriptor, before the tree is built.
type cfgDesc struct {
	path       string
	line       int
	key, value string
	rate       *cfgRate // nil: no rate_limit
	shadow     bool
	quota      bool             // quota_mode
	meta       *structpb.Struct // metadata; nil if none
	detailed   bool
	share      bool // share_threshold (value contains '*')
	children   []*cfgDesc
}

// cfgRate is one parsed rate_limit.
type cfgRate struct {
	unit      pb.RateLimitResponse_RateLimit_Unit
	rpu       uint32
	unlimited bool
	name      string
	replaces  []string
	ext       cfgExt // ringlimit's algorithm and burst (algorithm.go)
}

// cfgReplace is one parsed replaces entry.
type cfgReplace struct {
	path string
	line int
	name string
}

// cfgPair is one key of a YAML mapping with its value.
type cfgPair struct {
	key  string
	line int
	val  *yaml.Node
}

// cfgParser turns one file's YAML into cfgDescs, collecting every error.
type cfgParser struct {
	file   string
	errs   []*FieldError
	budget int
	merges int                 // merge keys being expanded
	seen   map[FieldError]bool // errors recorded: aliases repeat them
}

func (p *cfgParser) fail(path string, line int, format string, args ...any) {
	if p.budget <= 0 {
		return // the budget error says it all
	}
	e := FieldError{File: p.file, Path: path, Line: line, Msg: fmt.Sprintf(format, args...)}
	if p.seen[e] {
		return
	}
	if p.seen == nil {
		p.seen = make(map[FieldError]bool)
	}
	p.seen[e] = true
	p.errs = append(p.errs, &e)
}

// failYAML records a problem with the YAML itself; its message ends with
// the line.
func (p *cfgParser) failYAML(path string, line int, format string, args ...any) {
	p.fail(path, line, format+" (line %d)", append(args, line)...)
}

// spend counts one node against the budget; false once it is exhausted.
func (p *cfgParser) spend() bool {
	if p.budget <= 0 {
		return false
	}
	if p.budget == 1 {
		p.fail("", 0, "config expands to too many yaml nodes through aliases")
	}
	p.budget--
	return p.budget > 0
}

// deref follows aliases.
func (p *cfgParser) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func cfgIsNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// cfgKind describes a node for an error message.
func cfgKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		switch n.Tag {
		case "!!int":
			return "the integer " + v
		case "!!float":
			return "the number " + v
		case "!!bool":
			return "the boolean " + v
		case "!!null":
			return "null"
		}
		return strconv.Quote(v)
	}
	return "an unsupported yaml node"
}

func cfgJoin(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// pairs returns a mapping's keys and values, applying YAML merge keys ("<<")
// and rejecting duplicate keys. ok is false, with an error recorded, when n
// is not a mapping; a null node is an empty mapping.
func (p *cfgParser) pairs(n *yaml.Node, path string) (out []cfgPair, ok bool) {
	n = p.deref(n)
	if cfgIsNull(n) {
		return nil, true
	}
	if n.Kind != yaml.MappingNode {
		p.failYAML(path, n.Line, "expected a mapping, got %s", cfgKind(n))
		return nil, false
	}
	seen := make(map[string]int) // key -> line
	var merged []cfgPair
	for i := 0; i+1 < len(n.Content); i += 2 {
		if !p.spend() {
			return nil, false
		}
		k, v := p.deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.failYAML(path, k.Line, "key is not a string: got %s", cfgKind(k))
			continue
		}
		if k.Tag == "!!merge" {
			if p.merges >= cfgMaxMerge {
				p.failYAML(path, k.Line, "merge keys nested deeper than %d levels", cfgMaxMerge)
				continue
			}
			p.merges++
			merged = append(merged, p.mergePairs(v, path)...)
			p.merges--
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.failYAML(cfgJoin(path, k.Value), k.Line, "duplicate key '%s', first at line %d", k.Value, first)
			continue
		}
		seen[k.Value] = k.Line
		out = append(out, cfgPair{key: k.Value, line: k.Line, val: v})
	}
	for _, m := range merged { // explicit keys win; earlier merges win
		if _, dup := seen[m.key]; !dup {
			seen[m.key] = m.line
			out = append(out, m)
		}
	}
	return out, true
}

// mergePairs returns the pairs a "<<" value brings: a mapping or a list of
// mappings, the first of which wins.
func (p *cfgParser) mergePairs(v *yaml.Node, path string) []cfgPair {
	v = p.deref(v)
	if v != nil && v.Kind == yaml.SequenceNode {
		var out []cfgPair
		seen := make(map[string]bool)
		for _, m := range v.Content {
			ps, _ := p.pairs(m, path)
			for _, pr := range ps {
				if !seen[pr.key] {
					seen[pr.key] = true
					out = append(out, pr)
				}
			}
		}
		return out
	}
	ps, _ := p.pairs(v, path)
	return ps
}

// str decodes a string field. Any scalar is taken as written ("1.0" stays
// "1.0"); null is "".
func (p *cfgParser) str(n *yaml.Node, path string) string {
	n = p.deref(n)
	if cfgIsNull(n) {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		p.failYAML(path, n.Line, "expected a string, got %s", cfgKind(n))
		return ""
	}
	return n.Value
}

// boolean decodes a boolean field; null is false.
func (p *cfgParser) boolean(n *yaml.Node, path string) bool {
	n = p.deref(n)
	if cfgIsNull(n) {
		return false
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.failYAML(path, n.Line, "expected true or false, got %s", cfgKind(n))
		return false
	}
	return b
}

// uint32 decodes requests_per_unit; null is 0.
func (p *cfgParser) uint32(n *yaml.Node, path string) uint32 {
	n = p.deref(n)
	if cfgIsNull(n) {
		return 0
	}
	var u uint32
	ok := n.Kind == yaml.ScalarNode && n.Decode(&u) == nil
	if ok && n.Tag == "!!float" { // 1e3 is fine, 1.5 is not
		var f float64
		ok = n.Decode(&f) == nil && f == float64(u)
	}
	if !ok {
		p.failYAML(path, n.Line, "expected an integer from 0 to 4294967295, got %s", cfgKind(n))
		return 0
	}
	return u
}

// list decodes a list field; null is an empty list.
func (p *cfgParser) list(n *yaml.Node, path string) []*yaml.Node {
	n = p.deref(n)
	if cfgIsNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.failYAML(path, n.Line, "expected a list, got %s", cfgKind(n))
		return nil
	}
	return n.Content
}

// parseFile parses a whole file; it returns the domain ("" if missing or bad)
// and the top-level descriptors.
func (p *cfgParser) parseFile(data []byte) (domain string, domainLine int, descs []*cfgDesc) {
	var doc yaml.Node
	if err := cfgUnmarshal(data, &doc); err != nil {
		line, msg := cfgSyntaxError(err, data)
		if line > 0 {
			p.fail("", line, "invalid yaml: line %d: %s", line, msg)
		} else {
			p.fail("", 0, "invalid yaml: %s", msg)
		}
		return "", 0, nil
	}
	var root *yaml.Node // nil for an empty file: an empty mapping
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	return p.parseRoot(root)
}

// parseRoot parses a file's top-level mapping (nil: an empty file).
func (p *cfgParser) parseRoot(root *yaml.Node) (domain string, domainLine int, descs []*cfgDesc) {
	ps, ok := p.pairs(root, "")
	if !ok {
		return "", 0, nil
	}
	domainOK := true
	for _, pr := range ps {
		switch pr.key {
		case "domain":
			n := len(p.errs)
			domain, domainLine = p.str(pr.val, "domain"), pr.line
			domainOK = len(p.errs) == n
		case "descriptors":
			descs = p.descriptors(pr.val, "descriptors", 1)
		default:
			p.failYAML(pr.key, pr.line, "unknown key '%s'", pr.key)
		}
	}
	if domain == "" && domainOK {
		p.fail("domain", domainLine, "config file cannot have empty domain")
	}
	return domain, domainLine, descs
}

// cfgParserProblems are the syntax errors yaml.v3's parser reports, as
// opposed to its scanner. yaml.v3 (v3.0.1) prints the line of a scanner
// error 1-based but a parser error's 0-based, and leaves the line out when
// the mark it reports is on the first line (0): cfgSyntaxError corrects both.
var cfgParserProblems = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// cfgSyntaxError turns a yaml.v3 syntax error ("yaml: line N: problem")
// into the 1-based line yaml.v3 means (where the construct it was parsing
// began, else where it found the problem; at most the file's last line) and
// the problem. line is 0 for an error that is not about a place in the
// file.
func cfgSyntaxError(err error, data []byte) (line int, msg string) {
	msg = strings.ReplaceAll(strings.TrimPrefix(err.Error(), "yaml: "), "\n", " ")
	if !strings.HasPrefix(err.Error(), "yaml: ") {
		return 0, msg // the decoder panicked, or not a syntax error
	}
	problem := msg
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		digits, after, found := strings.Cut(rest, ": ")
		n, convErr := strconv.Atoi(digits)
		if !found || convErr != nil {
			return 0, msg
		}
		line, problem = n, after
	}
	switch {
	case cfgParserProblems[problem]:
		line++ // 0-based; 0 was left out
	case line == 0 && cfgReaderProblem(problem):
		return 0, problem // bad bytes: yaml.v3 gives no place
	case line == 0:
		line = 1 // a scanner error on the first line
	}
	if last := cfgLastLine(data); line > last {
		line = last // the end of the file
	}
	return line, problem
}

// cfgReaderProblem reports whether problem is one of yaml.v3's reader
// errors (an encoding problem, reported without a line).
func cfgReaderProblem(problem string) bool {
	for _, p := range []string{"control characters are not allowed", "invalid Unicode character", "input error",
		"UTF-8", "UTF-16", "surrogate"} {
		if strings.Contains(problem, p) {
			return true
		}
	}
	return false
}

// cfgLastLine is the 1-based number of the file's last line holding any
// character (1 for an empty file).
func cfgLastLine(data []byte) int {
	return bytes.Count(bytes.TrimRight(data, "\n"), []byte("\n")) + 1
}

// cfgUnmarshal is yaml.Unmarshal with a panic in the decoder turned into an
// error.
func cfgUnmarshal(data []byte, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml decoder failed: %v", r)
		}
	}()
	return yaml.Unmarshal(data, n)
}

// descriptors parses a descriptors list at a depth (1 for the top level).
func (p *cfgParser) descriptors(n *yaml.Node, path string, depth int) []*cfgDesc {
	items := p.list(n, path)
	if len(items) > 0 && depth > cfgMaxDepth {
		p.failYAML(path, p.deref(n).Line, "descriptors nested deeper than %d levels", cfgMaxDepth)
		return nil
	}
	var out []*cfgDesc
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		if d := p.descriptor(item, ipath, depth); d != nil {
			out = append(out, d)
		}
	}
	return out
}

// descriptor parses one descriptor mapping; nil if it is not a mapping.
func (p *cfgParser) descriptor(n *yaml.Node, path string, depth int) *cfgDesc {
	if !p.spend() {
		return nil
	}
	ps, ok := p.pairs(n, path)
	if !ok {
		return nil
	}
	d := &cfgDesc{path: path, line: p.deref(n).Line}
	var shareLine int
	keyOK := true
	for _, pr := range ps {
		fp := cfgJoin(path, pr.key)
		switch pr.key {
		case "key":
			n := len(p.errs)
			d.key = p.str(pr.val, fp)
			keyOK = len(p.errs) == n
		case "value":
			d.value = p.str(pr.val, fp)
		case "rate_limit":
			d.rate = p.rateLimit(pr.val, fp)
		case "descriptors":
			d.children = p.descriptors(pr.val, fp, depth+1)
		case "shadow_mode":
			d.shadow = p.boolean(pr.val, fp)
		case "detailed_metric":
			d.detailed = p.boolean(pr.val, fp)
		case "value_to_metric":
			p.boolean(pr.val, fp) // accepted, ignored
		case "share_threshold":
			d.share, shareLine = p.boolean(pr.val, fp), pr.line
		case "quota_mode":
			d.quota = p.boolean(pr.val, fp)
		case "metadata":
			d.meta = p.metadata(pr.val, fp)
		default:
			p.failYAML(fp, pr.line, "unknown key '%s'", pr.key)
		}
	}
	if d.key == "" && keyOK {
		p.fail(path, d.line, "descriptor has empty key")
	}
	if d.share && !strings.Contains(d.value, "*") {
		p.fail(cfgJoin(path, "share_threshold"), shareLine,
			"share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", cfgComposite(d.key, d.value))
	}
	return d
}

// rateLimit parses a rate_limit mapping; nil when it is null (the
// reference treats "rate_limit:" with nothing as no limit) or not a mapping.
func (p *cfgParser) rateLimit(n *yaml.Node, path string) *cfgRate {
	if cfgIsNull(p.deref(n)) {
		return nil
	}
	ps, ok := p.pairs(n, path)
	if !ok {
		return nil
	}
	r := &cfgRate{}
	var unit string
	unitLine := p.deref(n).Line
	var replaces []cfgReplace
	for _, pr := range ps {
		fp := cfgJoin(path, pr.key)
		switch pr.key {
		case "unit":
			unit, unitLine = p.str(pr.val, fp), pr.line
		case "requests_per_unit":
			r.rpu = p.uint32(pr.val, fp)
		case "unlimited":
			r.unlimited = p.boolean(pr.val, fp)
		case "name":
			r.name = p.str(pr.val, fp)
		case "replaces":
			for i, item := range p.list(pr.val, fp) {
				ipath := fmt.Sprintf("%s[%d]", fp, i)
				ips, ok := p.pairs(item, ipath)
				if !ok {
					continue
				}
				name := ""
				for _, ipr := range ips {
					if ipr.key == "name" {
						name = p.str(ipr.val, cfgJoin(ipath, "name"))
					} else {
						p.failYAML(cfgJoin(ipath, ipr.key), ipr.line, "unknown key '%s'", ipr.key)
					}
				}
				replaces = append(replaces, cfgReplace{path: ipath, line: p.deref(item).Line, name: name})
			}
		case "algorithm", "burst":
			p.rateExt(&r.ext, pr, fp)
		case "quota_mode", "metadata":
			// Keys the reference allows here but ignores (they belong to
			// the descriptor): accepted, ignored, not checked.
		default:
			p.failYAML(fp, pr.line, "unknown key '%s'", pr.key)
		}
	}

	v, known := pb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)]
	valid := known && v != int32(pb.RateLimitResponse_RateLimit_UNKNOWN)
	switch {
	case r.unlimited && valid:
		p.fail(cfgJoin(path, "unit"), unitLine, "should not specify rate limit unit when unlimited")
	case r.unlimited:
		// The reference ignores any other unit when unlimited.
	case !valid:
		p.fail(cfgJoin(path, "unit"), unitLine, "invalid rate limit unit '%s'", unit)
	default:
		r.unit = pb.RateLimitResponse_RateLimit_Unit(v)
	}
	for _, rp := range replaces {
		switch {
		case rp.name == "":
			p.fail(rp.path, rp.line, "should not have an empty replaces entry")
		case rp.name == r.name:
			p.fail(rp.path, rp.line, "replaces should not contain name of same descriptor")
		}
		r.replaces = append(r.replaces, rp.name)
	}
	p.checkRateExt(path, r)
	return r
}

// cfgComposite is the reference's name for a descriptor at one level: "key"
// or "key_value".
func cfgComposite(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

// cfgBuilder assembles parsed files into a Config.
type cfgBuilder struct {
	merge   bool
	domains map[string]*cfgDomain
	errs    []error
}

// cfgDomain is a domain being built.
type cfgDomain struct {
	dom   *Domain
	rules []*Rule
	seen  map[*matchNode]map[string]bool // composite keys taken, per level
}

func cfgNewBuilder(merge bool) *cfgBuilder {
	return &cfgBuilder{merge: merge, domains: make(map[string]*cfgDomain)}
}

// addFile parses one file and adds it to the config being built, recording
// its errors in line order.
func (b *cfgBuilder) addFile(file string, data []byte) {
	p := &cfgParser{file: file, budget: cfgBaseNodes + cfgNodesPerByte*len(data)}
	domain, domainLine, descs := p.parseFile(data)
	b.add(p, domain, domainLine, descs)
}

// addNode adds a config given as a YAML node tree rather than as text (the
// xDS resources, see xds_convert.go), through the same parser and checks
// as a file; nodes is how many nodes the tree has, its budget.
func (b *cfgBuilder) addNode(file string, root *yaml.Node, nodes int) {
	p := &cfgParser{file: file, budget: cfgBaseNodes + nodes}
	domain, domainLine, descs := p.parseRoot(root)
	b.add(p, domain, domainLine, descs)
}

// add adds one parsed file to the config being built.
func (b *cfgBuilder) add(p *cfgParser, domain string, domainLine int, descs []*cfgDesc) {
	file := p.file
	if domain != "" && p.budget > 0 {
		cd := b.domains[domain]
		switch {
		case cd == nil:
			cd = &cfgDomain{dom: &Domain{name: domain}, seen: make(map[*matchNode]map[string]bool)}
			b.domains[domain] = cd
			b.insert(p, cd, &cd.dom.root, domain+".", false, descs)
		case !b.merge:
			p.fail("domain", domainLine, "duplicate domain '%s' in config file", domain)
		default:
			b.insert(p, cd, &cd.dom.root, domain+".", false, descs)
		}
	}
	slices.SortStableFunc(p.errs, func(x, y *FieldError) int { return x.Line - y.Line })
	for i, e := range p.errs {
		if i == cfgMaxErrors {
			b.errs = append(b.errs, &FieldError{File: file, Msg: fmt.Sprintf("%d more errors", len(p.errs)-i)})
			break
		}
		b.errs = append(b.errs, e)
	}
}

// insert adds descriptors under parent; prefix is the parent's stat key
// followed by "."; shared is true when a descriptor on the path to parent
// has share_threshold.
func (b *cfgBuilder) insert(p *cfgParser, cd *cfgDomain, parent *matchNode, prefix string, shared bool, descs []*cfgDesc) {
	for _, d := range descs {
		if d.key == "" {
			continue // reported by the parser
		}
		comp := cfgComposite(d.key, d.value)
		statKey := prefix + comp
		seen := cd.seen[parent]
		if seen == nil {
			seen = make(map[string]bool)
			cd.seen[parent] = seen
		}
		if seen[comp] {
			p.fail(d.path, d.line, "duplicate descriptor composite key '%s'", statKey)
			continue
		}
		seen[comp] = true
		n := &matchNode{}
		if d.share {
			n.share = d.value
		}
		shared := shared || d.share
		if r := d.rate; r != nil {
			rule := &Rule{
				Domain:          cd.dom.name,
				StatKey:         statKey,
				Name:            r.name,
				Replaces:        r.replaces,
				Unlimited:       r.unlimited,
				Unit:            r.unit,
				RequestsPerUnit: r.rpu,
				ShadowMode:      d.shadow,
				QuotaMode:       d.quota,
				Metadata:        d.meta,
				DetailedMetric:  d.detailed,
				SharedCounter:   shared,
			}
			if !r.unlimited {
				rule.Limit = r.ext.limit(r.rpu, UnitDuration(r.unit))
				rule.counterTag = counterTag(rule.Limit)
			}
			rule.Extension = r.ext.warning(p.file, cfgJoin(d.path, "rate_limit"))
			n.rule = rule
			cd.rules = append(cd.rules, rule)
		}
		parent.add(d.key, d.value, n)
		b.insert(p, cd, n, statKey+".", shared, d.children)
	}
}

// finish returns the Config, or every error found.
func (b *cfgBuilder) finish() (*Config, error) {
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	c := &Config{domains: make(map[string]*Domain, len(b.domains))}
	for name, cd := range b.domains {
		c.domains[name] = cd.dom
		c.names = append(c.names, name)
	}
	slices.Sort(c.names)
	var dump strings.Builder
	for _, name := range c.names {
		for _, r := range b.domains[name].rules {
			r.Index = len(c.rules)
			c.rules = append(c.rules, r)
			cfgDumpRule(&dump, r)
		}
	}
	c.dump = dump.String()
	return c, nil
}
