package deploy_test

// End to end: three `ringlimit serve` processes started exactly as the
// example overlay's StatefulSet starts its pods (same args, same env, the
// volumes laid out as the kubelet lays them out) form one cluster and answer
// as one rate limiter.
//
// Each process is a "pod": its own loopback IP as POD_IP (so every process
// uses the manifest's own ports), and its own /etc, bind-mounted in a
// private mount namespace, holding a hosts file in which the peers
// Service's name resolves to all three IPs (as cluster DNS would), and the
// ConfigMap and Secret volumes with their ..data symlinks. That needs root
// (unshare --mount); elsewhere the test is skipped.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// e2eWait bounds every wait of the end-to-end test.
const e2eWait = 30 * time.Second

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// proc is one started process. Its waiter goroutine ends when the process
// does; stop makes sure it does.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, set before done is closed
}

func startProc(t *testing.T, name string, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(10 * time.Second)
		if t.Failed() {
			t.Logf("--- output of %s ---\n%s", p.name, p.out.String())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to this process (by PID) and SIGKILL if it has not
// exited after grace; it returns once the process is gone.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitFor polls cond every 50 ms until it holds, the bound passes or a
// process exits.
func waitFor(t *testing.T, what string, procs []*proc, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(e2eWait)
	for {
		err := cond()
		if err == nil {
			return
		}
		for _, p := range procs {
			if p.exited() {
				t.Fatalf("waiting for %s: %s exited: %v\n%s", what, p.name, p.err, p.out.String())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still %v after %v", what, err, e2eWait)
		}
		time.Sleep(50 * time.Millisecond) // polling interval, not synchronisation
	}
}

// projectVolume writes a ConfigMap or Secret volume the way the kubelet's
// atomic writer does: the files in a ..<timestamp> directory, a ..data
// symlink to it, and one symlink per key through ..data.
func projectVolume(dir string, files map[string][]byte, mode os.FileMode) error {
	ts := "..2026_01_02_03_04_05.000000001"
	if err := writeVolumeData(dir, ts, files, mode); err != nil {
		return err
	}
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return os.Symlink(ts, filepath.Join(dir, "..data"))
}

// updateVolume changes a projected volume as the kubelet does when its
// ConfigMap changes: new files in a new timestamped directory, then ..data
// swapped to it atomically (rename over the old symlink).
func updateVolume(dir, ts string, files map[string][]byte) error {
	if err := writeVolumeData(dir, ts, files, 0o644); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "..data"))
}

func writeVolumeData(dir, ts string, files map[string][]byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), data, mode); err != nil {
			return err
		}
	}
	return nil
}

// podEtc builds the /etc one pod sees: hosts (the pod's own entry and the
// peers Service name resolving to every pod), no DNS server, and the
// volumes, which must be mounted under /etc for this test to place them.
func podEtc(t *testing.T, k *kit, p pod, hosts string, gossipKey []byte) string {
	t.Helper()
	etc := t.TempDir()
	c := k.container(t)
	own := fmt.Sprintf("%s\t%s.%s.%s.svc.cluster.local %s\n", p.ip, p.name, k.statefulSet.Spec.ServiceName, k.namespace, p.name)
	for name, data := range map[string]string{
		"hosts":         "127.0.0.1\tlocalhost\n::1\tlocalhost\n" + own + hosts,
		"resolv.conf":   "# no DNS server: names come from /etc/hosts\n",
		"nsswitch.conf": "hosts: files dns\n",
	} {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range k.statefulSet.Spec.Template.Spec.Volumes {
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if m.Name == v.Name {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil {
			continue
		}
		rel, ok := strings.CutPrefix(mount.MountPath, "/etc/")
		if !ok {
			t.Fatalf("volume %s is mounted at %s; this test can only place volumes under /etc", v.Name, mount.MountPath)
		}
		files := map[string][]byte{}
		mode := os.FileMode(0o644)
		switch {
		case v.ConfigMap != nil:
			cm := k.configMaps[v.ConfigMap.Name]
			for key, data := range cm.Data {
				files[key] = []byte(data)
			}
		case v.Secret != nil:
			// The Secret the operator creates: one base64 key.
			files[filepath.Base(mustFlag(t, c.Args, "gossip-key-file"))] = []byte(base64.StdEncoding.EncodeToString(gossipKey) + "\n")
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
		default:
			t.Fatalf("volume %s: only ConfigMap and Secret volumes are simulated", v.Name)
		}
		if err := projectVolume(filepath.Join(etc, rel), files, mode); err != nil {
			t.Fatal(err)
		}
	}
	return etc
}

// privateEtc is the command prefix that runs argv with dir bind-mounted
// over /etc, and each bind's source over its target, in a new mount
// namespace (a private one: nothing leaks out).
func privateEtc(unshare, mount, dir string, binds []bind, argv ...string) []string {
	script := `"$0" --bind "$1" /etc`
	params := []string{mount, dir}
	for _, b := range binds {
		n := len(params)
		script += fmt.Sprintf(` && "$0" --bind "${%d}" "${%d}"`, n, n+1)
		params = append(params, b.source, b.target)
	}
	script += fmt.Sprintf(` && shift %d && exec "$@"`, len(params)-1)
	return append(append([]string{unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script}, params...), argv...)
}

// bind is a directory mounted over another.
type bind struct{ source, target string }

// podClaims lays out the StatefulSet's volumeClaimTemplates for one pod: a
// new empty directory for each claim the container mounts, as a fresh
// PersistentVolume is. Each is reached by binding a directory over its
// mount path's parent (which exists here, as /var/lib does), holding it
// under the mount path's name. dirs maps each mount path to the directory
// the pod writes, as seen from this test.
func podClaims(t *testing.T, k *kit) (binds []bind, dirs map[string]string) {
	t.Helper()
	dirs = map[string]string{}
	for _, pvc := range k.statefulSet.Spec.VolumeClaimTemplates {
		for _, m := range k.container(t).VolumeMounts {
			if m.Name != pvc.Name {
				continue
			}
			parent := filepath.Dir(m.MountPath)
			if st, err := os.Stat(parent); err != nil || !st.IsDir() {
				t.Fatalf("claim %s is mounted at %s, whose parent this test cannot bind over: %v", pvc.Name, m.MountPath, err)
			}
			root := t.TempDir()
			dir := filepath.Join(root, filepath.Base(m.MountPath))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			binds = append(binds, bind{root, parent})
			dirs[m.MountPath] = dir
		}
	}
	return binds, dirs
}

// freeBlock picks three loopback IPs on which every port of the container
// is free, starting with 127.0.0.1-3.
func freeBlock(t *testing.T, c corev1.Container) []string {
	t.Helper()
	var reasons []string
	for _, prefix := range []string{"127.0.0.", "127.0.100.", "127.0.200."} {
		ips := []string{prefix + "1", prefix + "2", prefix + "3"}
		if err := portsFree(ips, c.Ports); err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		return ips
	}
	t.Skipf("no free loopback block for the manifest's ports: %v", reasons)
	return nil
}

func portsFree(ips []string, ports []corev1.ContainerPort) error {
	for _, ip := range ips {
		for _, p := range ports {
			addr := net.JoinHostPort(ip, fmt.Sprint(p.ContainerPort))
			var c io.Closer
			var err error
			if protocol(p.Protocol) == corev1.ProtocolUDP {
				c, err = net.ListenPacket("udp", addr)
			} else {
				c, err = net.Listen("tcp", addr)
			}
			if err != nil {
				return err
			}
			c.Close()
		}
	}
	return nil
}

// httpGet fetches url and returns the status and body.
func httpGet(client *http.Client, url string) (int, []byte, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// probeURL is where the kubelet sends an httpGet probe for pod p.
func probeURL(t *testing.T, c corev1.Container, pr *corev1.Probe, ip string) string {
	t.Helper()
	cp := containerPort(c, pr.HTTPGet.Port)
	if cp == nil {
		t.Fatalf("probe port %s", pr.HTTPGet.Port.String())
	}
	return fmt.Sprintf("http://%s%s", net.JoinHostPort(ip, fmt.Sprint(cp.ContainerPort)), pr.HTTPGet.Path)
}

func TestStatefulSetE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: each pod gets its own /etc in a private mount namespace (unshare --mount)")
	}
	unshare, err1 := exec.LookPath("unshare")
	mount, err2 := exec.LookPath("mount")
	if err := errors.Join(err1, err2); err != nil {
		t.Skipf("needs unshare and mount: %v", err)
	}
	// Preflight: can this machine give a process a private /etc?
	probe := t.TempDir()
	if err := os.WriteFile(filepath.Join(probe, "hosts"), []byte("private-etc-works\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pf := privateEtc(unshare, mount, probe, nil, "/bin/cat", "/etc/hosts")
	if out, err := exec.Command(pf[0], pf[1:]...).CombinedOutput(); err != nil || !strings.Contains(string(out), "private-etc-works") {
		t.Skipf("cannot bind-mount a private /etc here (unshare --mount): %v: %s", err, out)
	}

	bin := needBinary(t)
	k := overlayKit(t)
	c := k.container(t)
	ips := freeBlock(t, c)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}

	// The peers Service name --join uses resolves to every pod.
	_, _, args0 := expandedPod(t, k, 0, ips[0])
	joinHost, _, err := net.SplitHostPort(mustFlag(t, args0, "join"))
	if err != nil {
		t.Fatal(err)
	}
	var hosts strings.Builder
	for _, ip := range ips {
		fmt.Fprintf(&hosts, "%s\t%s\n", ip, joinHost)
	}

	// Start the three pods at once (podManagementPolicy: Parallel).
	var procs []*proc
	var pods []pod
	var etcs []string
	var claims []map[string]string
	for i, ip := range ips {
		p, env, args := expandedPod(t, k, i, ip)
		etc := podEtc(t, k, p, hosts.String(), key)
		etcs = append(etcs, etc)
		binds, dirs := podClaims(t, k)
		claims = append(claims, dirs)
		// No command in the manifest: the image's ENTRYPOINT (the binary)
		// runs with the manifest's args.
		argv := privateEtc(unshare, mount, etc, binds, append([]string{bin}, args...)...)
		procs = append(procs, startProc(t, p.name, env, argv...))
		pods = append(pods, p)
	}

	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()

	// Ready, as the kubelet's probes see it.
	for _, p := range pods {
		for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
			url := probeURL(t, c, pr, p.ip)
			waitFor(t, p.name+" probe "+url, procs, func() error {
				code, body, err := httpGet(client, url)
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("status %d: %s", code, body)
				}
				return err
			})
		}
	}

	// One cluster: every node's ring lists every pod.
	debugPort := containerPort(c, intstr.FromString("metrics")).ContainerPort
	ringOf := func(ip string) ([]string, error) {
		return ringAt(client, net.JoinHostPort(ip, fmt.Sprint(debugPort)))
	}
	waitRing := func(live []pod) {
		t.Helper()
		var want []string
		for _, p := range live {
			want = append(want, p.name)
		}
		for _, p := range live {
			waitFor(t, p.name+"'s ring to be "+strings.Join(want, ","), procs[:len(live)], func() error {
				ring, err := ringOf(p.ip)
				if err == nil && !slices.Equal(ring, want) {
					err = fmt.Errorf("ring %v", ring)
				}
				return err
			})
		}
	}
	waitRing(pods)

	// RLS v3 and gRPC health on every node, at the manifest's gRPC port.
	grpcPort := containerPort(c, intstr.FromString("grpc")).ContainerPort
	var clients []rlspb.RateLimitServiceClient
	for _, p := range pods {
		conn, err := grpc.NewClient(net.JoinHostPort(p.ip, fmt.Sprint(grpcPort)), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// gRPC health follows readiness a tick later (ringlimit polls it).
		waitHealthServing(t, p.name, procs, conn)
		clients = append(clients, rlspb.NewRateLimitServiceClient(conn))
	}
	// Local fallbacks (an owner that did not answer in 250 ms) over every
	// pod: the one reason a shared count may be off.
	var debugAddrs []string
	for _, p := range pods {
		debugAddrs = append(debugAddrs, net.JoinHostPort(p.ip, fmt.Sprint(debugPort)))
	}
	fallbacks := func() float64 { return fallbackSum(t, client, debugAddrs) }
	checkSharedLimit(t, clients, seedConfig(t).Domain, fallbacks)

	// Editing the ConfigMap reaches the pod without a restart.
	_, cfgMount := volumeFor(t, k, func(v corev1.Volume) bool { return v.ConfigMap != nil })
	cfgDir := filepath.Join(etcs[0], strings.TrimPrefix(cfgMount.MountPath, "/etc/"))
	orig, err := os.ReadFile(filepath.Join(cfgDir, "ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(orig), "requests_per_unit: 100", "requests_per_unit: 7", 1)
	if edited == string(orig) {
		t.Fatal("the seed config no longer has requests_per_unit: 100")
	}
	if err := updateVolume(cfgDir, "..2026_01_02_03_09_00.000000002", map[string][]byte{"ratelimit.yaml": []byte(edited)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, pods[0].name+" to reload the edited ConfigMap", procs, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := clients[0].ShouldRateLimit(ctx, seedRequest(seedConfig(t).Domain, "GET /reload"))
		if err != nil {
			return err
		}
		if n := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); n != 7 {
			return fmt.Errorf("limit still %d", n)
		}
		return nil
	})

	// A graceful stop: SIGTERM, the node leaves, the others drop it.
	last := procs[len(procs)-1]
	grace := time.Duration(*k.statefulSet.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	start := time.Now()
	last.stop(grace)
	if last.err != nil {
		t.Errorf("%s: SIGTERM exit: %v", last.name, last.err)
	}
	t.Logf("%s drained and exited in %v", last.name, time.Since(start).Round(time.Millisecond))
	waitRing(pods[:len(pods)-1])

	// It saved its counters on its claim at shutdown (--data-dir).
	if dataDir, ok := flagValue(c.Args, "data-dir"); ok {
		dir, ok := claims[len(claims)-1][dataDir]
		if !ok {
			t.Fatalf("--data-dir=%s is not on a volumeClaimTemplate", dataDir)
		}
		if fi, err := os.Stat(filepath.Join(dir, "counters.snap")); err != nil || fi.Size() == 0 {
			t.Errorf("%s: no counters saved in --data-dir after SIGTERM: %v", last.name, err)
		}
		if out := last.out.String(); !strings.Contains(out, "counters saved at shutdown") {
			t.Errorf("%s: no shutdown save in the log", last.name)
		}
	}
}

// ringAt returns the ring of the node whose debug listener is at addr,
// sorted.
func ringAt(client *http.Client, addr string) ([]string, error) {
	code, body, err := httpGet(client, "http://"+addr+"/debug/cluster")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/debug/cluster: status %d", code)
	}
	var v struct {
		Ring []string `json:"ring"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, err
	}
	slices.Sort(v.Ring)
	return v.Ring, nil
}

// fallbackSum adds up the local fallbacks (an owner that did not answer in
// 250 ms) of the nodes whose debug listeners are at addrs: the one reason a
// shared count may be off.
func fallbackSum(t *testing.T, client *http.Client, addrs []string) float64 {
	t.Helper()
	var sum float64
	for _, addr := range addrs {
		code, body, err := httpGet(client, "http://"+addr+"/metrics")
		if err != nil || code != http.StatusOK {
			t.Fatalf("%s/metrics: status %d, %v", addr, code, err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("%s/metrics: %v", addr, err)
		}
		for _, m := range mfs["ringlimit_local_fallbacks_total"].GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// waitHealthServing waits until the gRPC health service on conn reports
// "ratelimit" SERVING.
func waitHealthServing(t *testing.T, what string, procs []*proc, conn *grpc.ClientConn) {
	t.Helper()
	health := healthpb.NewHealthClient(conn)
	waitFor(t, what+" gRPC health \"ratelimit\" SERVING", procs, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		hr, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err == nil && hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("status %v", hr.GetStatus())
		}
		return err
	})
}

// seedRequest is what the seed's Envoy sends for one client and path.
func seedRequest(domain, path string) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{
		Domain: domain,
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
			{Key: "remote_address", Value: "203.0.113.7"},
			{Key: "PATH", Value: path},
		}}},
	}
}

// checkSharedLimit sends the seed's descriptor through every node in turn,
// 130 hits (three nodes): the 100-a-minute limit is counted once for the
// whole cluster, so exactly 100 of them are allowed, whichever nodes they
// land on. With quota leases a node decides some hits from a share of the
// key's quota its owner counted first, so a node may refuse a hit while
// another still holds unused quota (an early refusal), which that node then
// allows: the total is exact, the order near the limit need not be. The
// first answer must carry the limit. fallbacks sums the cluster's local
// fallbacks: a call whose owner stalled for more than the entry node's
// 250 ms wait (a loaded machine) is decided on the entry node's own counter,
// so a check during which one happened is run again with a new key, as is
// one that a minute boundary cut (at most three runs in all).
func checkSharedLimit(t *testing.T, clients []rlspb.RateLimitServiceClient, domain string, fallbacks func() float64) {
	t.Helper()
	const limit = 100
	call := func(i int, path string) *rlspb.RateLimitResponse {
		// A deadline, as Envoy's, lets the entry node wait up to 250 ms
		// for the key's owner; it bounds the call, not its latency.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, seedRequest(domain, path))
		if err != nil {
			t.Fatalf("ShouldRateLimit via node %d: %v", i%len(clients), err)
		}
		return resp
	}
	hits := limit + 10*len(clients)
	for attempt := 0; attempt < 3; attempt++ {
		fb := fallbacks()
		path := fmt.Sprintf("GET /e2e/%d", time.Now().UnixNano())
		first := call(0, path)
		if got := first.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != limit {
			t.Fatalf("first call: limit %d, want %d: %v", got, limit, first)
		}
		allowed := 0
		if first.GetOverallCode() == rlspb.RateLimitResponse_OK {
			allowed++
		}
		rolled := false
		prev := first.GetStatuses()[0].GetDurationUntilReset().AsDuration()
		for i := 1; i < hits && !rolled; i++ {
			resp := call(i, path)
			st := resp.GetStatuses()[0]
			if d := st.GetDurationUntilReset().AsDuration(); d > prev+time.Second {
				rolled = true
				break
			}
			prev = st.GetDurationUntilReset().AsDuration()
			if resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
				allowed++
			}
		}
		var wrong string
		if allowed != limit {
			wrong = fmt.Sprintf("%d of %d hits through %d nodes allowed, want exactly %d: the nodes do not share one counter",
				allowed, hits, len(clients), limit)
		}
		switch {
		case rolled:
			t.Log("the minute window rolled over during the check; once more with a new key")
		case wrong != "" && fallbacks() == fb:
			t.Fatal(wrong)
		case wrong != "":
			t.Logf("%s, with a local fallback during the check (a stalled owner); once more with a new key", wrong)
		default:
			return
		}
	}
	t.Fatal("no run of the check finished without a window rollover or a local fallback")
}
