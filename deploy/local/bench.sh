#!/usr/bin/env bash
# `make bench`: in one run and under the same load, measures the floor (a
# do-nothing RLS server: what gRPC alone costs here), one ringlimit node, and
# a three-node ringlimit cluster (load spread over all three, so about 2/3 of
# decisions are forwarded to their owner), prints a table with ratios to the
# floor; then, as root, the capped scaling section (deploy/local/bench-capped.sh:
# one, three and five nodes with every server process at the same CPU quota);
# then runs the Go micro-benchmarks with benchstat-ready output.
#
# Usage: deploy/local/bench.sh [path/to/ringlimit]
#   Without a path it builds .build/ringlimit. Everything listens on
#   127.0.0.1 ports chosen free at start; only the processes this script
#   started are stopped (by PID) on exit.
# Environment (defaults in brackets):
#   BENCH_C [64]          concurrent calls
#   BENCH_N [100000]      calls per measured run
#   BENCH_ROUNDS [3]      runs per setup; the table shows medians
#   BENCH_WARMUP [1s]     load sent and discarded before each run
#   BENCH_CONNS [3]       gRPC connections (the same for every setup)
#   BENCH_KEYS [10000]    distinct client IPs (uniform)
#   BENCH_RATE_FRACTION [0.3]  paced latency run: this share of the floor's
#                         calls/s for every setup (0 skips it)
#   BENCH_RATE_SECONDS [5]  length of each paced run
#   BENCH_CAPPED [1]      0 skips the capped scaling section; its own knobs
#                         (BENCH_CPU_QUOTA [0.25], BENCH_CAP_*) are in bench-capped.sh
#   BENCH_DATADIR [1]     0 skips the --data-dir save and restore of 1 M keys
#   BENCH_MICRO [1]       0 skips the Go micro-benchmarks
#   BENCH_COUNT [6]       -count of each micro-benchmark (benchstat wants >= 6)
#   BENCH_BENCHTIME [300ms]
#   BENCH_OUT [.build/bench/<time>]  where reports and logs go
set -euo pipefail
cd "$(dirname "$0")/../.."

C=${BENCH_C:-64}
N=${BENCH_N:-100000}
ROUNDS=${BENCH_ROUNDS:-3}
WARMUP=${BENCH_WARMUP:-1s}
CONNS=${BENCH_CONNS:-3}
KEYS=${BENCH_KEYS:-10000}
RATE_FRACTION=${BENCH_RATE_FRACTION:-0.3}
RATE_SECONDS=${BENCH_RATE_SECONDS:-5}
CAPPED=${BENCH_CAPPED:-1}
DATADIR=${BENCH_DATADIR:-1}
MICRO=${BENCH_MICRO:-1}
COUNT=${BENCH_COUNT:-6}
BENCHTIME=${BENCH_BENCHTIME:-300ms}
GO=${GO:-go}
OUT=${BENCH_OUT:-.build/bench/$(date +%Y%m%d-%H%M%S)}
CONFIG=deploy/examples/config
mkdir -p "$OUT"

if [ $# -ge 1 ]; then
	BIN=$1
else
	BIN=.build/ringlimit
	echo "building $BIN"
	"$GO" build -trimpath -o "$BIN" ./cmd/ringlimit
fi

# --- the machine -------------------------------------------------------------
{
	echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "cpus:     $(nproc)"
	echo "cpu:      $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
	echo "go:       $("$GO" version)"
	echo "kernel:   $(uname -sr)"
	echo "load:     $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null) (1, 5, 15 min, before the run)"
	echo "load:     c=$C calls/run=$N rounds=$ROUNDS warmup=$WARMUP connections=$CONNS keys=$KEYS deadline=20ms"
} | tee "$OUT/machine.txt"

# --- processes we start, stopped by PID on exit ------------------------------
pids=()
stop_all() {
	local pid
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	pids=()
}
trap 'stop_all' EXIT
trap 'stop_all; exit 130' INT TERM

# --- free ports, HTTP GETs, bounded waits, readiness (deploy/local/bench-lib.sh)
# shellcheck source=deploy/local/bench-lib.sh
. deploy/local/bench-lib.sh

# --- servers -----------------------------------------------------------------
noop_grpc=127.0.0.1:$(free_port)
"$BIN" bench --noop-server "$noop_grpc" >"$OUT/noop.log" 2>&1 &
pids+=($!)
pids_floor=$!

one_grpc=127.0.0.1:$(free_port)
one_http=127.0.0.1:$(free_port)
one_debug=127.0.0.1:$(free_port)
"$BIN" serve --node-name bench-one --config "$CONFIG" --log-level warn \
	--grpc-addr "$one_grpc" --http-addr "$one_http" --debug-addr "$one_debug" \
	>"$OUT/one.log" 2>&1 &
pids+=($!)
pids_one=$!

three_grpc=() three_http=() three_debug=() three_gossip=()
for i in 0 1 2; do
	three_grpc+=("127.0.0.1:$(free_port)")
	three_http+=("127.0.0.1:$(free_port)")
	three_debug+=("127.0.0.1:$(free_port)")
	three_gossip+=("127.0.0.1:$(free_port)")
done
join=$(IFS=,; echo "${three_gossip[*]}")
for i in 0 1 2; do
	"$BIN" serve --node-name "bench-$i" --config "$CONFIG" --log-level warn \
		--grpc-addr "${three_grpc[$i]}" --http-addr "${three_http[$i]}" \
		--debug-addr "${three_debug[$i]}" --gossip-addr "${three_gossip[$i]}" --join "$join" \
		>"$OUT/three-$i.log" 2>&1 &
	pids+=($!)
	pids_three="${pids_three:-}${pids_three:+ }$!"
done
pids_hot=$pids_three

wait_until 10 "noop server" port_open "${noop_grpc##*:}"
wait_until 10 "one node" healthy "$one_http"
for i in 0 1 2; do
	wait_until 20 "node bench-$i (ring of 3)" ring_is "${three_debug[$i]}" 3
done
echo "servers up: floor $noop_grpc, one node $one_grpc, three nodes ${three_grpc[*]}"

# cpu_ticks PID...: user+system CPU the processes have used, in clock ticks.
cpu_ticks() {
	local pid t=0
	for pid in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0))); done
	echo "$t"
}
TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)

# --- load: rounds interleave the setups so drift hits each alike ------------
targets_floor=$noop_grpc
targets_one=$one_grpc
targets_three=$(IFS=,; echo "${three_grpc[*]}")
# The hot-key row: the three nodes again, every call on one key (over its
# limit after the first 100 calls of each minute).
targets_hot=$targets_three
keys_floor=$KEYS keys_one=$KEYS keys_three=$KEYS keys_hot=1
labels=("floor (noop RLS)" "one node" "three nodes" "three nodes, 1 key")
names=(floor one three hot)
reports=()
for r in $(seq 1 "$ROUNDS"); do
	for k in 0 1 2 3; do
		name=${names[$k]}
		var=targets_$name
		keysvar=keys_$name
		f="$OUT/$name-$r.json"
		printf 'round %d/%d  %-18s ' "$r" "$ROUNDS" "${labels[$k]}"
		# The warmup runs on its own, so that the servers' CPU is read
		# around the measured calls only.
		if [ "$WARMUP" != 0 ] && [ "$WARMUP" != 0s ]; then
			"$BIN" bench --addr "${!var}" -z "$WARMUP" -c "$C" --connections "$CONNS" --keys "${!keysvar}" \
				--seed "$((r + 1000))" >/dev/null
		fi
		pidvar=pids_$name
		# shellcheck disable=SC2086 # a list of PIDs
		t0=$(cpu_ticks ${!pidvar})
		"$BIN" bench --addr "${!var}" -n "$N" -c "$C" --connections "$CONNS" --keys "${!keysvar}" \
			--seed "$r" --label "${labels[$k]}" --json-file "$f" \
			>"$OUT/$name-$r.txt"
		# shellcheck disable=SC2086
		t1=$(cpu_ticks ${!pidvar})
		# Server CPU per measured call.
		echo "$name $(awk -v d=$((t1 - t0)) -v tck="$TCK" -v n="$N" 'BEGIN { printf "%.1f", d / tck * 1e6 / n }')" >>"$OUT/cpu.txt"
		grep -E 'Requests/sec|99% in' "$OUT/$name-$r.txt" | tr -s ' \t' ' ' | tr '\n' ' '
		echo
		reports+=("$f")
	done
done

# --- latency at a fixed rate ---------------------------------------------------
# At saturation (above) a closed loop's latency is its queueing: 64 calls
# shared over the machine's capacity. Operators size their RLS to run well
# below it, so each setup (hot key aside) also gets the same paced load:
# RATE_FRACTION of the floor's median calls/s (0.3: about half of what
# three nodes sustain on one 2-core machine), for RATE_SECONDS, still 64
# workers.
floor_cps=$(for f in "${reports[@]}"; do case "$f" in */floor-*.json) grep -o '"calls_per_sec": [0-9.]*' "$f" | awk '{print $2}' ;; esac; done |
	sort -n | awk '{ v[++c] = $1 } END { if (c) printf "%d", v[int((c + 1) / 2)] }')
rate_reports=()
if [ "$RATE_FRACTION" != 0 ] && [ -n "$floor_cps" ]; then
	rate=$(awk -v c="$floor_cps" -v f="$RATE_FRACTION" 'BEGIN { printf "%d", c * f }')
	rate_n=$(awk -v r="$rate" -v s="$RATE_SECONDS" 'BEGIN { printf "%d", r * s }')
	for k in 0 1 2; do
		name=${names[$k]}
		var=targets_$name
		f="$OUT/rate-$name.json"
		printf 'paced %-18s %d calls/s ' "${labels[$k]}" "$rate"
		"$BIN" bench --addr "${!var}" -n "$rate_n" --rps "$rate" -c "$C" --connections "$CONNS" --keys "$KEYS" \
			--seed 99 --label "${labels[$k]}" --json-file "$f" >"$OUT/rate-$name.txt"
		grep -E '99% in|99.9% in' "$OUT/rate-$name.txt" | tr -s ' \t' ' ' | tr '\n' ' '
		echo
		rate_reports+=("$f")
	done
fi
stop_all

# Order the table floor, one, three, hot whatever the glob order.
ordered=()
for name in floor one three hot; do
	for f in "${reports[@]}"; do
		case "$f" in */"$name"-*.json) ordered+=("$f") ;; esac
	done
done
echo
echo "End to end on loopback, c=$C, $N calls per run, median of $ROUNDS runs (reports in $OUT):"
"$BIN" bench --compare "$(IFS=,; echo "${ordered[*]}")" | tee "$OUT/table.txt"
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" | tee -a "$OUT/machine.txt"


# The targets of docs/performance.md, read off the table (columns: x floor = $4, p99 x = $8 after the label).
awk -v one="one node" -v three="three nodes" -v hot="three nodes, 1 key" '
	function num(s) { sub(/x$/, "", s); return s + 0 }
	NR == 1 { next }
	index($0, hot) == 1 {
		# One hot key within 0.8x of the same load over many keys.
		if (spread > 0)
			printf "target hot key >= 0.80x three nodes calls/s: %.2fx %s\n", $(NF - 7) / spread, ($(NF - 7) / spread >= 0.80 ? "met" : "MISSED")
		next
	}
	{
		# The label may hold spaces: count columns from the end.
		xf = num($(NF - 6)); p99x = num($(NF - 2))
		if (index($0, one) == 1) {
			printf "target one node   >= 0.90x floor calls/s: %.2fx %s\n", xf, (xf >= 0.90 ? "met" : "MISSED")
			printf "target one node   p99 <= 1.30x floor p99: %.2fx %s\n", p99x, (p99x <= 1.30 ? "met" : "MISSED")
		}
		if (index($0, three) == 1) {
			spread = $(NF - 7)
			printf "target three nodes >= 0.75x floor calls/s: %.2fx %s\n", xf, (xf >= 0.75 ? "met" : "MISSED")
		}
	}' "$OUT/table.txt" | tee -a "$OUT/table.txt"

# Server CPU per call (all of a setup's server processes, user + system,
# median over the rounds): unlike calls/s it does not depend on how busy the
# rest of the machine was, so it says where the cost is on a shared machine.
echo
echo "server CPU per call (median of $ROUNDS runs; the load tool's own CPU is not included):"
median_cpu() {
	awk -v n="$1" '$1 == n { v[++c] = $2 }
		END {
			if (c == 0) exit
			for (i = 2; i <= c; i++) for (j = i; j > 1 && v[j] < v[j - 1]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
			print v[int((c + 1) / 2)]
		}' "$OUT/cpu.txt"
}
floor_cpu=$(median_cpu floor)
for k in 0 1 2 3; do
	awk -v l="${labels[$k]}" -v v="$(median_cpu "${names[$k]}")" -v f="$floor_cpu" \
		'BEGIN { printf "  %-20s %7.1f us  %5.2fx floor\n", l, v, (f > 0 ? v / f : 0) }'
done | tee -a "$OUT/table.txt"

if [ ${#rate_reports[@]} -gt 0 ]; then
	echo
	echo "Latency at a fixed rate: $rate calls/s (${RATE_FRACTION} of the floor's $floor_cps), $rate_n calls, c=$C (reports in $OUT):"
	"$BIN" bench --compare "$(IFS=,; echo "${rate_reports[*]}")" | tee "$OUT/rate-table.txt"
	awk -v three="three nodes" 'NR > 1 && index($0, three) == 1 {
		p = $(NF - 3) + 0
		printf "target three nodes p99.9 at a fixed rate far inside 20 ms (<= 10 ms): %.3f ms %s\n", p, (p <= 10 ? "met" : "MISSED")
	}' "$OUT/rate-table.txt" | tee -a "$OUT/rate-table.txt"
fi

# --- capped scaling: equal CPU per server process ------------------------------
# Its own servers, cgroups and cleanup; it skips itself in one line without
# root or a cpu controller. A hit over the limit fails it, and with it this
# script, after the rest has run.
capped_rc=0
if [ "$CAPPED" != 0 ]; then
	echo
	set +e
	deploy/local/bench-capped.sh "$BIN" "$OUT/capped" 2>&1 | tee "$OUT/capped.txt"
	capped_rc=${PIPESTATUS[0]}
	set -e
fi

# --- --data-dir: saving and restoring 1 M counters ---------------------------
# The file goes under $OUT, on the disk the repository is on (a temporary
# directory may be in memory, where fsync costs nothing).
if [ "$DATADIR" != 0 ]; then
	echo
	echo "--data-dir with 1 M hour-window counters (seed-shaped keys), median of 3 (output in $OUT/datadir.txt):"
	set +e
	RINGLIMIT_BENCH_DIR=$(cd "$OUT" && pwd) "$GO" test -run '^$' -bench '^BenchmarkDataDir' -benchtime 3x -count 3 -benchmem \
		./cmd/ringlimit/ >"$OUT/datadir.txt" 2>&1
	rc=$?
	set -e
	if [ $rc -ne 0 ]; then
		echo "bench.sh: the --data-dir benchmarks failed (exit $rc); see $OUT/datadir.txt" >&2
		exit $rc
	fi
	# Columns: name runs ns/op [B/key] MiB ...; medians by ns/op.
	awk '/^BenchmarkDataDir/ {
		name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkDataDir/, "", name)
		ms = $3 / 1e6; mib = ""; bkey = ""
		for (i = 4; i < NF; i++) { if ($(i + 1) == "MiB") mib = $i; if ($(i + 1) == "B/key") bkey = $i }
		k = ++n[name]; v[name, k] = ms; m[name] = mib; b[name] = bkey
	}
	function median(name,   c, i, j, t, a) {
		c = n[name]; for (i = 1; i <= c; i++) a[i] = v[name, i]
		for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j] < a[j - 1]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return a[int((c + 1) / 2)]
	}
	END {
		if (n["Save"]) printf "  save (snapshot, fsync, rename): %7.0f ms per 1 M keys, %s MiB on disk (%s bytes per key)\n", median("Save"), m["Save"], b["Save"]
		if (n["Restore"]) printf "  restore (read, check, merge):   %7.0f ms per 1 M keys\n", median("Restore")
	}' "$OUT/datadir.txt" | tee "$OUT/datadir-table.txt"
fi

# --- Go micro-benchmarks -----------------------------------------------------
if [ "$MICRO" != 0 ]; then
	echo
	echo "Go micro-benchmarks (-count $COUNT -benchtime $BENCHTIME), benchstat-ready in $OUT/micro.txt"
	set +e
	"$GO" test -run '^$' -bench . -benchmem -count "$COUNT" -benchtime "$BENCHTIME" \
		./bucket/ ./rls/ ./ring/ ./cluster/transport/ >"$OUT/micro.txt" 2>&1
	rc=$?
	set -e
	# One line per benchmark: its median run by ns/op.
	awk '/^Benchmark/ && $4 == "ns/op" {
		if (!($1 in n)) order[++names] = $1
		k = ++n[$1]; v[$1, k] = $3 + 0; l[$1, k] = $0
	}
	END {
		for (i = 1; i <= names; i++) {
			b = order[i]; c = n[b]
			for (x = 1; x <= c; x++) idx[x] = x
			for (x = 2; x <= c; x++)
				for (y = x; y > 1 && v[b, idx[y]] < v[b, idx[y - 1]]; y--) { t = idx[y]; idx[y] = idx[y - 1]; idx[y - 1] = t }
			print l[b, idx[int((c + 1) / 2)]]
		}
	}' "$OUT/micro.txt"
	grep -m1 '^cpu:' "$OUT/micro.txt" >>"$OUT/machine.txt" || true
	if [ $rc -ne 0 ]; then
		echo "bench.sh: go test -bench failed (exit $rc); see $OUT/micro.txt" >&2
		exit $rc
	fi
	echo "compare two runs with: benchstat old/micro.txt $OUT/micro.txt"
fi

if [ "$capped_rc" -ne 0 ]; then
	echo "bench.sh: the capped scaling section failed (exit $capped_rc); see $OUT/capped.txt" >&2
	exit "$capped_rc"
fi
