package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc/PID/stat: the kernel's
// USER_HZ, 100 on every Linux architecture Go supports.
const userHZ = 100

// processCPUs is the user + system CPU time each of pids has used so far,
// from /proc/PID/stat (Linux).
func processCPUs(pids []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return nil, fmt.Errorf("bench: --server-pids: %w", err)
		}
		t, err := statCPUTicks(string(b))
		if err != nil {
			return nil, fmt.Errorf("bench: --server-pids: /proc/%d/stat: %w", pid, err)
		}
		out[i] = time.Duration(t) * time.Second / userHZ
	}
	return out, nil
}

// statCPUTicks is utime + stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may hold spaces
// and parentheses, so fields are counted after its last ')'.
func statCPUTicks(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want >= 13", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("utime %q, stime %q: not counts", f[11], f[12])
	}
	return u + s, nil
}
