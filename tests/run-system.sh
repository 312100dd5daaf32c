#!/bin/sh
# Run every system test script given, each in turn; report each as passed,
# failed or skipped; print one summary line; fail if any failed.
#
# Skip convention: a script that cannot run here prints one line
# `SKIP: <reason>` on stdout and exits 77.  Exit 77 without that line is a
# failure (the reason is part of the result).  Result lines (`name: k=v`)
# of a passing script are shown under it.
#
# With RESULTS=<file> set, one record per script is appended to it for
# tests/run-all.sh: "pass\t<name>", "fail\t<name>\t<log>", "skip\t<name>\t<reason>".
set -u
tab=$(printf '\t')
pass=0; fail=0; skip=0
record() {
	[ -n "${RESULTS:-}" ] && printf '%s\n' "$*" >>"$RESULTS"
	return 0
}
mkdir -p "${B:-build}/tests"
for t in "$@"; do
	name=$(basename "$t")
	log="${B:-build}/tests/$name.log"
	start=$(date +%s)
	"$t" >"$log" 2>&1
	rc=$?
	secs=$(( $(date +%s) - start ))
	why=$(sed -n 's/^SKIP: *//p' "$log" | tail -1)
	if [ "$rc" -eq 0 ]; then
		pass=$((pass + 1))
		record "pass${tab}$name"
		printf 'ok    %s (%ss)\n' "$name" "$secs"
		grep -E '^[a-z0-9-]+: ' "$log" | tail -5 | sed 's/^/      /'
	elif [ "$rc" -eq 77 ] && [ -n "$why" ]; then
		skip=$((skip + 1))
		record "skip${tab}$name${tab}$why"
		printf 'SKIP  %s: %s\n' "$name" "$why"
	else
		fail=$((fail + 1))
		record "fail${tab}$name${tab}$log"
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
	fi
done
echo "system: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
