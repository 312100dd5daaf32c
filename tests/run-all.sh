#!/bin/sh
# `make test`: the unit tests, then the system tests, then what was skipped
# (each with its reason), what failed, and as the very last line
#     N passed, N failed, N skipped
# summed over both layers (unit: CMocka test cases; system: scripts).
# Exits non-zero when anything failed (or a runner itself broke), zero when
# there were only passes and skips.
#
#   tests/run-all.sh [UNIT_BINARY...] -- [SYSTEM_SCRIPT...]
set -u
here=$(dirname "$0")
mkdir -p "${B:-build}/tests"
RESULTS="${B:-build}/tests/results.txt"
export RESULTS
: >"$RESULTS"

units=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
	units="$units $1"
	shift
done
[ $# -gt 0 ] && shift	# the --

urc=0 src=0
if [ -n "$units" ]; then
	# shellcheck disable=SC2086 # word splitting wanted: paths have no spaces
	"$here/run-unit.sh" $units || urc=$?
fi
if [ $# -gt 0 ]; then
	"$here/run-system.sh" "$@" || src=$?
fi

tab=$(printf '\t')
npass=$(grep -c "^pass$tab" "$RESULTS")
nfail=$(grep -c "^fail$tab" "$RESULTS")
nskip=$(grep -c "^skip$tab" "$RESULTS")
# A runner that failed without recording a failure (it broke itself).
if [ "$nfail" -eq 0 ] && { [ "$urc" -ne 0 ] || [ "$src" -ne 0 ]; }; then
	echo "fail${tab}a test runner exited non-zero (unit $urc, system $src)${tab}-" >>"$RESULTS"
	nfail=1
fi
echo
if [ "$nskip" -gt 0 ]; then
	echo "Skipped ($nskip):"
	grep "^skip$tab" "$RESULTS" | while IFS="$tab" read -r _ name why; do
		printf '  %s: %s\n' "$name" "$why"
	done
fi
if [ "$nfail" -gt 0 ]; then
	echo "Failed ($nfail):"
	grep "^fail$tab" "$RESULTS" | while IFS="$tab" read -r _ name log; do
		printf '  %s (log: %s)\n' "$name" "$log"
	done
fi
echo "$npass passed, $nfail failed, $nskip skipped"
[ "$nfail" -eq 0 ]
