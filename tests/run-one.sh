#!/bin/sh
# One system test script for tests/run-system.sh: run it, record its result
# in $DTE_RUN_RESULTS and print its report under $DTE_RUN_LOCK (lanes run
# side by side; a report is printed whole).  Always exits 0: the result is
# the record.
set -u
if [ "${1:-}" = "--lane" ]; then
	# A lane: scripts separated by the unit separator (\037), in order.
	us=$(printf '\037')
	IFS=$us
	# shellcheck disable=SC2086 # split on the separator, wanted
	set -- $2
	unset IFS
	for t in "$@"; do
		"$0" "$t"
	done
	exit 0
fi
t=$1
tab=$(printf '\t')
name=$(basename "$t")
log="$B/tests/$name.log"
out="$log.report"
start=$(date +%s)
"$t" >"$log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
why=$(sed -n 's/^SKIP: *//p' "$log" | tail -1)
if [ "$rc" -eq 0 ]; then
	rec="pass${tab}$name"
	echo "$secs" >"$B/tests/$name.secs"
	{
		printf 'ok    %s (%ss)\n' "$name" "$secs"
		grep -E '^[a-z0-9-]+: ' "$log" | tail -5 | sed 's/^/      /'
	} >"$out"
elif [ "$rc" -eq 77 ] && [ -n "$why" ]; then
	rec="skip${tab}$name${tab}$why"
	printf 'SKIP  %s: %s\n' "$name" "$why" >"$out"
else
	rec="fail${tab}$name${tab}$log"
	{
		if [ "$rc" -eq 77 ]; then
			printf 'FAIL  %s (exit 77 without a "SKIP: reason" line; log: %s)\n' "$name" "$log"
		else
			printf 'FAIL  %s (exit %d, %ss; log: %s)\n' "$name" "$rc" "$secs" "$log"
		fi
		# The cause first (a CI log shows only so much): failed checks
		# and a Python exception's last line; then the log's tail.
		grep -E '^FAIL: ' "$log" | head -10 | sed 's/^/    /'
		grep -E '^[A-Za-z_.]*(Error|Exception|[Tt]imeout)[A-Za-z]*: ' "$log" | tail -1 | sed 's/^/    /'
		tail -40 "$log"
	} >"$out"
fi
flock "$DTE_RUN_LOCK" sh -c 'cat "$1"; printf "%s\n" "$2" >>"$3"' sh "$out" "$rec" "$DTE_RUN_RESULTS"
rm -f "$out"
exit 0
