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

# A listener restarted on its fixed port while the old one's accepted
# connection sits in TIME_WAIT binds again (UCX_TCP_CM_REUSEADDR, set by the
# peer layer); a port another listener really holds is still refused.
# One round: a listener with one connected client, both SIGKILLed, the
# listener first.  Whether the listener's side ends in TIME_WAIT (FIN) or
# is reset (RST: data still unread when it died) is the kernel's call, so
# rounds repeat, on the same port, until one leaves TIME_WAIT behind.
# await_listener PORTFILE ERRFILE WHAT: wait up to 10 s for the listener
# $srv to write its port; fail loudly, with its log, if it dies first.
await_listener() {
	i=0
	until [ -s "$1" ]; do
		i=$((i + 1))
		kill -0 "$srv" 2>/dev/null || { echo "$3 failed:"; cat "$2"; srv=; exit 1; }
		[ $i -lt 100 ] || { echo "$3 never bound"; exit 1; }
		sleep 0.1
	done
}
rport=
tw=no
round=0
while [ $round -lt 8 ] && [ $tw = no ]; do
	round=$((round + 1))
	rm -f "$dir/rport" "$dir/rc.out"
	"$PROBE" serve --addr 127.0.0.1 ${rport:+--port "$rport"} --portfile "$dir/rport" \
		>"$dir/r1.out" 2>"$dir/r1.err" &
	srv=$!
	await_listener "$dir/rport" "$dir/r1.err" "round $round: listener"
	rport=$(cat "$dir/rport")
	"$PROBE" connect --addr 127.0.0.1 --port "$rport" --small 1 --large-count 0 --hold \
		>"$dir/rc.out" 2>"$dir/rc.err" &
	victim=$!
	i=0
	until grep -q '^ready' "$dir/rc.out" 2>/dev/null; do
		i=$((i + 1)); [ $i -lt 100 ] || { echo "restart client not ready"; exit 1; }
		sleep 0.1
	done
	if [ $round = 1 ]; then
		if timeout 10 "$PROBE" serve --addr 127.0.0.1 --port "$rport" --portfile "$dir/taken" \
			>/dev/null 2>"$dir/taken.err"; then
			echo "a second listener bound port $rport while the first still listens"; exit 1
		fi
		grep -q 'Address already in use' "$dir/taken.err" ||
			{ echo "taken port: unexpected error"; cat "$dir/taken.err"; exit 1; }
	fi
	kill -9 "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true
	srv=
	# the client may already have left: it sees the listener go down
	kill -9 "$victim" 2>/dev/null || true; wait "$victim" 2>/dev/null || true
	victim=
	i=0
	while [ $i -lt 10 ]; do
		if ss -Htan state time-wait "( sport = :$rport )" | grep -q .; then tw=yes; break; fi
		i=$((i + 1)); sleep 0.1
	done
done
# Whether a SIGKILLed listener's side ends in TIME_WAIT is the kernel's
# call (under ASan every round was once reset): then make one on the port
# for sure, with a plain TCP connection the port's side closes first (an
# active close leaves that side in TIME_WAIT), and restart on that.
if [ $tw = no ]; then
	/usr/bin/python3 - "$rport" <<'PY' || { echo "could not make a TIME_WAIT on $rport"; exit 1; }
import socket, sys
port = int(sys.argv[1])
lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", port))
lst.listen(1)
cli = socket.create_connection(("127.0.0.1", port))
srv, _ = lst.accept()
lst.close()
srv.close()             # FIN from the port's side first: it goes to TIME_WAIT
cli.settimeout(5)
cli.recv(1)             # the FIN
cli.close()
PY
	i=0
	while [ $i -lt 50 ]; do
		if ss -Htan state time-wait "( sport = :$rport )" | grep -q .; then tw=made; break; fi
		i=$((i + 1)); sleep 0.1
	done
fi
# Without TIME_WAIT on the port the restart below would prove nothing.
[ $tw != no ] || { echo "no TIME_WAIT on port $rport after $round rounds"; exit 1; }
"$PROBE" serve --addr 127.0.0.1 --port "$rport" --portfile "$dir/rport2" --downs 1 \
	>"$dir/r2.out" 2>"$dir/r2.err" &
srv=$!
await_listener "$dir/rport2" "$dir/r2.err" "restarted listener (in TIME_WAIT)"
"$PROBE" connect --addr 127.0.0.1 --port "$rport" --small 10 --large-count 0 \
	>"$dir/rc2.out" 2>"$dir/rc2.err" || { echo "connect to the restarted listener failed"; exit 1; }
wait "$srv" || { echo "restarted server failed"; cat "$dir/r2.err"; srv=; exit 1; }
srv=
echo "peer-restart: time_wait=$tw rebind=yes taken_port_refused=yes"
echo "peer-loopback: $summary mb_s=$mbs"
