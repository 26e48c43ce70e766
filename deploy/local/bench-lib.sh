# Helpers of deploy/local/bench.sh and bench-capped.sh (sourced, not
# run): free ports on 127.0.0.1, plain HTTP GETs, bounded waits and the
# readiness checks of a node. wait_until names $OUT in its message.

# --- free ports on 127.0.0.1 -------------------------------------------------
# Picked below the kernel's ephemeral range, so that no outgoing connection
# (gRPC, gossip, the load tool's) holds one between the check and the bind.
used=" "
eph_lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "${eph_lo:-0}" -gt 12000 ] || eph_lo=32768
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((10000 + RANDOM % (eph_lo - 10000)))
		case "$used" in *" $p "*) continue ;; esac
		if ! port_open "$p"; then
			used="$used$p "
			echo "$p"
			return 0
		fi
	done
	echo "bench: no free port found" >&2
	return 1
}

# http_get HOST:PORT PATH prints the body of a plain HTTP/1.0 GET (no curl needed).
http_get() {
	local host=${1%:*} port=${1##*:}
	(
		exec 3<>"/dev/tcp/$host/$port" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$1" >&3
		timeout 2 cat <&3 | sed '1,/^\r\{0,1\}$/d'
	) 2>/dev/null
}

# wait_until SECONDS DESCRIPTION COMMAND...: bounded polling.
wait_until() {
	local secs=$1 what=$2
	shift 2
	local i
	for i in $(seq 1 $((secs * 10))); do
		if "$@"; then return 0; fi
		sleep 0.1
	done
	echo "bench: $what not ready after ${secs}s; logs in $OUT" >&2
	return 1
}

ring_size() { http_get "$1" /debug/cluster | tr -d ' \n\r' | grep -o '"ring":\[[^]]*\]' | grep -o '"[^"]*"' | grep -vc '"ring"'; }
ring_is() { [ "$(ring_size "$1")" = "$2" ]; }
healthy() { http_get "$1" /healthcheck | grep -qx OK; }
