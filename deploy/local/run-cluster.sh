#!/usr/bin/env bash
# Starts a ringlimit cluster on 127.0.0.1 serving deploy/examples/config,
# prints how to reach it, and on Ctrl-C (SIGINT) or SIGTERM stops every node
# it started, waits for them and exits 0.
#
# Usage: run-cluster.sh [path/to/ringlimit] [nodes]
#
# RUN_PORT_BASE (default 8080) moves every port: node i listens on
# BASE+100i (HTTP), BASE+100i+1 (gRPC), BASE+100i+2 (debug) and
# BASE+100i+3 (gossip). RINGLIMIT_EXAMPLE_CONFIG names another config.
set -euo pipefail

# On a terminal, Ctrl-C signals the terminal's whole foreground process
# group: make (which then exits 130 whatever this script does) and, with
# `make run | tee log`, tee. So the script runs itself again as a job under
# job control (set -m): that job gets a process group of its own and the
# terminal, Ctrl-C reaches only it, it stops the nodes and exits 0, and make
# and tee see it end normally. Only when this process's group holds the
# terminal (not when started in the background). This process only waits
# for the job, and a SIGTERM or SIGHUP ends it at once; the job watches it
# and stops the nodes when it is gone.
if [ -t 0 ] && [ -z "${RUN_CLUSTER_JOB:-}" ] &&
	read -r pgid tpgid < <(ps -o pgid=,tpgid= -p $$ 2>/dev/null) && [ "$pgid" = "$tpgid" ]; then
	set -m
	RUN_CLUSTER_JOB=1 "$0" "$@" && exit 0 || exit $?
fi

cd "$(dirname "$0")/../.."
BIN=${1:-.build/ringlimit}
N=${2:-3}
BASE=${RUN_PORT_BASE:-8080}
CONFIG=${RINGLIMIT_EXAMPLE_CONFIG:-deploy/examples/config}

die() { echo "run-cluster: $*" >&2; exit 2; }
case "$N" in '' | *[!0-9]*) die "nodes: '$N' is not a number" ;; esac
case "$BASE" in '' | *[!0-9]*) die "RUN_PORT_BASE='$BASE' is not a number" ;; esac
[ "$N" -ge 1 ] && [ "$N" -le 20 ] || die "nodes: $N is not in [1, 20]"
top=$((BASE + (N - 1) * 100 + 3))
[ "$BASE" -ge 1024 ] && [ "$top" -le 65535 ] ||
	die "RUN_PORT_BASE=$BASE: the ports of $N nodes run from $BASE to $top; pick a base from 1024 to $((65535 - (N - 1) * 100 - 3))"
[ -x "$BIN" ] || die "$BIN: no such executable (make run builds it)"

http_port() { echo $((BASE + $1 * 100)); }
grpc_port() { echo $((BASE + $1 * 100 + 1)); }
debug_port() { echo $((BASE + $1 * 100 + 2)); }
gossip_port() { echo $((BASE + $1 * 100 + 3)); }

LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/ringlimit-run.XXXXXX")
# Gossip is encrypted with a key made for this run, as in a real cluster.
KEY="$LOGDIR/gossip.key"
(umask 077 && head -c 32 /dev/urandom | base64 >"$KEY")

join=""
for i in $(seq 0 $((N - 1))); do
	join="${join:+$join,}127.0.0.1:$(gossip_port "$i")"
done

# Ctrl-C reaches the whole foreground process group: make, this script,
# the nodes and, with `make run | tee log`, tee, so stdout may be a closed
# pipe by now. Nothing here may stop this before every node has stopped:
# writes that fail are ignored (no SIGPIPE, no set -e), and the nodes are
# waited for. Then the script exits 0, so make reports no error.
pids=()
watcher=""
stopping=0
stop() {
	trap '' INT TERM PIPE
	set +e
	[ "$stopping" = 1 ] && return
	stopping=1
	{
		echo
		echo "stopping ${#pids[@]} node(s)..."
	} 2>/dev/null
	for pid in "${pids[@]}" $watcher; do kill -TERM "$pid" 2>/dev/null; done
	for pid in "${pids[@]}" $watcher; do wait "$pid" 2>/dev/null; done
	echo "stopped; logs kept in $LOGDIR" 2>/dev/null
	exit "${1:-0}"
}
trap 'stop 0' INT TERM
trap 'stop $?' EXIT

# As the job started at the top: stop when the script that started it has
# ended (make passed it a SIGTERM, say), polling once a second. The watcher
# holds no output open, so a `| tee` never waits for it.
if [ -n "${RUN_CLUSTER_JOB:-}" ]; then
	parent=$PPID
	(
		trap 'kill "$s" 2>/dev/null; exit 0' TERM
		while kill -0 "$parent" 2>/dev/null; do
			sleep 1 &
			s=$!
			wait "$s"
		done
		kill -TERM $$
	) </dev/null >/dev/null 2>&1 &
	watcher=$!
fi

echo "starting $N node(s) on 127.0.0.1 (ports from RUN_PORT_BASE=$BASE), logs in $LOGDIR"
for i in $(seq 0 $((N - 1))); do
	"$BIN" serve \
		--node-name "ringlimit-$i" \
		--config "$CONFIG" \
		--grpc-addr "127.0.0.1:$(grpc_port "$i")" \
		--http-addr "127.0.0.1:$(http_port "$i")" \
		--debug-addr "127.0.0.1:$(debug_port "$i")" \
		--gossip-addr "127.0.0.1:$(gossip_port "$i")" \
		--join "$join" \
		--gossip-key-file "$KEY" \
		--shutdown-timeout 5s \
		>"$LOGDIR/ringlimit-$i.log" 2>&1 &
	pids+=($!)
	printf '  ringlimit-%d  grpc 127.0.0.1:%d  http 127.0.0.1:%d  debug 127.0.0.1:%d  gossip 127.0.0.1:%d\n' \
		"$i" "$(grpc_port "$i")" "$(http_port "$i")" "$(debug_port "$i")" "$(gossip_port "$i")"
done

# Wait (bounded, 15 s per node) until every node reports healthy.
echo "waiting for every node to join the others and report ready..."
for i in $(seq 0 $((N - 1))); do
	url="http://127.0.0.1:$(http_port "$i")/healthcheck"
	healthy=0
	for _ in $(seq 1 150); do
		if curl -fsS "$url" >/dev/null 2>&1; then healthy=1; break; fi
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then
			echo "ringlimit-$i exited; its log ($LOGDIR/ringlimit-$i.log) ends:"
			tail -20 "$LOGDIR/ringlimit-$i.log"
			exit 1
		fi
		sleep 0.1
	done
	if [ "$healthy" != 1 ]; then
		echo "ringlimit-$i is not ready after 15 s; $url says: $(curl -s "$url" 2>&1)"
		echo "its log ($LOGDIR/ringlimit-$i.log) ends:"
		tail -20 "$LOGDIR/ringlimit-$i.log"
		exit 1
	fi
done

# The addresses to try: the last node's HTTP port, every node's gRPC port.
last_http=127.0.0.1:$(http_port $((N - 1)))
grpc_all=$(for i in $(seq 0 $((N - 1))); do printf '%s127.0.0.1:%d' "${sep:-}" "$(grpc_port "$i")"; sep=,; done)

cat <<MSG

cluster of $N ready. Try (any node answers for any key):
  $BIN check --addr 127.0.0.1:$(grpc_port 0) --domain ratelimit --descriptor remote_address=10.0.0.1,PATH=/login
  curl -s -XPOST $last_http/json -d '{"domain":"ratelimit","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"},{"key":"PATH","value":"/login"}]}]}'
  curl -s 127.0.0.1:$(debug_port 0)/debug/cluster
  $BIN bench --addr $grpc_all -n 20000 -c 32
Ctrl-C stops all nodes.
MSG
# Until a signal (stop exits) or a node exits on its own (then stop too).
wait -n "${pids[@]}" || true
echo "a node exited on its own; stopping the others"
stop 1
