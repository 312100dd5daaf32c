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
# One header per layer: the headers of the engine's files, each with the
# files whose functions it declares.  An engine file may include a header
# of its own or one of the rows below it, never one above it or beside it,
# so the compiler (-Werror=implicit-function-declaration) refuses a call
# up or sideways before nm sees it.  job_state.h (the objects and the
# bottom row) and job_api.h (the plain request and result types) are
# everyone's.
HEADERS='job.h job
job_storage.h job_storage
job_coord.h job_coord
job_local.h job_local
job_src.h job_src
job_src_engine.h job_src
job_sink.h job_sink
job_sink_engine.h job_sink job_sink_intake job_sink_apply job_sink_version
job_sink_int.h job_sink job_sink_intake job_sink_aoa job_sink_stage job_sink_apply job_sink_version
job_ops.h job_ops
job_capture.h job_capture
job_task.h job_task
job_metrics.h job_metrics'
printf '%s\n' "$HEADERS" >"$tmp/headers"
: >"$tmp/includes"
while read -r f _; do
	sed -n 's|^#include "daemon/\(job[a-z_]*\.h\)".*|\1|p' "daemon/$f.c" |
		awk -v f="$f" '{ print f, $1 }' >>"$tmp/includes"
done <"$tmp/ranks"
awk '
	FILENAME == ARGV[1] { rank[$1] = $2; next }
	FILENAME == ARGV[2] { for (i = 2; i <= NF; i++) { own[$1, $i] = 1; owners[$1] = owners[$1] " " $i } ; known[$1] = 1; next }
	{
		f = $1; h = $2
		if (!(h in known))
			next
		n++
		if ((h, f) in own)
			next
		split(owners[h], o, " ")
		for (k in o)
			if (rank[o[k]] <= rank[f]) {
				bad++
				printf "%s includes %s (%s: %s)\n", f, h, o[k],
				       rank[o[k]] < rank[f] ? "a layer above" : "a layer beside"
				break
			}
	}
	END {
		printf "engine-layers: includes=%d layer_headers=%d up=%d\n", n, length(known), bad + 0
		if (n < 20) {
			print "engine-layers: FAIL: too few includes of layer headers read; is the list right?"
			exit 1
		}
		if (bad) {
			print "FAIL: an engine file includes the header of a layer above or beside it (docs/SYNC.md, Layers)"
			exit 1
		}
	}' "$tmp/ranks" "$tmp/headers" "$tmp/includes" || exit 1
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
