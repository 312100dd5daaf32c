#!/bin/sh
# The daemon's one error convention (daemon/derr.h): inside the daemon a
# failure is a negative errno plus a reason; the wire status
# (Dte__Status, DTE__STATUS__*) is chosen only at the edges.  This fails
# when any other daemon source names a wire status again, or when an
# engine file returns a bare -1 instead of a negative errno.
#
# Edges: derr.[ch] (the mapping), dispatch.[ch] and ctl.c (the control
# server) and cmd_*.c (the control handlers).
set -u
cd "$(dirname "$0")/../.." || exit 1
files=$(find daemon -name '*.[ch]' | grep -Ev '^daemon/(derr\.[ch]|dispatch\.[ch]|ctl\.c|cmd_[a-z_]+\.c)$' | sort)
n=$(printf '%s\n' "$files" | grep -c .)
# Never pass on an empty or wrong list: the engine must be among what is read.
for must in daemon/job.c daemon/job_src.c daemon/job_sink.c daemon/job_ops.c daemon/buf.c \
	    daemon/job.h daemon/job_state.h daemon/job_state.c daemon/registry.c; do
	if ! printf '%s\n' "$files" | grep -qx "$must"; then
		echo "errconv-grep: FAIL: $must not among the files checked"
		exit 1
	fi
done
# shellcheck disable=SC2086 # word splitting wanted: paths have no spaces
hits=$(grep -nE 'DTE__STATUS__|\bDte__Status\b' $files)
if [ -n "$hits" ]; then
	printf '%s\n' "$hits"
	echo "errconv-grep: files=$n hits=$(printf '%s\n' "$hits" | grep -c .)"
	echo "FAIL: the engine names a wire status; return a negative errno with a reason" \
	     "(daemon/derr.h) and let the edge map it"
	exit 1
fi
# Inside the engine a failure is a negative errno, never a bare -1
# (`return -1;`, `return snprintf(...), -1;`): the errno is what the edge
# maps, and -1 would read as -EPERM (denied).  The engine: the files of
# docs/SYNC.md's Layers and the helpers they stand on.  None holds one:
# a bare -1 anywhere in them fails here.
engine=$(ls daemon/job*.c daemon/job*.h daemon/route.c daemon/route.h daemon/buf.c \
	 daemon/bufpool.c daemon/recvpool.c daemon/registry.c daemon/sink_sm.c daemon/pair_sm.c \
	 daemon/coord_sm.c daemon/side_table.c 2>/dev/null | sort)
ne=$(printf '%s\n' "$engine" | grep -c .)
if [ "$ne" -lt 20 ]; then
	echo "errconv-grep: FAIL: only $ne engine files found; is the list right?"
	exit 1
fi
bare=0
for f in $engine; do
	c=$(grep -cE '\breturn -1;|\breturn [^;]*, -1;' "$f")
	max=0
	if [ "$c" -gt "$max" ]; then
		grep -nE '\breturn -1;|\breturn [^;]*, -1;' "$f" | sed "s|^|$f:|"
		echo "FAIL: $f returns a bare -1 ($c, at most $max): return a negative errno with" \
		     "a reason (daemon/derr.h)"
		exit 1
	fi
	bare=$((bare + c))
done
echo "errconv-grep: files=$n hits=0 engine_files=$ne bare_minus_one=$bare"
