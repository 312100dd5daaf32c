# tests/faults/ — reliability proof (issue 9): the fault matrix, the soak and
# valgrind.  `make test-faults` runs every scenario 10 times (minutes, not in
# `make test`); a one-trial smoke of the same matrix is a system test.
.PHONY: test-faults soak valgrind

# The test build of the daemon: the production main.o and libraries plus
# the test hooks (DTE_TEST_HOOK, tests/faults/testhook.h), which testhook_decor.c
# installs as decorators of the production objects' extension points
# before main() runs.  Nothing else links them: $(B)/bin/dted (and the
# packaged one) has no test-hook code and never reads DTE_TEST_HOOK, which
# tests/faults/prod_hooks.py checks.  Every test that sets DTE_TEST_HOOK
# runs this binary (harness.DTED_FAULTS).
# The storage writer's hook (DTE_STORAGE_HOOK, testhook_storage.c) is
# test-only the same way: it is in dted-faults and in dte-storage-faults,
# the test build of $(B)/bin/dte-storage.
TESTHOOK_SRCS := tests/faults/testhook.c tests/faults/testhook_decor.c tests/faults/testhook_storage.c
TESTHOOK_OBJS := $(TESTHOOK_SRCS:%.c=$(B)/obj/%.o)

$(B)/tests/dted-faults: $(B)/obj/daemon/main.o $(TESTHOOK_OBJS) $(DTED_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(B)/obj/daemon/main.o $(TESTHOOK_OBJS) -o $@ $(LDFLAGS) \
		-Wl,--start-group $(DTED_LIBS) -Wl,--end-group $(PKG_LIBS) -ldl

TEST_PROGS += $(B)/tests/dted-faults

$(B)/tests/dte-storage-faults: $(B)/obj/daemon/storage/storage_main.o \
		$(B)/obj/tests/faults/testhook_storage.o $(B)/lib/libdtestorage.a \
		$(B)/lib/libdtelayout.a $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDFLAGS) $(PKG_LIBS) -ldl

TEST_PROGS += $(B)/tests/dte-storage-faults

# The parser and the send-side cut point, on testhook.o alone (no
# decorators installed).
$(B)/tests/test_testhook: tests/unit/test_testhook.c $(B)/obj/tests/faults/testhook.o \
		$(INTERNAL_LIBS) $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(B)/obj/tests/faults/testhook.o -o $@ $(LDFLAGS) \
		-Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group $(PKG_LIBS) $(CMOCKA_LIBS) -ldl

UNIT_TESTS   += test_testhook
SYSTEM_TESTS += tests/faults/faults_smoke.sh tests/system/isolation.py
# The production dted carries no test-hook symbols or strings, ignores
# DTE_TEST_HOOK; the test build carries them (so the check can fail).
SYSTEM_TESTS += tests/faults/prod_hooks.py

test-faults: all
	B=$(B) $(PYTHON) tests/faults/faults.py --trials 10

soak: all
	B=$(B) $(PYTHON) tests/faults/soak.py --versions 1000

valgrind: all
	B=$(B) ./tests/faults/valgrind.sh
