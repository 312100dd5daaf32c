#!/bin/sh
# The sync engine is an instance (daemon/job.h: struct dte_engine,
# dte_engine_new): two engines can live in one process, so no engine
# file may keep mutable state outside it.  Read from the built objects'
# symbol tables (nm): for every engine object (the files of
# engine_layers.sh's ROWS), each defined data or bss symbol, file-static
# ones included, is a singleton; constants are not (.rodata and
# .data.rel.ro: tables, a const struct of function pointers).
#
# route.o is read and its symbols listed, but not counted: the router is
# process-level (one per daemon: its node name, its transports, its
# local queue; daemon/route.h says so), and giving each engine a router
# of its own is a later step of issue 31.
#
# wire_types_in_engine counts the control protocol's types (Dte__) in
# the engine's headers (daemon/job*.h), and wire_calls_in_engine its
# names (Dte__, dte__, DTE__: types, pack and init calls, constants) in
# the engine's files (daemon/job*.c): both must be 0.  The engine's API is
# plain C (daemon/job_api.h: requests, results, and a completion per
# request for the answers it defers, as raft's raft_apply(r, req, ..., cb)).
# The wire adapters translate, and are not engine files: the control
# handlers daemon/cmd_*.c (requests in, replies and deferred answers out)
# and daemon/wire_job.c (a job's creation as the JobCreateRequest
# job_persist.c keeps on disk, the format its files always had).
#
# io_calls_outside_interface counts the calls of libuv (uv_*), of the
# router (route_*), of the wake (dwake_*) and of the directory watch
# (dts_watch_start/stop) that an engine object makes itself (its
# undefined symbols, nm -u): the engine reaches the world only through
# its struct dte_engine_io (daemon/engine_io.h; the default over libuv and
# route.c is daemon/engine_io_uv.c, not an engine file).
#
# Prints "engine-api: wire_types_in_engine=W singletons=S process_level=P",
# "engine-api: wire_calls_in_engine=C" and
# "engine-api: io_calls_outside_interface=N", and each symbol and wire
# name; fails when W, C, S or N > 0.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${B:-build}
O=$B/obj/daemon
# The same files as engine_layers.sh's ROWS, and the engine's two files
# outside the layers (peer auth, kept jobs).  job_cuda.c (the process's
# device buffers and scratch) and job_snapshot.c (a CPU dispatch chosen
# once) are process-level and say so.
FILES='job job_metrics job_storage job_local job_coord job_src job_sink job_sink_intake job_sink_aoa
job_sink_stage job_sink_apply job_sink_version job_ops job_capture job_task
job_state route coord_sm pair_sm sink_sm reader_sm job_auth job_persist'
# Process-level, listed and not counted (see above).
PROCESS='route'
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
for f in $FILES; do
	if [ ! -f "$O/$f.o" ]; then
		echo "engine-api: FAIL: $O/$f.o not built (make first)"
		exit 1
	fi
	# sysv format: name|value|class|type|size|line|section
	nm -f sysv --defined-only "$O/$f.o" | awk -F'|' -v f="$f" '
		{
			for (i = 1; i <= NF; i++)
				gsub(/^[ \t]+|[ \t]+$/, "", $i)
		}
		$3 ~ /^[bBdD]$/ && $7 !~ /^\.(rodata|data\.rel\.ro)/ {
			print f, $1, $3, $7
		}' >>"$tmp"
done
w=$(cat daemon/job*.h | grep -o 'Dte__' | wc -l)
wc=$(cat daemon/job*.c | grep -oE 'Dte__|dte__|DTE__' | wc -l)
# Never pass on files not read: the engine's API and its top file.
for must in daemon/job.h daemon/job_api.h daemon/job_state.h daemon/job.c daemon/job_sink.c; do
	if [ ! -f "$must" ]; then
		echo "engine-api: FAIL: $must missing; is the list right?"
		exit 1
	fi
done
grep -n 'Dte__' daemon/job*.h | sed 's/^/engine-api: wire type in the engine'"'"'s API: /'
grep -nE 'Dte__|dte__|DTE__' daemon/job*.c | sed 's/^/engine-api: wire name in an engine file: /'
s=0
p=0
while read -r f sym type sect; do
	case " $PROCESS " in
	*" $f "*)
		p=$((p + 1))
		echo "engine-api: process-level (not counted): $f.o $sym ($type, $sect)"
		;;
	*)
		s=$((s + 1))
		echo "engine-api: singleton: $f.o $sym ($type, $sect)"
		;;
	esac
done <"$tmp"
echo "engine-api: wire_types_in_engine=$w singletons=$s process_level=$p"
echo "engine-api: wire_calls_in_engine=$wc"
io=0
for f in $FILES; do
	case " $PROCESS " in *" $f "*) continue ;; esac
	for sym in $(nm -u "$O/$f.o" | awk '{ print $2 }' |
		grep -E '^(uv_|route_|dwake_|dts_watch_(start|stop)$)'); do
		io=$((io + 1))
		echo "engine-api: io call outside the interface: $f.o $sym"
	done
done
echo "engine-api: io_calls_outside_interface=$io"
# One place chooses host or device compute (daemon/job_cuda.c, jdev_*):
# no other engine object names a compute backend itself.
be=0
for f in $FILES; do
	for sym in $(nm -u "$O/$f.o" | awk '{ print $2 }' | grep -E '^dtc_backend_'); do
		be=$((be + 1))
		echo "engine-api: compute backend chosen outside job_cuda.c: $f.o $sym"
	done
done
echo "engine-api: backend_choices_outside_jdev=$be"
# No engine-wide event: a lower file learns nothing through a function
# the engine holds for it (a completion comes with its request: struct
# jwait, jsink_make_writer).  Function pointers among struct dte_engine's
# own members, its I/O (io), the test build's hooks (ext) and the
# daemon's created hook aside.
ev=$(awk '/^struct dte_engine \{/ { on = 1; next } on && /^\};/ { on = 0 }
	on && /\(\*[a-z_]+\)\(/ && !/\(\*created\)/ { print }' daemon/job_state.h)
nev=$(printf '%s' "$ev" | grep -c . || true)
[ -n "$ev" ] && printf '%s\n' "$ev" | sed 's/^/engine-api: an engine-wide event: /'
echo "engine-api: engine_events=$nev"
fail=0
if [ "$nev" -gt 0 ]; then
	echo "FAIL: struct dte_engine holds a function a lower file calls up through; take a" \
	     "completion with the request instead (docs/SYNC.md, Layers)"
	fail=1
fi
if [ "$w" -gt 0 ] || [ "$wc" -gt 0 ]; then
	echo "FAIL: the engine names the control protocol; take and fill plain types" \
	     "(daemon/job_api.h) and let daemon/cmd_*.c translate"
	fail=1
fi
if [ "$s" -gt 0 ]; then
	echo "FAIL: mutable state outside struct dte_engine; move it into the engine (daemon/job_state.h) or make it const"
	fail=1
fi
if [ "$be" -gt 0 ]; then
	echo "FAIL: an engine file names a compute backend; go through jdev_* (daemon/job_cuda.h)"
	fail=1
fi
if [ "$io" -gt 0 ]; then
	echo "FAIL: an engine file calls libuv or the router itself; go through e->io (daemon/engine_io.h)"
	fail=1
fi
exit $fail
