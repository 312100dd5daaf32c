#!/bin/sh
# One trial of every fault scenario (the full matrix is `make test-faults`).
exec "${PYTHON:-/usr/bin/python3}" "$(dirname "$0")/faults.py" --trials 1
