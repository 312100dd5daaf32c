#!/bin/sh
# Run every CMocka binary given; print one summary line; fail if any failed.
set -u
pass=0; fail=0; failed=""
for t in "$@"; do
	name=$(basename "$t")
	if "$t" >"$t.log" 2>&1; then
		pass=$((pass + 1))
		printf 'ok    %s  %s\n' "$name" "$(grep -E '\[  PASSED  \]' "$t.log" | tail -1)"
	else
		fail=$((fail + 1)); failed="$failed $name"
		printf 'FAIL  %s (log: %s)\n' "$name" "$t.log"
		tail -30 "$t.log"
	fi
done
echo "unit: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
