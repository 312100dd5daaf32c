#!/bin/sh
# tests/fuzz/run-smoke.sh — run each libFuzzer target for a bounded time,
# starting from its committed seed corpus (tests/fuzz/corpus/<target>/).
#
# New inputs the fuzzer finds go to a scratch directory, never into the
# repository; a crash, leak, timeout or out-of-memory leaves its input in
# $B/fuzz/artifacts/ and fails the run.  One line per target, then
#   fuzz: targets=N execs=E crashes=C
#
# The mutation seed is fixed (FUZZ_SEED, default 1) so that a finding in CI
# replays the same way on a developer's machine of similar speed; set
# FUZZ_SEED=0 for libFuzzer's own random seed (a longer campaign).
#
# Usage (from the repo root): B=build FUZZ_SECONDS=20 tests/fuzz/run-smoke.sh fuzz_frame ...
# Reproduce a finding: $B/fuzz/<target> $B/fuzz/artifacts/<target>-crash-...
set -u

B=${B:-build}
SECS=${FUZZ_SECONDS:-20}
SEED=${FUZZ_SEED:-1}
work=$(mktemp -d "${TMPDIR:-/tmp}/dte-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT INT TERM
mkdir -p "$B/fuzz/artifacts"

targets=0 execs=0 crashes=0
for t in "$@"; do
	bin="$B/fuzz/$t"
	seeds="tests/fuzz/corpus/$t"
	log="$work/$t.log"
	targets=$((targets + 1))
	if [ ! -x "$bin" ]; then
		echo "$t: missing $bin (run make fuzz)"
		crashes=$((crashes + 1))
		continue
	fi
	mkdir -p "$work/$t" "$seeds"
	"$bin" -seed="$SEED" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$B/fuzz/artifacts/$t-" \
		"$work/$t" "$seeds" >"$log" 2>&1
	rc=$?
	n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
	corp=$(ls "$work/$t" | wc -l)
	nseed=$(ls "$seeds" | wc -l)
	execs=$((execs + ${n:-0}))
	if [ "$rc" -eq 0 ]; then
		echo "$t: execs=${n:-0} cov=${cov:-0} seeds=$nseed new=$corp time=${SECS}s seed=$SEED ok"
	else
		crashes=$((crashes + 1))
		echo "$t: execs=${n:-0} cov=${cov:-0} seed=$SEED FAILED (exit $rc)"
		grep -E 'ERROR: |SUMMARY: |property broken|runtime error|Test unit written' "$log" |
			head -n 8 | sed 's/^/    /'
	fi
done
echo "fuzz: targets=$targets execs=$execs crashes=$crashes"
[ "$crashes" -eq 0 ]
