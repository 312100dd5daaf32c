#!/bin/sh
# The daemon's one error convention (daemon/derr.h): inside the daemon a
# failure is a negative errno plus a reason; the wire status
# (Dte__Status, DTE__STATUS__*) is chosen only at the edges.  This fails
# when any other daemon source names a wire status again.
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
echo "errconv-grep: files=$n hits=0"
