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
	 daemon/coord_sm.c daemon/reader_sm.c daemon/side_table.c 2>/dev/null | sort)
ne=$(printf '%s\n' "$engine" | grep -c .)
if [ "$ne" -lt 20 ]; then
	echo "errconv-grep: FAIL: only $ne engine files found; is the list right?"
	exit 1
fi
# A -1 in any spelling: `return -1;`, `return (-1);`, `return - 1 ;`,
# `return (int)-1;`, `return x, -1;`, `return f(a,\n b), -1;` over lines,
# and arithmetic on an errno (`return -EINVAL + 21;`, `return -EPERM * 1;`),
# which hides a -1 or any other value the edge cannot map.  One return
# statement at a time, blanks, parentheses and casts dropped, then matched.
bare_returns() {
	awk '
	function flush(   e) {
		e = stmt
		sub(/^.*[^A-Za-z0-9_]return[^A-Za-z0-9_]/, "", e)
		sub(/^return[^A-Za-z0-9_]/, "", e)
		sub(/;.*$/, "", e)
		gsub(/[ \t]/, "", e)
		gsub(/\((int|long|ssize_t|int64_t|int32_t|signed|unsigned)\)/, "", e)
		gsub(/[()]/, "", e)
		if (e ~ /^-0*1$/ || e ~ /^-0[xX]0*1$/ || e ~ /,-0*1$/ || e ~ /^~0$/ ||
		    e ~ /^-E[A-Z0-9_]+[-+*\/%|&^<>]/ || e ~ /,-E[A-Z0-9_]+[-+*\/%|&^<>]/)
			printf "%s:%d: %s\n", FILENAME, start, stmt
		stmt = ""
	}
	{
		line = $0
		if (incom) {
			if (line !~ /\*\//)
				next
			sub(/^.*\*\//, "", line)
			incom = 0
		}
		gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", line)
		if (line ~ /\/\*/) {
			sub(/\/\*.*$/, "", line)
			incom = 1
		}
		sub(/\/\/.*$/, "", line)
		if (stmt == "") {
			if (line !~ /(^|[^A-Za-z0-9_])return([^A-Za-z0-9_]|$)/)
				next
			start = FNR
			stmt = line
		} else {
			stmt = stmt " " line
		}
		if (stmt ~ /;/)
			flush()
	}' "$@"
}
# Self-test on planted snippets: every bad form is found, no good one is.
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
cat >"$t/bad.c" <<'EOF_BAD'
	return -1;
	return (-1);
	return ( - 1 ) ;
	return (int)-1;
	return -EINVAL + 21;
	return (-EPERM * 1);
	return snprintf(buf, n, "x"), -1;
	if (x) return -1;
	return derr_set(e, "long",
			arg), -1;
	return -0x1;
EOF_BAD
cat >"$t/good.c" <<'EOF_GOOD'
	return -EINVAL;
	return (-ENOMEM);
	return derr(e, -EIO, "x");
	return n - 1;
	return x[i - 1];
	return -10;
	return i + -1 > 0 ? 0 : -EINVAL;
	return 1;
	/* return -1; in a comment is prose */
	/* prose over lines:
	 * return -1; is what this must not do
	 */
	return 0; // not return -1;
EOF_GOOD
nb=$(bare_returns "$t/bad.c" | grep -c .)
ng=$(bare_returns "$t/good.c" | grep -c .)
if [ "$nb" -ne 10 ] || [ "$ng" -ne 0 ]; then
	bare_returns "$t/bad.c" "$t/good.c"
	echo "errconv-grep: FAIL: self-test found $nb of 10 bad returns and $ng of 0 good ones"
	exit 1
fi
bare=0
for f in $engine; do
	hits=$(bare_returns "$f")
	c=$(printf '%s' "$hits" | grep -c .)
	if [ "$c" -gt 0 ]; then
		printf '%s\n' "$hits"
		echo "FAIL: $f returns a bare -1 or errno arithmetic ($c): return a negative errno" \
		     "with a reason (daemon/derr.h)"
		exit 1
	fi
	bare=$((bare + c))
done
echo "errconv-grep: files=$n hits=0 engine_files=$ne bare_minus_one=$bare"
