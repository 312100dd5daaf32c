#!/bin/sh
# The sync engine's layers (docs/SYNC.md, "Layers"): every engine file
# calls only the files of the rows below its own, never one above it nor
# one on its own row.  Read from the built objects' symbol tables (nm):
# for every engine object, each engine symbol it uses must be defined by
# an object of a lower row.  A call up or sideways fails here, with the
# files and the names.
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${B:-build}
O=$B/obj/daemon
# From the top; the files of one row must not call each other.
ROWS='job job_metrics
job_storage
job_local
job_coord
job_src job_sink job_sink_intake
job_sink_aoa
job_sink_stage job_sink_apply
job_sink_version
job_ops
job_capture job_task
job_state
route
coord_sm pair_sm sink_sm reader_sm'
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' "$ROWS" >"$tmp/rows"
: >"$tmp/ranks"; : >"$tmp/defs"; : >"$tmp/uses"
rank=0
while read -r row; do
	rank=$((rank + 1))
	for f in $row; do
		# Never pass on a file not read: the check needs every object.
		if [ ! -f "$O/$f.o" ]; then
			echo "engine-layers: FAIL: $O/$f.o not built (make first)"
			exit 1
		fi
		echo "$f $rank" >>"$tmp/ranks"
		nm -g --defined-only "$O/$f.o" | awk -v f="$f" 'NF == 3 { print $3, f }' >>"$tmp/defs"
		nm -u "$O/$f.o" | awk -v f="$f" '{ print f, $NF }' >>"$tmp/uses"
	done
done <"$tmp/rows"
# The top row is rank 1: a use must go to a larger rank.
awk '
	FILENAME == ARGV[1] { rank[$1] = $2; files++; next }
	FILENAME == ARGV[2] { owner[$1] = $2; next }
	{
		g = owner[$2]
		if (g == "" || g == $1)
			next
		calls++
		if (rank[g] <= rank[$1]) {
			bad++
			printf "%s -> %s: %s (%s)\n", $1, g, $2,
			       rank[g] < rank[$1] ? "a call up" : "a call sideways"
		}
	}
	END {
		printf "engine-layers: files=%d calls=%d up=%d\n", files, calls, bad + 0
		if (calls < 50) {
			print "engine-layers: FAIL: too few calls between engine files read; is the list right?"
			exit 1
		}
		if (bad) {
			print "FAIL: an engine file calls a file above it or beside it; call down, or raise an event (docs/SYNC.md, Layers)"
			exit 1
		}
	}' "$tmp/ranks" "$tmp/defs" "$tmp/uses"
