# dted — top-level build.
#
# Non-recursive make: every layer describes itself in a fragment
# (proto/proto.mk, gpu/gpu.mk, daemon/daemon.mk, client/client.mk,
# tests/tests.mk) that appends to the lists below.  `make SANITIZE=1` (or
# `make asan`) builds everything with ASan+UBSan into build-asan/.

SANITIZE ?= 0
ifeq ($(SANITIZE),1)
B        := build-asan
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer \
            -fno-sanitize-recover=undefined
else
B        := build
# Hardening for the shipped build (lintian: bindnow, fortify).
SANFLAGS := -D_FORTIFY_SOURCE=2 -fstack-protector-strong
HARDEN_LDFLAGS := -Wl,-z,relro,-z,now
endif

# A fresh machine has none of the libraries: install them before pkg-config
# is asked about them.  The script is idempotent and quick when all is there.
ifeq ($(filter clean distclean,$(MAKECMDGOALS)),)
ifeq ($(wildcard $(B)/.deps-ok),)
DEPS_STATUS := $(shell ./scripts/install-deps.sh >&2 && mkdir -p $(B) && touch $(B)/.deps-ok && echo ok)
ifneq ($(DEPS_STATUS),ok)
$(error scripts/install-deps.sh failed)
endif
endif
endif

CC       ?= cc
NVCC     ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
PYTHON   := /usr/bin/python3
PKGS     := libuv ucx libprotobuf-c libzstd libsystemd inih jansson libxxhash libsodium
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lm
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)

WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
            -Wstrict-prototypes -Wmissing-prototypes
CFLAGS   := -std=gnu11 -O2 -g -fPIC -pthread -D_GNU_SOURCE $(WARN) $(SANFLAGS) \
            -I. -I$(B)/gen $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS  := -pthread $(SANFLAGS) $(HARDEN_LDFLAGS) $(EXTRA_LDFLAGS)

DTE_VERSION := 0.1.0
CFLAGS   += -DDTE_VERSION=\"$(DTE_VERSION)\"

# Lists the fragments append to.
BINS         :=   # programs under $(B)/bin
TEST_PROGS   :=   # programs only tests run, under $(B)/tests (built by all,
                  # so one system test can run alone after `make`)
LIBS         :=   # libraries under $(B)/lib
INTERNAL_LIBS :=  # static libraries every test links (order: users first)
UNIT_TESTS   :=   # CMocka binaries under $(B)/tests, built from tests/unit/<name>.c
SYSTEM_TESTS :=   # executable scripts run from the repo root by `make test`
GEN_HEADERS  :=   # generated headers every object depends on

.PHONY: all test unit-test system-test list-tests asan clean distclean demo bench bench-dense bench-scan bench-ab \
        test-gpu bench-gpu
all:

# Order matters only for variables: a fragment may use what an earlier one
# defined (client.mk puts PROTO_OBJS and LAYOUT_OBJS into libdte).
include proto/proto.mk
include gpu/gpu.mk
include daemon/layout/layout.mk
include daemon/peer/peer.mk
include daemon/storage/storage.mk
include daemon/daemon.mk
include client/client.mk
include tests/tests.mk
include tests/system/trainers.mk
include tests/bench/bench.mk
include client/python/python.mk
include packaging/packaging.mk

all: $(BINS) $(LIBS)

# Objects: $(B)/obj/<path>.o from <path>.c; headers tracked with -MMD.
$(B)/obj/%.o: %.c $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

-include $(shell find $(B)/obj $(B)/tests -name '*.d' 2>/dev/null)

# Unit tests: one CMocka binary per module, linked with every internal
# library; their headers tracked too (a test's own, e.g. tests/unit/*.h).
$(B)/tests/%: tests/unit/%.c $(INTERNAL_LIBS) $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -MF $@.d -MT $@ $< -o $@ $(LDFLAGS) -Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group \
		$(PKG_LIBS) $(CMOCKA_LIBS) -ldl

asan:
	$(MAKE) SANITIZE=1 test

clean:
	rm -rf build build-asan

distclean: clean
include tests/fuzz/fuzz.mk
include tests/faults/faults.mk

# The test targets come after every fragment: a rule's prerequisites are
# expanded when make reads the rule, so UNIT_BINS must not be computed
# before the last fragment has appended to UNIT_TESTS (test_testhook from
# tests/faults/faults.mk once went unbuilt and unrun that way).
# Secondary expansion makes the prerequisites below ($$(UNIT_BINS)) wait
# for the end of reading too, should a fragment ever be included after
# this point.  `make list-tests` prints what `make test` runs.
UNIT_BINS = $(addprefix $(B)/tests/,$(UNIT_TESTS))
.SECONDEXPANSION:

all: $$(TEST_PROGS)

unit-test: all $$(UNIT_BINS)
	@B=$(B) ./tests/run-all.sh $(UNIT_BINS) --

system-test: all
	@B=$(B) PYTHON=$(PYTHON) TEST_JOBS=$(TEST_JOBS) ./tests/run-all.sh -- $(SYSTEM_TESTS)

# System test scripts run side by side in this many lanes, longest first;
# those marked `# dte-test: exclusive` afterwards, alone (tests/run-system.sh).
TEST_JOBS ?= 2

# The fixture's seeded schedules (tests/unit/test_fixture.c): the issue's
# 2000 per run in the plain pass (~2 min here), 100 under the sanitizers.
FX_SCHEDULES ?= $(if $(filter 1,$(SANITIZE)),100,2000)
# The schedule explorer's (tests/unit/test_fixture_explore.c): ~80 ms of
# CPU each here, 200 per run in the plain pass, 20 under the sanitizers.
FX_EXPLORE ?= $(if $(filter 1,$(SANITIZE)),20,200)

test: all $$(UNIT_BINS)
	@B=$(B) PYTHON=$(PYTHON) TEST_JOBS=$(TEST_JOBS) FX_SCHEDULES=$(FX_SCHEDULES) FX_EXPLORE=$(FX_EXPLORE) ./tests/run-all.sh $(UNIT_BINS) -- $(SYSTEM_TESTS)

list-tests:
	@printf 'unit %s\n' $(UNIT_BINS)
	@printf 'system %s\n' $(SYSTEM_TESTS)
