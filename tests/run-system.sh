#!/bin/sh
# Run every system test script given, each in turn; print one summary line.
set -u
pass=0; fail=0
mkdir -p "${B:-build}/tests"
for t in "$@"; do
	name=$(basename "$t")
	log="${B:-build}/tests/$name.log"
	start=$(date +%s)
	if "$t" >"$log" 2>&1; then
		pass=$((pass + 1))
		printf 'ok    %s (%ss)\n' "$name" "$(( $(date +%s) - start ))"
		grep -E '^[a-z0-9-]+: ' "$log" | tail -3 | sed 's/^/      /'
	else
		fail=$((fail + 1))
		printf 'FAIL  %s (log: %s)\n' "$name" "$log"
		tail -40 "$log"
	fi
done
echo "system: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
