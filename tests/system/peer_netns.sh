#!/bin/sh
# Peer transport between two network namespaces joined by a veth pair
# (UCX_TLS=tcp: shared-memory wakeups do not cross namespaces).  Uses only
# 10.231.x.y/30 addresses inside namespaces it creates, removes them on exit.
set -eu
B=${B:-build}
PROBE=$(readlink -f "$B/bin/dte-peer-probe")
if [ "$(id -u)" -ne 0 ] || ! ip netns list >/dev/null 2>&1; then
	echo "SKIP: peer-netns needs root and ip netns (uid $(id -u))"
	exit 77
fi
tag=$(( $$ % 250 + 1 ))
nsa=dted-pa-$$ nsb=dted-pb-$$
va=dpa$$ vb=dpb$$
ipa=10.231.$tag.1 ipb=10.231.$tag.2
dir=$(mktemp -d)
srv= victim=
cleanup() {
	[ -n "$srv" ] && kill "$srv" 2>/dev/null || true
	[ -n "$victim" ] && kill -9 "$victim" 2>/dev/null || true
	ip netns del "$nsa" 2>/dev/null || true
	ip netns del "$nsb" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

ip netns add "$nsa"
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "$ipa/30" dev "$va"
ip -n "$nsb" addr add "$ipb/30" dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up

export UCX_TLS=tcp
UCX_NET_DEVICES=$va timeout 120 ip netns exec "$nsa" "$PROBE" serve \
	--addr "$ipa" --portfile "$dir/port" --downs 2 \
	>"$dir/srv.out" 2>"$dir/srv.err" &
srv=$!
i=0
while [ ! -s "$dir/port" ]; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "server did not start"; cat "$dir/srv.err"; exit 1; }
	sleep 0.1
done
port=$(cat "$dir/port")

UCX_NET_DEVICES=$vb timeout 120 ip netns exec "$nsb" "$PROBE" connect \
	--addr "$ipa" --port "$port" --small 1000 --large-mb 64 --large-count 2 \
	>"$dir/cli.out" 2>"$dir/cli.err" ||
	{ echo "client failed"; cat "$dir/cli.out" "$dir/cli.err"; exit 1; }
grep '^peer-probe:' "$dir/cli.out"
mbs=$(sed -n 's/^peer-probe:.*MB\/s=\([0-9]*\).*/\1/p' "$dir/cli.out")

# The victim is exec'ed by ip netns exec, so $! is the probe itself.
UCX_NET_DEVICES=$vb ip netns exec "$nsb" "$PROBE" connect --addr "$ipa" \
	--port "$port" --small 10 --large-count 0 --hold \
	>"$dir/victim.out" 2>"$dir/victim.err" &
victim=$!
i=0
until grep -q '^ready' "$dir/victim.out" 2>/dev/null; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "victim not ready"; cat "$dir/victim.err"; exit 1; }
	sleep 0.1
done
kill -9 "$victim"
victim=
t0=$(date +%s)
wait "$srv" || { echo "server failed"; cat "$dir/srv.out" "$dir/srv.err"; srv=; exit 1; }
srv=
t1=$(date +%s)
cat "$dir/srv.out"
grep -q 'down_detected=yes' "$dir/srv.out"
grep -q 'bad=0' "$dir/srv.out"
[ $((t1 - t0)) -le 10 ] || { echo "down detection took $((t1 - t0))s"; exit 1; }
summary=$(grep '^peer: ' "$dir/srv.out" | sed 's/^peer: //; s/ bad=0//')
echo "peer-netns: $summary down_after_s=$((t1 - t0)) mb_s=$mbs"
