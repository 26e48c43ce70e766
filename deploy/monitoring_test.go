package deploy_test

// The monitoring kit (monitoring/): the Grafana dashboard, the alerting
// rules in both formats and the runbook they link. Every PromQL expression
// is parsed with Prometheus's own parser, and every metric and label value
// it selects is checked against the /metrics of a real `ringlimit serve`.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	monitoringDir  = "monitoring"
	dashboardFile  = "monitoring/grafana-dashboard.json"
	rulesFile      = "monitoring/prometheus-rules.yaml"
	promRuleFile   = "monitoring/prometheusrule.yaml"
	runbookFile    = "../docs/runbook.md"
	runbookURLBase = "https://github.com/ringlimit/ringlimit/blob/main/docs/runbook.md#"
)

// ruleGroups is a Prometheus rule file (and a PrometheusRule's spec), with
// the fields Prometheus accepts; decoding into it strictly catches misspelt
// keys.
type ruleGroups struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert         string            `json:"alert,omitempty"`
	Record        string            `json:"record,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule
// (monitoring.coreos.com/v1).
type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       ruleGroups        `json:"spec"`
}

func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var g ruleGroups
	if err := decodeStrictInto(data, &g); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return g
}

func loadPrometheusRule(t *testing.T) prometheusRule {
	t.Helper()
	data, err := os.ReadFile(promRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := decodeStrictInto(data, &pr); err != nil {
		t.Fatalf("%s: %v", promRuleFile, err)
	}
	return pr
}

// TestPrometheusRuleMatchesRuleFile: the PrometheusRule is the plain rule
// file's groups, unchanged, in an Operator object.
func TestPrometheusRuleMatchesRuleFile(t *testing.T) {
	pr := loadPrometheusRule(t)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Name == "" {
		t.Errorf("%s: %s %s %q", promRuleFile, pr.APIVersion, pr.Kind, pr.Metadata.Name)
	}
	if !reflect.DeepEqual(pr.Spec, loadRules(t)) {
		t.Errorf("%s's spec differs from %s: keep the two rule sets identical", promRuleFile, rulesFile)
	}
}

// TestAlertRules: every alert parses, has a severity, a summary, a
// description and a runbook_url to its own entry in docs/runbook.md, and the
// runbook has an entry for every alert and none for an alert that does not
// exist.
func TestAlertRules(t *testing.T) {
	g := loadRules(t)
	anchors := runbookAnchors(t)
	alerts := map[string]bool{}
	stub := template.FuncMap{}
	for _, f := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp", "printf", "title", "toUpper", "toLower", "reReplaceAll", "first", "value", "label"} {
		stub[f] = func(...any) any { return nil }
	}
	for _, grp := range g.Groups {
		if len(grp.Rules) == 0 {
			t.Errorf("group %q has no rules", grp.Name)
		}
		for _, r := range grp.Rules {
			name := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("%s: a rule needs exactly one of alert and record", rulesFile)
				continue
			}
			if _, err := parseExpr(r.Expr); err != nil {
				t.Errorf("%s: %s: expr: %v", rulesFile, name, err)
			}
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if _, err := model.ParseDuration(d); d != "" && err != nil {
					t.Errorf("%s: %s: %v", rulesFile, name, err)
				}
			}
			if r.Record != "" {
				continue
			}
			if alerts[r.Alert] {
				t.Errorf("%s: alert %s defined twice", rulesFile, r.Alert)
			}
			alerts[r.Alert] = true
			if sev := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, sev) {
				t.Errorf("%s: %s: severity %q, want critical, warning or info", rulesFile, r.Alert, sev)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: %s: no %s annotation", rulesFile, r.Alert, a)
				}
			}
			for a, text := range r.Annotations {
				if _, err := template.New(a).Funcs(stub).Parse("{{$labels := .Labels}}{{$value := .Value}}" + text); err != nil {
					t.Errorf("%s: %s: annotation %s: %v", rulesFile, r.Alert, a, err)
				}
			}
			if want := runbookURLBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: %s: runbook_url %q, want %q", rulesFile, r.Alert, r.Annotations["runbook_url"], want)
			}
			if !anchors[strings.ToLower(r.Alert)] {
				t.Errorf("docs/runbook.md has no entry (### %s) for the alert", r.Alert)
			}
		}
	}
	dep, err := os.ReadFile(filepath.Join(repoRoot, "docs/deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range sortedKeys(alerts) {
		if !strings.Contains(string(dep), "| `"+a+"` |") {
			t.Errorf("docs/deployment.md's table of alerts does not list %s", a)
		}
	}
	for a := range anchors {
		if strings.HasPrefix(a, "ringlimit") && !alerts[alertNamed(a, alerts)] {
			t.Errorf("docs/runbook.md has an entry %q for no alert", a)
		}
	}
	if len(alerts) < 8 {
		t.Errorf("%d alerts", len(alerts))
	}
}

// A node counts its start-up sync before Prometheus first scrapes it, as a
// rule (its pod is found and scraped seconds after it starts, and the sync
// is over 1.5 s after it joined). The series then appears at 1, and
// increase() over a window that begins with that first sample is 0: an
// alert on a counter that moves at start must also catch a series that is
// new and already above zero (x > 0 unless x offset <window>).
func TestAlertsSeeCountsMadeBeforeTheFirstScrape(t *testing.T) {
	atStart := map[string]string{"RinglimitPartialSync": "ringlimit_syncs_total"}
	g := loadRules(t)
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			metric, ok := atStart[r.Alert]
			if !ok {
				continue
			}
			delete(atStart, r.Alert)
			e, err := parseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			found := false
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				b, ok := n.(*parser.BinaryExpr)
				if !ok || b.Op != parser.LUNLESS {
					return nil
				}
				parser.Inspect(b.RHS, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok && vs.Name == metric && vs.OriginalOffset > 0 {
						found = true
					}
					return nil
				})
				return nil
			})
			if !found {
				t.Errorf("%s: %s misses a %s series first scraped above zero (a count made at start): add `or (%s... > 0 unless %s... offset <window>)`",
					rulesFile, r.Alert, metric, metric, metric)
			}
		}
	}
	for a := range atStart {
		t.Errorf("%s: no alert %s", rulesFile, a)
	}
}

// Every pod restarted in a rolling update rebuilds each other node's ring
// twice (it leaves, then joins again), so a fixed threshold on ring
// rebuilds fires on every rollout of a large enough cluster: the
// threshold of RinglimitRingFlapping grows with the number of nodes.
func TestRingFlappingThresholdScalesWithTheCluster(t *testing.T) {
	g := loadRules(t)
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			if r.Alert != "RinglimitRingFlapping" {
				continue
			}
			e, err := parseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			b, ok := e.(*parser.BinaryExpr)
			if !ok || b.Op != parser.GTR {
				t.Fatalf("%s: %s is not a > comparison", rulesFile, r.Expr)
			}
			counts := false
			parser.Inspect(b.RHS, func(n parser.Node, _ []parser.Node) error {
				if a, ok := n.(*parser.AggregateExpr); ok && a.Op == parser.COUNT {
					parser.Inspect(a.Expr, func(n parser.Node, _ []parser.Node) error {
						if vs, ok := n.(*parser.VectorSelector); ok && vs.Name == "ringlimit_node_ready" {
							counts = true
						}
						return nil
					})
				}
				return nil
			})
			if !counts {
				t.Errorf("%s: RinglimitRingFlapping's threshold (%s) does not count the cluster's nodes", rulesFile, b.RHS)
			}
			return
		}
	}
	t.Fatalf("%s: no alert RinglimitRingFlapping", rulesFile)
}

// alertNamed is the alert whose anchor is a, or "".
func alertNamed(a string, alerts map[string]bool) string {
	for name := range alerts {
		if strings.ToLower(name) == a {
			return name
		}
	}
	return ""
}

// runbookAnchors lists the GitHub anchors of the runbook's ### headings
// (lower case; these headings are single words).
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^### (\S+)\s*$`).FindAllStringSubmatch(string(data), -1) {
		out[strings.ToLower(m[1])] = true
	}
	return out
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardPanel struct {
	ID         int              `json:"id"`
	Type       string           `json:"type"`
	Title      string           `json:"title"`
	Datasource *datasourceRef   `json:"datasource"`
	Panels     []dashboardPanel `json:"panels"` // a collapsed row's
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// dashboardExprs lists the dashboard's PromQL, by where it is, with
// Grafana's variables replaced by values Prometheus accepts; a
// label_values() variable query counts as its selector.
func dashboardExprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				exprs[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = grafanaToPromQL(tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\(([^,]+),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, q.Query)
		}
		exprs["variable "+v.Name] = grafanaToPromQL(m[1])
	}
	return exprs
}

// grafanaToPromQL replaces Grafana's interval variables by a duration and
// the dashboard's own variables (used in regex matchers) by ".*".
func grafanaToPromQL(expr string) string {
	for _, v := range []string{"$__rate_interval", "$__interval", "$__range"} {
		expr = strings.ReplaceAll(expr, v, "5m")
	}
	return regexp.MustCompile(`\$\{?\w+\}?`).ReplaceAllString(expr, ".*")
}

// TestDashboard: the dashboard is importable anywhere (its data source is a
// variable, every panel and query uses it), panel ids are unique, and every
// query parses.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q title %q", d.UID, d.Title)
	}
	var dsVar string
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" {
				t.Errorf("data source variable %s: query %s, want \"prometheus\"", v.Name, v.Query)
			}
			dsVar = "${" + v.Name + "}"
		}
	}
	if dsVar == "" {
		t.Fatal("no data source variable: the dashboard only works with the data source it was exported from")
	}
	usesVar := func(where string, ds *datasourceRef) {
		if ds == nil || ds.UID != dsVar || ds.Type != "prometheus" {
			t.Errorf("%s: datasource %+v, want {prometheus %s}", where, ds, dsVar)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			usesVar("variable "+v.Name, v.Datasource)
		}
	}
	ids := map[int]bool{}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" {
				usesVar(fmt.Sprintf("panel %q", p.Title), p.Datasource)
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no queries", p.Title)
				}
			}
			for _, tg := range p.Targets {
				usesVar(fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Datasource)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	exprs := dashboardExprs(t, d)
	for where, e := range exprs {
		if _, err := parseExpr(e); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}
}

func parseExpr(e string) (parser.Expr, error) {
	return parser.NewParser(parser.Options{}).ParseExpr(e)
}

// selector is one metric a query reads and the matchers it reads it with.
type selector struct {
	where, metric string
	matchers      []*matcher
}

type matcher struct {
	name, value string
	match       func(string) bool
}

// selectors lists the vector selectors of every dashboard and rule query.
func selectors(t *testing.T) []selector {
	t.Helper()
	exprs := dashboardExprs(t, loadDashboard(t))
	for _, grp := range loadRules(t).Groups {
		for _, r := range grp.Rules {
			exprs[rulesFile+" "+r.Alert+r.Record] = r.Expr
		}
	}
	var out []selector
	for _, where := range sortedKeys(exprs) {
		e, err := parseExpr(exprs[where])
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			s := selector{where: where, metric: vs.Name}
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					continue
				}
				s.matchers = append(s.matchers, &matcher{name: m.Name, value: m.Value, match: m.Matches})
			}
			if s.metric == "" {
				t.Errorf("%s: a selector without a metric name", where)
			}
			out = append(out, s)
			return nil
		})
	}
	return out
}

// targetLabels are added by Prometheus to every scraped series (the
// ServiceMonitor's and the usual Kubernetes scrape configs'), not exported
// by ringlimit.
var targetLabels = map[string]bool{"namespace": true, "instance": true, "job": true, "pod": true, "service": true}

// exportedLate are metrics a fresh node does not export yet, with why; the
// test provokes them before its second scrape.
var exportedLate = map[string]string{
	"ratelimit_service_domain_not_found": "one series per unknown domain, created by the first request for one (its label is the domain Envoy sent, so it cannot be initialised)",
}

// TestMonitoringMetricsExported starts a real node (a one-node cluster, with
// --data-dir, as the StatefulSet runs it), scrapes its /metrics before and
// after a few decisions, and fails if the dashboard or the rules read a
// metric it does not export, or select a label or label value its metrics
// do not have. Metrics must be exported from the start (so that rate() and
// increase() see their first increment), but for the few in exportedLate.
func TestMonitoringMetricsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a ringlimit process; skipped in -short mode")
	}
	sels := selectors(t)
	bin := needBinary(t)
	n := startMonitoredNode(t, bin)

	atStart := scrapeFamilies(t, n.debug)

	conn, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlspb.NewRateLimitServiceClient(conn)
	domain := seedConfig(t).Domain
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.ShouldRateLimit(ctx, seedRequest(domain, fmt.Sprintf("GET /monitoring/%d", i)))
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = client.ShouldRateLimit(ctx, seedRequest("no-such-domain", "GET /"))
	cancel()
	if err != nil {
		t.Fatalf("ShouldRateLimit for an unknown domain: %v", err)
	}
	after := scrapeFamilies(t, n.debug)

	checked := map[string]bool{}
	for _, s := range sels {
		fam, ok := family(after, s.metric)
		if !ok {
			t.Errorf("%s reads %s, which ringlimit does not export", s.where, s.metric)
			continue
		}
		if _, ok := family(atStart, s.metric); !ok && exportedLate[fam.GetName()] == "" && !checked[s.metric] {
			t.Errorf("%s reads %s, which a fresh node does not export: initialise its series, or list it in exportedLate with the reason", s.where, s.metric)
		}
		checked[s.metric] = true
		for _, m := range s.matchers {
			if targetLabels[m.name] {
				continue
			}
			values := labelValues(fam, m.name)
			if len(values) == 0 {
				t.Errorf("%s: %s has no label %q", s.where, s.metric, m.name)
				continue
			}
			if !slices.ContainsFunc(values, m.match) {
				t.Errorf("%s: %s{%s} matches none of the exported values %q", s.where, s.metric, m.name, values)
			}
			if alts := strings.Split(m.value, "|"); len(alts) > 1 {
				for _, a := range alts {
					if !slices.Contains(values, a) {
						t.Errorf("%s: %s{%s=~...} names %q, not an exported value (%q)", s.where, s.metric, m.name, a, values)
					}
				}
			}
		}
	}
	for name, why := range exportedLate {
		if _, ok := atStart[name]; ok {
			t.Errorf("%s is exported from the start; drop it from exportedLate (%s)", name, why)
		}
	}
	t.Logf("%d selectors over %d metrics checked against %d exported families", len(sels), len(checked), len(after))
}

// family finds the family a selected name belongs to: the name itself, or a
// histogram's or summary's _bucket, _sum and _count series.
func family(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if f, ok := fams[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if f, ok := fams[base]; ok {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				return f, true
			case dto.MetricType_SUMMARY:
				return f, suffix != "_bucket"
			}
		}
	}
	return nil, false
}

// labelValues lists the values a family's series have for a label ("le"
// for a histogram's buckets).
func labelValues(f *dto.MetricFamily, label string) []string {
	set := map[string]bool{}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				set[lp.GetValue()] = true
			}
		}
		if label == "le" {
			for _, b := range m.GetHistogram().GetBucket() {
				set[strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func scrapeFamilies(t *testing.T, debugAddr string) map[string]*dto.MetricFamily {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	code, body, err := httpGet(client, "http://"+debugAddr+"/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: status %d, %v", code, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return fams
}

// monitoredNode is a started ringlimit process and where it listens.
type monitoredNode struct {
	p                         *proc
	grpc, http, debug, gossip string
}

// startMonitoredNode starts `ringlimit serve` as a one-node cluster (it
// joins itself, so the cluster's metrics exist) on free 127.0.0.1 ports and
// waits until it is ready. A port taken between the pick and the listen is
// retried with new ports, a few times.
func startMonitoredNode(t *testing.T, bin string) *monitoredNode {
	t.Helper()
	cfgDir, err := filepath.Abs(filepath.Dir(exampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		ports := freeLoopbackPorts(t, 4)
		n := &monitoredNode{
			grpc:   net.JoinHostPort("127.0.0.1", ports[0]),
			http:   net.JoinHostPort("127.0.0.1", ports[1]),
			debug:  net.JoinHostPort("127.0.0.1", ports[2]),
			gossip: net.JoinHostPort("127.0.0.1", ports[3]),
		}
		home := t.TempDir()
		n.p = startProc(t, "ringlimit-monitoring", []string{"HOME=" + home},
			bin, "serve",
			"--config="+cfgDir,
			"--node-name=ringlimit-0",
			"--grpc-addr="+n.grpc, "--http-addr="+n.http, "--debug-addr="+n.debug,
			"--gossip-addr="+n.gossip, "--advertise-addr=127.0.0.1", "--join="+n.gossip,
			"--data-dir="+filepath.Join(home, "data"),
			"--shutdown-timeout=5s")
		client := &http.Client{Timeout: 2 * time.Second}
		deadline := time.Now().Add(e2eWait)
		for {
			code, _, err := httpGet(client, "http://"+n.http+"/healthcheck")
			if err == nil && code == http.StatusOK {
				client.CloseIdleConnections()
				return n
			}
			if n.p.exited() {
				<-n.p.done
				if attempt < 3 && strings.Contains(n.p.out.String(), "address already in use") {
					break
				}
				t.Fatalf("ringlimit exited before it was ready: %v\n%s", n.p.err, n.p.out.String())
			}
			if time.Now().After(deadline) {
				t.Fatalf("ringlimit not ready after %v (last: %d %v)\n%s", e2eWait, code, err, n.p.out.String())
			}
			time.Sleep(50 * time.Millisecond) // polling interval, not synchronisation
		}
		client.CloseIdleConnections()
	}
}

// freeLoopbackPorts picks n ports free on 127.0.0.1 for TCP and UDP (gossip
// uses both) and releases them.
func freeLoopbackPorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	for tries := 0; len(out) < n; tries++ {
		if tries > 100 {
			t.Fatal("no free loopback ports")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, l.Close)
		_, port, _ := net.SplitHostPort(l.Addr().String())
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			continue
		}
		closers = append(closers, u.Close)
		out = append(out, port)
	}
	return out
}
