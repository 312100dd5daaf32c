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

# name<TAB>hint seconds<TAB>exclusive(0/1)<TAB>path, longest first.
for t in "$@"; do
	name=$(basename "$t")
	secs=""
	[ -r "$B/tests/$name.secs" ] && secs=$(cat "$B/tests/$name.secs")
	[ -z "$secs" ] && secs=$(awk -v n="$name" '$1 == n { print $2 }' "$here/durations.txt" 2>/dev/null)
	excl=0
	grep -q '^# dte-test: exclusive' "$t" 2>/dev/null && excl=1
	printf '%s\t%s\t%s\t%s\n' "$name" "${secs:-30}" "$excl" "$t"
done | sort -t "$(printf '\t')" -k2,2nr -s >"$res.order"

# shellcheck disable=SC2016 # $0 is the field, for awk
awk -F '\t' '$3 == 0 { print $4 }' "$res.order" | xargs -r -n 1 -P "$jobs" "$here/run-one.sh"
awk -F '\t' '$3 == 1 { print $4 }' "$res.order" | xargs -r -n 1 -P 1 "$here/run-one.sh"

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
