#!/bin/sh
# make valgrind: both daemons of a short soak under valgrind (see soak.py).
exec "${PYTHON:-/usr/bin/python3}" "$(dirname "$0")/soak.py" --valgrind --versions "${VERSIONS:-10}"
