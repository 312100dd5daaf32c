#!/bin/sh
# Run every CMocka binary given; report each test case as passed, failed or
# skipped; print one summary line; fail if any failed.
#
# Counting: unit results are counted per CMocka test case, not per binary,
# so a binary with one skipped case shows up as N-1 passed, 1 skipped (the
# skip is never hidden inside a "passing" binary).  A skipped case's reason
# is the last line the test printed before skip() (print_message).  A
# binary that exits non-zero counts its failed/errored cases, and at least
# one failure even if it printed none (a crash, an ASan report at exit, a
# leak); one that exits 0 without running a test counts as a failure.
#
# Binaries run TEST_JOBS (default 2) at a time, the longest first (by
# tests/durations.txt; the others in the order given); each one's report
# is printed whole when it ends.
#
# With RESULTS=<file> set, one record per result is appended to it for
# tests/run-all.sh: "pass\t<name>", "fail\t<name>\t<log>", "skip\t<name>\t<reason>".
set -u
tab=$(printf '\t')

if [ "${1:-}" = "--one" ]; then
	# One binary (a lane of the run below): its records to
	# $DTE_RUN_RESULTS, its report printed under $DTE_RUN_LOCK.
	t=$2
	recs=$(mktemp)
	record() {
		printf '%s\n' "$*" >>"$recs"
	}
	{
		name=$(basename "$t")
		log="$t.log"
		# The standard output format whatever the caller's environment says.
		CMOCKA_MESSAGE_OUTPUT=stdout "$t" >"$log" 2>&1
		rc=$?
		# Outcomes of the cases, from the per-test lines only (the summary at
		# the end of a group repeats the names); each failed case's name and
		# each skipped case's reason go to $log.cases.
		rm -f "$log.cases"
		counts=$(awk -v cases="$log.cases" '
			/^\[==========\] Running /   { insum = 0; next }
			/^\[==========\] .* run\./   { insum = 1; next }
			insum                        { next }
			/^\[ RUN      \] /           { why = ""; next }
			/^\[       OK \] /           { ok++; next }
			/^\[  ERROR   \] ---/        { next }
			/^\[  (FAILED  |ERROR   )\] / { bad++; printf "fail\t%s\n", substr($0, 14) > cases; next }
			/^\[  SKIPPED \] /           { sk++
			                               printf "skip\t%s\t%s\n", substr($0, 14),
			                                      (why == "" ? "(no reason printed)" : why) > cases
			                               next }
			/^\[/                        { next }
			/[^ \t]/                     { why = $0 }
			END { printf "%d %d %d\n", ok, bad, sk }
		' "$log")
		ok=$(echo "$counts" | cut -d" " -f1)
		bad=$(echo "$counts" | cut -d" " -f2)
		sk=$(echo "$counts" | cut -d" " -f3)
		touch "$log.cases"
		if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
			# crashed, sanitizer report, or failed outside a test case
			bad=1; printf 'fail\t(exit %d outside a test case)\n' "$rc" >>"$log.cases"
		fi
		if [ "$rc" -eq 0 ] && [ "$bad" -ne 0 ]; then
			rc=1	# a failed case must not pass because of the exit status
		fi
		if [ "$rc" -eq 0 ] && [ $((ok + sk)) -eq 0 ]; then
			bad=1; rc=1
			printf 'fail\t(ran no test case)\n' >>"$log.cases"
		fi
		i=0
		while [ "$i" -lt "$ok" ]; do record "pass${tab}$name"; i=$((i + 1)); done
		if [ "$rc" -eq 0 ]; then
			printf 'ok    %s  %d passed%s\n' "$name" "$ok" \
				"$([ "$sk" -gt 0 ] && printf ', %d skipped' "$sk")"
			# Result lines (`name: k=v`, e.g. the fixture's) under it, as
			# run-system.sh shows a system test's.
			grep -E '^[a-z0-9-]+: [a-z_]+=' "$log" | tail -5 | sed 's/^/      /'
		else
			printf 'FAIL  %s (exit %d; log: %s)\n' "$name" "$rc" "$log"
			tail -30 "$log"
		fi
		while IFS="$tab" read -r what case why; do
			if [ "$what" = skip ]; then
				printf 'SKIP  %s/%s: %s\n' "$name" "$case" "$why"
				record "skip${tab}$name/$case${tab}$why"
			else
				printf 'FAIL  %s/%s\n' "$name" "$case"
				record "fail${tab}$name/$case${tab}$log"
			fi
		done <"$log.cases"
		rm -f "$log.cases"
	} >"$t.log.report"
	flock "$DTE_RUN_LOCK" sh -c 'cat "$1"; cat "$2" >>"$3"' sh "$t.log.report" "$recs" "$DTE_RUN_RESULTS"
	rm -f "$t.log.report" "$recs"
	exit 0
fi

res=$(mktemp)
lock=$(mktemp)
trap 'rm -f "$res" "$lock"' EXIT
export DTE_RUN_RESULTS="$res" DTE_RUN_LOCK="$lock"
here=$(cd "$(dirname "$0")" && pwd)
for t in "$@"; do
	secs=$(awk -v n="$(basename "$t")" '$1 == n { print $2 }' "$here/durations.txt" 2>/dev/null)
	printf '%s\t%s\n' "${secs:-0}" "$t"
done | sort -t "$tab" -k1,1nr -s | cut -f2 | xargs -r -n 1 -P "${TEST_JOBS:-2}" "$0" --one
pass=$(grep -c "^pass$tab" "$res")
fail=$(grep -c "^fail$tab" "$res")
skip=$(grep -c "^skip$tab" "$res")
[ -n "${RESULTS:-}" ] && cat "$res" >>"$RESULTS"
echo "unit: $pass passed, $fail failed, $skip skipped (test cases in $# binaries)"
[ "$fail" -eq 0 ]
