#!/bin/sh
# sync_local.py with the job option detect = snapshot: every phase (K=1,
# marks, gaps, a killed and a late sink, a corrupted sink repaired) exact
# on every sink when the sources diff against their last captured values.
DTE_DETECT=snapshot exec "$(dirname "$0")/sync_local.py" "$@"
