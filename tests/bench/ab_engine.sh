#!/bin/sh
# Same-run A/B of the engine against an older commit (issue 31: "the fault
# matrix, cluster tests and benchmarks show no regression"):
#
#     sudo make bench-ab AB_BASE=COMMIT        (root: network namespaces)
#
# checks COMMIT out into a worktree beside this tree's build (AB_DIR,
# default /tmp/dte-ab-COMMIT), builds it, then runs each figure with
# tests/bench/ab.py, interleaved ABBA, this tree against that one: the
# end-to-end bench (BENCH_SMALL, 1 and 10 Gbit/s), bench k4, the loop
# latencies, the cluster tests, the storage sync and one trial of every
# fault scenario.  About 25 minutes on a 2-core machine; run it on a quiet
# one.  Prints ab.py's lines (docs/BENCHMARKS.md, "The engine as an
# instance: same-run A/B").
set -eu
base=${AB_BASE:?AB_BASE=COMMIT: the commit to compare with}
here=$(cd "$(dirname "$0")/../.." && pwd)
dir=${AB_DIR:-/tmp/dte-ab-$base}
py=${PYTHON:-/usr/bin/python3}
if [ ! -d "$dir" ]; then
	git -C "$here" worktree add --detach "$dir" "$base" >/dev/null
fi
benches=${BENCH_BINS:?BENCH_BINS: the bench binaries (tests/bench/bench.mk; make bench-ab sets it)}
for t in "$here" "$dir"; do
	(cd "$t" && make -s -j2 all >/dev/null &&
	 make -s $(for b in $benches; do printf 'build/tests/%s ' "$b"; done) >/dev/null)
done
ab() { "$py" "$here/tests/bench/ab.py" "$@"; }
echo "ab: base=$(git -C "$dir" rev-parse --short HEAD) new=$(git -C "$here" rev-parse --short HEAD)"
BENCH_SMALL=1 BENCH_LINKS=1,10 ab --rounds 3 --key link "$dir" "$here" -- "$py" tests/bench/bench_e2e.py
BENCH_K4_SMALL=1 ab --rounds 2 "$dir" "$here" -- "$py" tests/bench/bench_k4.py
ab --rounds 3 --prefix loop-latency: --prefix stage-latency: --prefix verify-latency: \
	"$dir" "$here" -- "$py" tests/system/loop_latency.py
for t in cluster_sync cluster_sync_netns sync_k4 storage_sync; do
	ab --rounds 2 --prefix "$(echo $t | tr _ -):" "$dir" "$here" -- "$py" tests/system/$t.py
done
ab --rounds 1 --prefix faults: "$dir" "$here" -- sh tests/faults/faults_smoke.sh
