package chaos

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Metric sums every sample of a Prometheus metric on the node's /metrics
// whose line starts with prefix (a name, or a name with a label prefix
// such as `x{reason="timeout"`). It is 0 when none is found.
func (n *Node) Metric(prefix string) (float64, error) {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + n.Debug + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		rest := line[len(prefix):]
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, ",") && !strings.HasPrefix(rest, "}") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}
