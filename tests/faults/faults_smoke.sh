#!/bin/sh
# One trial of every fault scenario (the full matrix is `make test-faults`).
# link-cut needs network namespaces and disk-full a tmpfs mount: root.
# dte-test: exclusive (fault timings, a shaped link, a tmpfs: run alone)
if [ "$(id -u)" != 0 ]; then
	echo "SKIP: the fault matrix needs root (network namespaces, a tmpfs mount)"
	exit 77
fi
exec "${PYTHON:-/usr/bin/python3}" "$(dirname "$0")/faults.py" --trials 1
