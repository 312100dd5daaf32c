#!/bin/sh
# Peer transport over loopback with the probe: 1000 echoed small messages and
# 64 MiB rendezvous messages into a registered staging buffer (content checked
# on both sides, throughput printed), then a client killed with SIGKILL must
# be reported down while the server keeps running and exits cleanly.
set -eu
B=${B:-build}
PROBE=$B/bin/dte-peer-probe
export UCX_TLS=${UCX_TLS:-tcp} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
dir=$(mktemp -d)
srv=
cleanup() {
	[ -n "$srv" ] && kill "$srv" 2>/dev/null || true
	[ -n "${victim:-}" ] && kill -9 "$victim" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

# Two peers go down: the clean client, then the killed one.
timeout 120 "$PROBE" serve --addr 127.0.0.1 --portfile "$dir/port" --downs 2 \
	>"$dir/srv.out" 2>"$dir/srv.err" &
srv=$!
i=0
while [ ! -s "$dir/port" ]; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "server did not start"; cat "$dir/srv.err"; exit 1; }
	sleep 0.1
done
port=$(cat "$dir/port")

timeout 120 "$PROBE" connect --addr 127.0.0.1 --port "$port" \
	--small 1000 --large-mb 64 --large-count 4 >"$dir/cli.out" 2>"$dir/cli.err" ||
	{ echo "client failed"; cat "$dir/cli.out" "$dir/cli.err"; exit 1; }
grep '^peer-probe:' "$dir/cli.out"
mbs=$(sed -n 's/^peer-probe:.*MB\/s=\([0-9]*\).*/\1/p' "$dir/cli.out")

"$PROBE" connect --addr 127.0.0.1 --port "$port" --small 10 \
	--large-count 0 --hold >"$dir/victim.out" 2>"$dir/victim.err" &
victim=$!
i=0
until grep -q '^ready' "$dir/victim.out" 2>/dev/null; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "victim not ready"; exit 1; }
	sleep 0.1
done
kill -9 "$victim"
t0=$(date +%s)
wait "$srv" || { echo "server failed"; cat "$dir/srv.out" "$dir/srv.err"; srv=; exit 1; }
srv=
t1=$(date +%s)
cat "$dir/srv.out"
grep -q 'down_detected=yes' "$dir/srv.out"
grep -q 'bad=0' "$dir/srv.out"
[ $((t1 - t0)) -le 10 ] || { echo "down detection took $((t1 - t0))s"; exit 1; }
msgs=$(sed -n 's/^peer: messages=\([0-9]*\).*/\1/p' "$dir/srv.out")
[ "$msgs" -eq 1014 ] || { echo "expected 1014 messages, got $msgs"; exit 1; }
summary=$(grep '^peer: ' "$dir/srv.out" | sed 's/^peer: //; s/ bad=0//')
echo "peer-loopback: $summary mb_s=$mbs"
