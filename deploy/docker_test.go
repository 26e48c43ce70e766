package deploy_test

// The image: no Docker engine runs where these tests run, so the Dockerfile
// is checked by reading it against go.mod, the binary's sources and the
// StatefulSet that runs the image.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dockerInstr is one Dockerfile instruction, continuation lines joined.
type dockerInstr struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// dockerStage is the instructions from one FROM to the next.
type dockerStage struct {
	from  string // image reference
	name  string // AS name
	instr []dockerInstr
}

func parseDockerfile(data []byte) ([]dockerStage, error) {
	var stages []dockerStage
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	flush := func() error {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := dockerInstr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			st := dockerStage{}
			switch {
			case len(f) == 1:
				st.from = f[0]
			case len(f) == 3 && strings.EqualFold(f[1], "AS"):
				st.from, st.name = f[0], f[2]
			default:
				return fmt.Errorf("FROM %s: cannot parse", in.args)
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 {
			if in.cmd == "ARG" {
				return nil
			}
			return fmt.Errorf("%s before FROM", in.cmd)
		}
		stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, in)
		return nil
	}
	for sc.Scan() {
		line := sc.Text()
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return stages, sc.Err()
}

func (s dockerStage) all(cmd string) []string {
	var out []string
	for _, in := range s.instr {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// execForm decodes a JSON-array instruction argument (ENTRYPOINT ["x"]).
func execForm(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		t.Fatalf("%q is not in exec (JSON array) form: %v", s, err)
	}
	return out
}

// goVersionAtLeast reports whether version a (1.26.8) >= b.
func goVersionAtLeast(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x > y
		}
	}
	return true
}

// dockerStages reads and parses the Dockerfile.
func dockerStages(t *testing.T) []dockerStage {
	t.Helper()
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	stages, err := parseDockerfile(data)
	if err != nil {
		t.Fatal(err)
	}
	return stages
}

func TestDockerfile(t *testing.T) {
	stages := dockerStages(t)
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	// The build stage uses a Go at least as new as go.mod asks for.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	img := regexp.MustCompile(`^golang:(\d+(?:\.\d+)*)`).FindStringSubmatch(build.from)
	if goLine == nil || img == nil || !goVersionAtLeast(img[1], string(goLine[1])) {
		t.Errorf("build stage FROM %s; go.mod wants go %s", build.from, goLine[1])
	}
	runs := strings.Join(build.all("RUN"), "\n")
	out := regexp.MustCompile(`go build .*-o (\S+) \./cmd/ringlimit\b`).FindStringSubmatch(runs)
	if out == nil {
		t.Fatalf("build stage does not `go build ... -o <file> ./cmd/ringlimit`:\n%s", runs)
	}
	if !strings.Contains(runs, "CGO_ENABLED=0") {
		t.Error("the binary must be static: CGO_ENABLED=0")
	}
	// -X main.buildVersion must name a variable that exists.
	if m := regexp.MustCompile(`-X main\.(\w+)=`).FindStringSubmatch(runs); m != nil {
		src, err := exec.Command("grep", "-rl", "--include=*.go", "^var "+m[1]+" string", filepath.Join(repoRoot, "cmd/ringlimit")).Output()
		if err != nil || len(src) == 0 {
			t.Errorf("-X main.%s: no such string variable in cmd/ringlimit", m[1])
		}
	}

	// The final stage: distroless static (or scratch), non-root, the binary
	// as entrypoint, the ports the StatefulSet uses.
	if !(strings.HasPrefix(final.from, "gcr.io/distroless/static") && strings.HasSuffix(final.from, ":nonroot")) && final.from != "scratch" {
		t.Errorf("final stage FROM %s: want distroless static nonroot or scratch", final.from)
	}
	var bin string
	for _, c := range final.all("COPY") {
		f := strings.Fields(c)
		if len(f) == 3 && f[0] == "--from="+build.name && f[1] == out[1] {
			bin = f[2]
		}
	}
	entry := final.all("ENTRYPOINT")
	if bin == "" || len(entry) != 1 || !slices.Equal(execForm(t, entry[0]), []string{bin}) {
		t.Errorf("ENTRYPOINT %v should be the binary copied from the build stage (%q)", entry, bin)
	}
	k := overlayKit(t)
	c := k.container(t)
	cmd := final.all("CMD")
	if len(cmd) != 1 || len(c.Args) == 0 || execForm(t, cmd[0])[0] != c.Args[0] {
		t.Errorf("CMD %v and the StatefulSet's args %q disagree on the subcommand", cmd, c.Args)
	}
	users := final.all("USER")
	psc := k.statefulSet.Spec.Template.Spec.SecurityContext
	want := fmt.Sprintf("%d:%d", *psc.RunAsUser, *psc.RunAsGroup)
	if len(users) != 1 || users[0] != want {
		t.Errorf("USER %v, want %s (the StatefulSet's runAsUser:runAsGroup; distroless nonroot is 65532)", users, want)
	}
	var exposed []string
	for _, e := range final.all("EXPOSE") {
		exposed = append(exposed, strings.Fields(e)...)
	}
	var ports []string
	for _, p := range c.Ports {
		ports = append(ports, fmt.Sprintf("%d/%s", p.ContainerPort, strings.ToLower(string(protocol(p.Protocol)))))
	}
	slices.Sort(exposed)
	slices.Sort(ports)
	if !slices.Equal(exposed, ports) {
		t.Errorf("EXPOSE %v, the container ports are %v", exposed, ports)
	}
}

func TestParseDockerfile(t *testing.T) {
	st, err := parseDockerfile([]byte("# c\nARG X=1\nFROM a AS b\nRUN x \\\n  y\nFROM --platform=$P c\nUSER 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].name != "b" || st[0].all("RUN")[0] != "x    y" || st[1].from != "c" || st[1].all("USER")[0] != "1" {
		t.Errorf("%+v", st)
	}
	if !goVersionAtLeast("1.26.8", "1.26.8") || !goVersionAtLeast("1.27", "1.26.8") || goVersionAtLeast("1.26", "1.26.8") {
		t.Error("goVersionAtLeast")
	}
}

// dockerignored reports whether a context path is excluded by patterns
// (Docker semantics: a pattern matches the path or any parent directory;
// later "!" patterns re-include).
func dockerignored(patterns []string, path string) bool {
	parts := strings.Split(path, "/")
	ignored := false
	for _, p := range patterns {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(strings.TrimPrefix(filepath.Clean(strings.TrimPrefix(p, "!")), "/"), "./")
		for i := 1; i <= len(parts); i++ {
			if ok, _ := filepath.Match(p, strings.Join(parts[:i], "/")); ok {
				ignored = !neg
				break
			}
		}
	}
	return ignored
}

func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile(dockerignore)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	// What `go build ./cmd/ringlimit` reads must stay in the context.
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "./cmd/ringlimit")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, d := range strings.Fields(string(out)) {
		if rel, err := filepath.Rel(root, d); err == nil && !strings.HasPrefix(rel, "..") {
			needed = append(needed, filepath.ToSlash(filepath.Join(rel, "x.go")))
		}
	}
	if len(needed) < 4 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, p := range needed {
		if dockerignored(patterns, p) {
			t.Errorf(".dockerignore excludes %s, which the build needs", p)
		}
	}
	for _, p := range []string{".git/config", "ringlimit", ".build/ringlimit"} {
		if !dockerignored(patterns, p) {
			t.Errorf(".dockerignore should exclude %s", p)
		}
	}
	if dockerignored(patterns, "cmd/ringlimit/ringlimit.go") != false || dockerignored([]string{"a", "!a/b"}, "a/b/c") {
		t.Error("dockerignored: wrong semantics")
	}
}
