#!/usr/bin/env bash
# Starts a three-node ringlimit cluster on 127.0.0.1 serving
# deploy/examples/config, prints how to reach it, and stops every node it
# started on Ctrl-C. Usage: run-cluster.sh [path/to/ringlimit] [nodes]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-.build/ringlimit}
N=${2:-3}
CONFIG=${RINGLIMIT_EXAMPLE_CONFIG:-deploy/examples/config}
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/ringlimit-run.XXXXXX")
# Gossip is encrypted with a key made for this run, as in a real cluster.
KEY="$LOGDIR/gossip.key"
(umask 077 && head -c 32 /dev/urandom | base64 >"$KEY")

join=""
for i in $(seq 0 $((N - 1))); do
	join="${join:+$join,}127.0.0.1:$((7946 + i))"
done

pids=()
stop() {
	trap - INT TERM EXIT
	echo
	echo "stopping ${#pids[@]} node(s)..."
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	echo "logs kept in $LOGDIR"
}
trap stop INT TERM EXIT

for i in $(seq 0 $((N - 1))); do
	off=$((i * 100))
	"$BIN" serve \
		--node-name "ringlimit-$i" \
		--config "$CONFIG" \
		--grpc-addr "127.0.0.1:$((8081 + off))" \
		--http-addr "127.0.0.1:$((8080 + off))" \
		--debug-addr "127.0.0.1:$((6070 + off))" \
		--gossip-addr "127.0.0.1:$((7946 + i))" \
		--join "$join" \
		--gossip-key-file "$KEY" \
		>"$LOGDIR/ringlimit-$i.log" 2>&1 &
	pids+=($!)
	printf 'ringlimit-%d  grpc 127.0.0.1:%d  http 127.0.0.1:%d  debug 127.0.0.1:%d  gossip 127.0.0.1:%d  log %s\n' \
		"$i" $((8081 + off)) $((8080 + off)) $((6070 + off)) $((7946 + i)) "$LOGDIR/ringlimit-$i.log"
done

# Wait (bounded, 10 s per node) until every node reports healthy.
for i in $(seq 0 $((N - 1))); do
	url="http://127.0.0.1:$((8080 + i * 100))/healthcheck"
	healthy=0
	for _ in $(seq 1 100); do
		if curl -fsS "$url" >/dev/null 2>&1; then healthy=1; break; fi
		if ! kill -0 "${pids[$i]}" 2>/dev/null; then echo "ringlimit-$i exited; see its log:"; tail -20 "$LOGDIR/ringlimit-$i.log"; exit 1; fi
		sleep 0.1
	done
	if [ "$healthy" != 1 ]; then
		echo "ringlimit-$i is not healthy after 10 s ($url); its log:"
		tail -20 "$LOGDIR/ringlimit-$i.log"
		exit 1
	fi
done

# The addresses to try: the last node's HTTP port, every node's gRPC port.
last_http=127.0.0.1:$((8080 + (N - 1) * 100))
grpc_all=$(seq 0 $((N - 1)) | awk '{ printf "%s127.0.0.1:%d", (NR > 1 ? "," : ""), 8081 + $1 * 100 }')

cat <<MSG

cluster of $N ready. Try (any node answers for any key):
  $BIN check --addr 127.0.0.1:8081 --domain ratelimit --descriptor remote_address=10.0.0.1,PATH=/login
  curl -s -XPOST $last_http/json -d '{"domain":"ratelimit","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"},{"key":"PATH","value":"/login"}]}]}'
  curl -s 127.0.0.1:6070/debug/cluster
  $BIN bench --addr $grpc_all -n 20000 -c 32
Ctrl-C stops all nodes.
MSG
wait
