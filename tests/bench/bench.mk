# tests/bench/ — `make bench`: every figure of DESIGN §8 in one run
# (docs/BENCHMARKS.md, docs/bench-*.png, one `bench ...` line per figure).
# Needs root for the network namespaces of the end-to-end figure; about
# 15 minutes and 8 GiB on a 2-core machine (BENCH_SMALL=1: a smaller model).

# The sink's sparse apply with its read-back verify against the write
# and delta alone (docs/BENCHMARKS.md, "apply-verify").
$(B)/tests/bench_apply: tests/bench/bench_apply.c $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) $< -o $@ $(LDFLAGS) $(B)/lib/libdtecompute.a $(COMPUTE_LIBS)

bench-apply: $(B)/tests/bench_apply
	$(B)/tests/bench_apply

# What peer auth costs per PAYLOAD part (docs/SYNC.md, "Peers that prove
# the job key"; end to end: tests/bench/peer_auth_e2e.py, and
# BENCH_E2E_AUTH=on|off with tests/bench/dense_probe.py).
$(B)/tests/bench_peer_auth: tests/bench/bench_peer_auth.c tests/bench/fanout_check.h $(B)/lib/libdteproto.a \
		$(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LDFLAGS) $(B)/lib/libdteproto.a $(PKG_LIBS)

bench-peer-auth: $(B)/tests/bench_peer_auth
	$(B)/tests/bench_peer_auth

$(B)/tests/bench_codec: tests/bench/bench_codec.c $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) $< -o $@ $(LDFLAGS) $(B)/lib/libdtecompute.a $(COMPUTE_LIBS)

# The binaries `make bench` runs (bench-ab builds the same in both trees).
BENCH_BINS := bench_scan bench_detect_once bench_codec bench_snapshot bench_apply bench_fanout_sim \
	      bench_fanout_fixture

bench: all $(addprefix $(B)/tests/,$(BENCH_BINS))
	B=$(B) PYTHON=$(PYTHON) $(PYTHON) tests/bench/run.py

# The dense path alone, timed per stage, in about a minute (root, ip netns):
# a 102,766,848-element model, two daemons, a fresh sink per version.  For
# profiling, not for figures (those come from `make bench`).
BENCH_DENSE_LINKS ?= 0 1 10
bench-dense: all
	B=$(B) $(PYTHON) tests/bench/dense_probe.py $(BENCH_DENSE_LINKS)

# Publish interval K = 4 on the adamw_fixtures configurations, side tables
# off and on (`bench k4 ...`; also part of `make bench`).  About a minute.
bench-k4: all
	B=$(B) $(PYTHON) tests/bench/bench_k4.py

# The engine against an older commit, same run (issue 31): each figure
# interleaved ABBA between this tree and a worktree of AB_BASE, each
# running its own scripts and binaries (tests/bench/ab_engine.sh, ab.py;
# root, about 25 minutes).  docs/BENCHMARKS.md, "The engine as an
# instance: same-run A/B".
bench-ab: all
	PYTHON=$(PYTHON) BENCH_BINS="$(BENCH_BINS)" tests/bench/ab_engine.sh

# `dtectl plan` at real size (Qwen3-235B-A22B, fsdp:dp=64 and
# megatron:tp=8,dp=32,ep=32): CPU seconds and max RSS, `bench plan ...`
# (docs/BENCHMARKS.md, "Plan at real size"; also part of `make bench`).
# BENCH_PLAN_BASE=PATH/dte-plan times an older build in the same rounds.
bench-plan: $(B)/bin/dte-plan
	B=$(B) $(PYTHON) tests/bench/bench_plan.py

# Snapshot-diff detection (detect = snapshot), the benchmarks' baseline.
UNIT_TESTS += test_job_snapshot
# Needs only the compute library, so it links only that.
$(B)/tests/test_job_snapshot: tests/unit/test_job_snapshot.c $(B)/obj/daemon/job_snapshot.o \
		$(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LDFLAGS) $(B)/obj/daemon/job_snapshot.o \
		$(B)/lib/libdtecompute.a $(COMPUTE_LIBS) $(CMOCKA_LIBS)

$(B)/tests/bench_snapshot: tests/bench/bench_snapshot.c $(B)/obj/daemon/job_snapshot.o \
		$(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DTC_FPFLAGS) -O3 $< -o $@ $(LDFLAGS) $(B)/obj/daemon/job_snapshot.o \
		$(B)/lib/libdtecompute.a $(COMPUTE_LIBS)

# The snapshot baseline's portable kernel is a fixed-length loop meant for
# the vectorizer, like gpu/cpu.c's.
$(B)/obj/daemon/job_snapshot.o: CFLAGS += -O3

# The dense path's buffer pool (daemon/bufpool.c).
UNIT_TESTS += test_bufpool

# The coordinator's re-plan at 1000 nodes (issue 34; docs/BENCHMARKS.md,
# "Re-plan at 1000 nodes"): one coordinator engine on a stub transport,
# 128 source ranks and 112 sink replicas of tp=8 joining one per node.
# BENCH_REPLAN_ARGS: e.g. --model tests/data/layout/models/qwen3-235b-a22b.json
$(B)/tests/bench_replan: tests/bench/bench_replan.c tests/bench/peak_rss.h $(INTERNAL_LIBS) $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LDFLAGS) -Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group \
		$(PKG_LIBS) -ldl

bench-replan: $(B)/tests/bench_replan
	$(B)/tests/bench_replan $(BENCH_REPLAN_ARGS)

# Relay fan-out at 1000 nodes, modelled (issue 34; daemon/relay_plan.h):
# the planner's forest simulated part by part, the per-hop check measured
# in the same run (`bench fanout-model ...`, `bench fanout-sim ...`).
$(B)/tests/bench_fanout_sim: tests/bench/bench_fanout_sim.c tests/bench/fanout_check.h $(INTERNAL_LIBS) \
		$(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@ $(LDFLAGS) -Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group \
		$(PKG_LIBS) -ldl

bench-fanout-sim: $(B)/tests/bench_fanout_sim
	$(B)/tests/bench_fanout_sim

# Relay fan-out measured (issue 34; docs/BENCHMARKS.md, "Relay fan-out,
# measured"): 1..16 sink daemons in network namespaces, every NIC shaped
# to 10 Gbit/s, direct against relay in the same run (root; about 10
# minutes).  BENCH_FANOUT_SINKS, BENCH_FANOUT_GBIT, BENCH_FANOUT_FANOUT.
bench-fanout: all
	B=$(B) $(PYTHON) tests/bench/bench_fanout.py

# The relay shape from measured links against the fixed one (issue 34;
# docs/BENCHMARKS.md, "Relay shape, measured"): 8 sink daemons, one
# replica's uplink congested to 200 Mbit/s (root; under a minute).
# BENCH_SHAPE_SINKS, BENCH_SHAPE_SLOW_MBIT, BENCH_FANOUT_GBIT.
bench-fanout-shape: all
	B=$(B) $(PYTHON) tests/bench/bench_fanout_shape.py

# Relay fan-out with the real engine code (issue 34): 1 + N engines in one
# process on the fixture's timed links (tests/unit/fixture.h), direct
# against the planner's relay trees, N = 1..16 at 10 Gbit/s and 896
# replicas at 400 Gbit/s (`bench fanout-fixture ...`, `bench fanout-sim
# engine=fixture ...`).  BENCH_FANOUT_FIXTURE_ARGS: its options.
$(B)/tests/bench_fanout_fixture: tests/bench/bench_fanout_fixture.c tests/bench/fanout_check.h tests/bench/peak_rss.h \
		$(FIXTURE_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(FIXTURE_SRCS) -o $@ $(LDFLAGS) \
		-Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group $(PKG_LIBS) $(CMOCKA_LIBS) -ldl

bench-fanout-fixture: $(B)/tests/bench_fanout_fixture
	$(B)/tests/bench_fanout_fixture $(BENCH_FANOUT_FIXTURE_ARGS)

# make test runs it small (N = 1, 4, 8), checking the engine against the
# planner's model: tests/system/fanout_fixture.py.
TEST_PROGS += $(B)/tests/bench_fanout_fixture
SYSTEM_TESTS += tests/system/fanout_fixture.py
