#!/usr/bin/env bash
# The capped scaling section of `make bench`: every server process (the
# floor and each ringlimit node) in its own cgroup with the same CPU quota,
# the load tool uncapped, so that calls/s of three (and five) nodes against
# one node is the cluster's scaling at equal CPU per node. Three loads:
#   uniform  10,000 client IPs, a limit far above the load
#   hot      one client IP, under its limit
#   seed     the seed's limit (100 per minute per remote_address + PATH),
#            uniform over BENCH_CAP_IPS client IPs, each well over it
# and, once per setup, 40 keys at 50 per hour sent 100 hits each: every key
# must allow exactly 50 (fails the script otherwise).
# Every run goes to fresh keys (its own PATH or bench_run value), so no run
# finds its windows spent by an earlier one, and ringlimit bench --limits
# counts early refusals and hits over the limit. Any hit over the limit
# fails the script.
#
# Needs root and a cpu controller: cgroup v1's at /sys/fs/cgroup/cpu, or a
# cgroup v2 hierarchy whose root delegates cpu (cgroup.subtree_control).
# Without them it says so in one line and exits 0. It creates one group per
# run (ringlimit-bench-<pid>-<time>) with a child per server process, and
# removes them on exit, Ctrl-C included, after stopping the servers it
# started (by PID). Everything listens on 127.0.0.1.
#
# Usage: deploy/local/bench-capped.sh path/to/ringlimit OUTDIR
# Environment (defaults in brackets):
#   BENCH_CPU_QUOTA [0.25]     CPUs per server process
#   BENCH_CAP_NODES [1 3 5]    cluster sizes (1 is the single node)
#   BENCH_CAP_N [30000]        calls per measured run
#   BENCH_CAP_LOADS [uniform hot seed]  which of the three loads to run
#   BENCH_CAP_ROUNDS [3]       runs per setup and load, interleaved; medians
#   BENCH_CAP_WARMUP [3s]      load before each run, discarded: on the run's
#                              own keys for hot, on others for seed
#   BENCH_CAP_WARMUP_UNIFORM_N [100000]  calls sent first to uniform's own
#                              keys (10 per key whatever the setup's speed,
#                              so that each node has seen each key before
#                              the run, as under steady traffic)
#   BENCH_CAP_IPS [200]        client IPs of the seed load
#   BENCH_CAP_DEADLINE [1s]    per-call deadline (CFS throttling stalls a
#                              capped process for up to a period, 100 ms)
#   BENCH_C [64]               concurrent calls
#   BENCH_CAP_CONNS [15]       gRPC connections, the same for every setup
#                              (15 spreads evenly over 1, 3 and 5 nodes)
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${1:?usage: bench-capped.sh path/to/ringlimit OUTDIR}
OUT=${2:?usage: bench-capped.sh path/to/ringlimit OUTDIR}
QUOTA=${BENCH_CPU_QUOTA:-0.25}
NODES=${BENCH_CAP_NODES:-1 3 5}
N=${BENCH_CAP_N:-30000}
LOADS=${BENCH_CAP_LOADS:-uniform hot seed}
ROUNDS=${BENCH_CAP_ROUNDS:-3}
WARMUP=${BENCH_CAP_WARMUP:-3s}
WARMUP_UNIFORM_N=${BENCH_CAP_WARMUP_UNIFORM_N:-100000}
IPS=${BENCH_CAP_IPS:-200}
DEADLINE=${BENCH_CAP_DEADLINE:-1s}
C=${BENCH_C:-64}
CONNS=${BENCH_CAP_CONNS:-15}
PERIOD=100000 # us
mkdir -p "$OUT"

# The loads, checked before anything starts.
# shellcheck disable=SC2206 # a list of words
cases=($LOADS)
title() {
	case $1 in
	uniform) echo "10,000 uniform client IPs, a limit far above the load" ;;
	hot) echo "one client IP, under its limit" ;;
	seed) echo "the seed's limit, 100 per minute per client IP + PATH, uniform over $IPS client IPs" ;;
	*) echo "bench-capped.sh: unknown load $1 in BENCH_CAP_LOADS (uniform, hot, seed)" >&2; return 1 ;;
	esac
}
for c in "${cases[@]}"; do title "$c" >/dev/null; done

skip() {
	echo "capped scaling section skipped: $*"
	exit 0
}

# --- the cpu controller --------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root to create cgroups (id -u is $(id -u))"
quota_us=$(awk -v q="$QUOTA" -v p="$PERIOD" 'BEGIN { if (q + 0 > 0) printf "%d", q * p }')
if [ -z "$quota_us" ] || [ "$quota_us" -lt 1000 ]; then
	echo "bench-capped.sh: BENCH_CPU_QUOTA=$QUOTA: want a share of at least 0.01 CPU" >&2
	exit 2
fi
cg_mode="" cg_root=""
if [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && [ -w /sys/fs/cgroup/cpu/cgroup.procs ]; then
	cg_mode=v1 cg_root=/sys/fs/cgroup/cpu
else
	v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
	if [ -n "$v2" ] && grep -qw cpu "$v2/cgroup.subtree_control" 2>/dev/null; then
		cg_mode=v2 cg_root=$v2
	fi
fi
[ -n "$cg_mode" ] || skip "no usable cpu controller (neither cgroup v1's /sys/fs/cgroup/cpu nor a cgroup v2 root delegating cpu)"
# Where this script's own processes are, to move servers back to.
if [ "$cg_mode" = v1 ]; then
	home=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ { print $3; exit }' /proc/self/cgroup)
else
	home=$(awk -F: '$1 == "0" { print $3; exit }' /proc/self/cgroup)
fi
home=$cg_root${home%/}
[ -w "$home/cgroup.procs" ] || home=$cg_root
group=$cg_root/ringlimit-bench-$$-$(date +%s)
mkdir "$group" 2>/dev/null || skip "cannot create a cgroup under $cg_root"
groups=("$group")

# new_group NAME: a child of $group capped at the quota; prints its path.
new_group() {
	local g=$group/$1
	mkdir "$g"
	if [ "$cg_mode" = v1 ]; then
		echo "$PERIOD" >"$g/cpu.cfs_period_us"
		echo "$quota_us" >"$g/cpu.cfs_quota_us"
	else
		echo "$quota_us $PERIOD" >"$g/cpu.max"
	fi
	echo "$g"
}

# --- cleanup: servers by PID, then our groups ------------------------------------
pids=()
cleanup() {
	local pid g i
	[ -z "${loadpid:-}" ] || kill -TERM "$loadpid" 2>/dev/null || true
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	pids=()
	# Deepest first; anything still inside (only what we put there) goes home.
	for ((i = ${#groups[@]} - 1; i >= 0; i--)); do
		g=${groups[$i]}
		[ -d "$g" ] || continue
		while read -r pid; do
			[ -n "$pid" ] && echo "$pid" >"$home/cgroup.procs" 2>/dev/null || true
		done <"$g/cgroup.procs"
		rmdir "$g" 2>/dev/null || echo "bench-capped.sh: could not remove cgroup $g" >&2
	done
	groups=()
}
trap 'cleanup' EXIT
trap 'cleanup; exit 130' INT TERM

# shellcheck source=deploy/local/bench-lib.sh
. deploy/local/bench-lib.sh

# capped NAME LOG CMD...: starts CMD inside a new capped group (from its
# first instruction), in the background; its PID is $!.
capped() {
	local g
	g=$(new_group "$1")
	groups+=("$g")
	local log=$2
	shift 2
	(
		echo "$BASHPID" >"$g/cgroup.procs"
		exec "$@"
	) >"$log" 2>&1 &
	pids+=($!)
}

# --- the config: the seed's rule, and one far above any load -------------------
config=$OUT/config
mkdir -p "$config"
cat >"$config/ratelimit.yaml" <<'EOF'
domain: ratelimit
descriptors:
  - key: remote_address
    descriptors:
      - key: PATH
        rate_limit:
          unit: minute
          requests_per_unit: 100
      - key: bench_run
        rate_limit:
          unit: hour
          requests_per_unit: 1000000000
      - key: bench_exact
        rate_limit:
          unit: hour
          requests_per_unit: 50
EOF

# --- servers ---------------------------------------------------------------------
echo "capped scaling: every server process at $QUOTA CPU (cgroup $cg_mode, $group), the load tool uncapped"
floor_grpc=127.0.0.1:$(free_port)
capped floor "$OUT/floor.log" "$BIN" bench --noop-server "$floor_grpc"
pids_floor=$!
targets_floor=$floor_grpc
wait_until 10 "capped floor" port_open "${floor_grpc##*:}"

setups=()
for n in $NODES; do
	grpc=() http=() debug=() gossip=()
	for ((i = 0; i < n; i++)); do
		grpc+=("127.0.0.1:$(free_port)")
		http+=("127.0.0.1:$(free_port)")
		debug+=("127.0.0.1:$(free_port)")
		gossip+=("127.0.0.1:$(free_port)")
	done
	p=""
	for ((i = 0; i < n; i++)); do
		args=(serve --node-name "cap$n-$i" --config "$config" --log-level warn
			--grpc-addr "${grpc[$i]}" --http-addr "${http[$i]}" --debug-addr "${debug[$i]}")
		if [ "$n" -gt 1 ]; then
			args+=(--gossip-addr "${gossip[$i]}" --join "$(IFS=,; echo "${gossip[*]}")")
		fi
		capped "n$n-$i" "$OUT/nodes$n-$i.log" "$BIN" "${args[@]}"
		p="$p${p:+,}$!"
	done
	for ((i = 0; i < n; i++)); do
		if [ "$n" -gt 1 ]; then
			wait_until 60 "capped node cap$n-$i (ring of $n)" ring_is "${debug[$i]}" "$n"
		else
			wait_until 30 "capped node cap$n-$i" healthy "${http[$i]}"
		fi
	done
	eval "pids_n$n=\$p"
	eval "targets_n$n=\$(IFS=,; echo \"\${grpc[*]}\")"
	setups+=("n$n")
done
echo "capped servers up: floor $floor_grpc; nodes ${NODES// /, }"

label() {
	case $1 in
	floor) echo "floor (noop RLS)" ;;
	n1) echo "one node" ;;
	n3) echo "three nodes" ;;
	n5) echo "five nodes" ;;
	*) echo "${1#n} nodes" ;;
	esac
}

# load OUTFILE ARGS...: one ringlimit bench run, in the background so that
# a signal to this script stops it at once (bash runs traps only between
# foreground commands).
load() {
	local out=$1
	shift
	"$BIN" bench "$@" >"$out" &
	loadpid=$!
	wait "$loadpid"
	loadpid=""
}
loadpid=""

# --- load: rounds interleave every load and setup --------------------------------
for r in $(seq 1 "$ROUNDS"); do
	for c in "${cases[@]}"; do
		list=("${setups[@]}")
		[ "$c" = uniform ] && list+=(floor)
		for s in "${list[@]}"; do
			tag="r$r-$c-$s-$$"
			case $c in
			uniform) keys=10000 desc="remote_address={ip},bench_run=$tag" ;;
			hot) keys=1 desc="remote_address={ip},bench_run=$tag" ;;
			seed) keys=$IPS desc="remote_address={ip},PATH=/login-$tag" ;;
			esac
			tv=targets_$s pv=pids_$s
			f="$OUT/$c-$s-$r.json"
			printf 'capped round %d/%d  %-8s %-18s ' "$r" "$ROUNDS" "$c" "$(label "$s")"
			# uniform and hot warm their own keys (far under their limit):
			# the run measures a steady state, in which each node already
			# holds leases on the keys it is sent, not every key's first
			# hit at each node. seed warms other keys: its windows must
			# start with the run.
			warm_keys=$keys warm_desc=$desc warm=(-z "$WARMUP")
			[ "$c" = uniform ] && warm=(-n "$WARMUP_UNIFORM_N")
			[ "$c" = seed ] && warm_keys=10000 warm_desc="remote_address={ip},bench_run=warm-$tag"
			if [ "${warm[1]}" != 0 ] && [ "${warm[1]}" != 0s ]; then
				load /dev/null --addr "${!tv}" "${warm[@]}" -c "$C" --connections "$CONNS" --keys "$warm_keys" \
					--descriptor "$warm_desc" --deadline "$DEADLINE" --seed "$((r + 1000))"
			fi
			load "$OUT/$c-$s-$r.txt" --addr "${!tv}" -n "$N" -c "$C" --connections "$CONNS" --keys "$keys" \
				--descriptor "$desc" --deadline "$DEADLINE" --seed "$r" --limits --server-pids "${!pv}" \
				--label "$(label "$s")" --json-file "$f"
			grep -E 'Requests/sec|99% in|Server CPU|Load tool CPU|Early refusals' "$OUT/$c-$s-$r.txt" |
				sed 's/ (.*//' | tr -s ' \t' ' ' | tr '\n' ' '
			echo
		done
	done
done
# --- exactness: 40 keys x limit 50, 100 hits each, through every node of a setup --
exact_bad=0
echo
echo "exact: 40 keys at 50 per hour, 100 hits each (4,000 calls, c=$C) through every node of a setup"
for s in "${setups[@]}"; do
	tv=targets_$s
	f="$OUT/exact-$s.json"
	load "$OUT/exact-$s.txt" --addr "${!tv}" -n 4000 -c "$C" --connections "$CONNS" --keys 40 \
		--descriptor "remote_address={ip},bench_exact=exact-$s-$$" --deadline "$DEADLINE" --limits --json-file "$f"
	ok=$(grep -o '"ok": [0-9]*' "$f" | head -1 | awk '{ print $2 }')
	over=$(grep -o '"over_limit_hits": [0-9]*' "$f" | awk '{ print $2 }')
	printf '  %-12s %5s allowed (want 2000 = 40 x 50), %s over the limit\n' "$(label "$s")" "$ok" "${over:-?}"
	[ "$ok" = 2000 ] || exact_bad=1
done
cleanup

# --- tables: one per load, ratios to one node ----------------------------------
overs=0
echo
echo "Capped scaling: every server process at $QUOTA CPU, c=$C, $CONNS connections, $N calls per run, median of $ROUNDS interleaved runs"
echo "(x first: calls/s and p99 against one node; cpu us/call: all of a setup's server processes; early, over: hits"
echo " summed over the runs, early as a share of the budget; reports in $OUT)"
for c in "${cases[@]}"; do
	files=()
	list=("${setups[@]}")
	[ "$c" = uniform ] && list+=(floor)
	for s in "${list[@]}"; do
		for r in $(seq 1 "$ROUNDS"); do files+=("$OUT/$c-$s-$r.json"); done
	done
	echo
	echo "$c: $(title "$c")"
	"$BIN" bench --compare "$(IFS=,; echo "${files[*]}")" | tee "$OUT/table-$c.txt"
	for f in "${files[@]}"; do
		o=$(grep -o '"over_limit_hits": [0-9]*' "$f" | awk '{ print $2 }')
		if [ -n "$o" ] && [ "$o" -gt 0 ]; then
			echo "bench-capped.sh: $o hits allowed over the limit in $f" >&2
			overs=$((overs + o))
		fi
	done
done
if [ "$exact_bad" -gt 0 ]; then
	echo
	echo "FAILED: a setup did not allow exactly 50 hits to each of the 40 keys; see $OUT/exact-*.txt" >&2
	exit 1
fi
if [ "$overs" -gt 0 ]; then
	echo
	echo "FAILED: $overs hits allowed over the limit (must be 0); see the reports in $OUT" >&2
	exit 1
fi
echo
echo "hits over the limit: 0 in every run"
