# tests/faults/ — reliability proof (issue 9): the fault matrix, the soak and
# valgrind.  `make test-faults` runs every scenario 10 times (minutes, not in
# `make test`); a one-trial smoke of the same matrix is a system test.
.PHONY: test-faults soak valgrind

UNIT_TESTS   += test_testhook
SYSTEM_TESTS += tests/faults/faults_smoke.sh tests/system/isolation.py

test-faults: all
	B=$(B) $(PYTHON) tests/faults/faults.py --trials 10

soak: all
	B=$(B) $(PYTHON) tests/faults/soak.py --versions 1000

valgrind: all
	B=$(B) ./tests/faults/valgrind.sh
