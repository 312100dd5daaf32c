# daemon/ — dted.  Every module but main.c also goes into libdted.a so unit
# tests can drive conf, dispatch and the control server directly.  The
# test hooks (tests/faults/testhook*.c) are not among them: they are linked only
# into the test build, $(B)/tests/dted-faults (tests/faults/faults.mk).
DAEMON_SRCS := daemon/log.c daemon/conf.c daemon/registry.c daemon/notify.c \
               daemon/dispatch.c daemon/cmd_core.c daemon/ctl.c daemon/daemonize.c \
               daemon/cmd_job.c daemon/buf.c daemon/route.c daemon/job_state.c daemon/job.c \
               daemon/job_local.c \
               daemon/job_coord.c daemon/coord_sm.c daemon/pair_sm.c daemon/sink_sm.c daemon/reader_sm.c \
               daemon/job_src.c daemon/job_capture.c daemon/job_sink.c \
               daemon/job_cuda.c daemon/job_snapshot.c daemon/job_persist.c daemon/wire_job.c \
               daemon/bufpool.c daemon/recvpool.c
# The sink beside job_sink.c, one concern a file (daemon/job_sink_int.h):
# records in, apply on arrival, staging, apply and verify, a version at a sink.
DAEMON_SRCS += daemon/job_sink_intake.c daemon/job_sink_aoa.c daemon/job_sink_stage.c \
               daemon/job_sink_apply.c daemon/job_sink_version.c
# The sync engine's I/O over libuv and the router (daemon/engine_io.h).
DAEMON_SRCS += daemon/engine_io_uv.c
# Workers wake the loop without libuv's async spin (daemon/wake.h).
DAEMON_SRCS += daemon/wake.c
# Negative errno -> wire status, the daemon's one error convention (derr.h).
DAEMON_SRCS += daemon/derr.c
# The relay forest of a sink rank's replicas, its model and simulation
# (issue 34; daemon/relay_plan.h).
DAEMON_SRCS += daemon/relay_plan.c
UNIT_TESTS   += test_relay_plan
# The reply a control handler builds, below dispatch.c (no call loop).
DAEMON_SRCS += daemon/dreply.c
# K > 1: the published values of elements first marked since a publish
# (daemon/side_table.h).
DAEMON_SRCS += daemon/side_table.c
# Daemon-to-daemon routing over UCX and `dtectl peers` (route_ucx.h).
DAEMON_SRCS += daemon/route_ucx.c daemon/route_ucx_engine.c daemon/cmd_peer.c
# A job's storage transport over daemon/storage (docs/STORAGE.md).
DAEMON_SRCS += daemon/job_storage.c
# Peers that prove the job key (peer protocol 5, job_auth.h).
DAEMON_SRCS += daemon/job_auth.c
# Heavy steps (apply, verify) on worker threads (docs/SYNC.md, Threads).
DAEMON_SRCS += daemon/job_task.c
# Operations: metrics (and their HTTP listener), verify/resync, config,
# log-level.
DAEMON_SRCS += daemon/metrics.c daemon/http_metrics.c daemon/cmd_ops.c daemon/job_ops.c \
               daemon/job_metrics.c
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(B)/obj/%.o)

include daemon/route_ucx.mk

# Made afresh: `ar r` into an old archive would keep members whose source
# left DAEMON_SRCS (testhook.o did).
$(B)/lib/libdted.a: $(DAEMON_OBJS)
	@mkdir -p $(dir $@)
	@rm -f $@
	$(AR) rcs $@ $^

# The peer layer's library joins the link once daemon/peer/peer.mk builds it.
DTED_LIBS := $(B)/lib/libdted.a $(B)/lib/libdtestorage.a $(B)/lib/libdtelayout.a \
             $(filter $(B)/lib/libdtepeer.a,$(LIBS)) \
             $(B)/lib/libdtecompute.a $(B)/lib/libdteproto.a

# Never -lcuda: the CUDA backend is a dlopen()ed plugin (gpu/backend.h).
$(B)/bin/dted: $(B)/obj/daemon/main.o $(DTED_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $< -o $@ $(LDFLAGS) -Wl,--start-group $(DTED_LIBS) -Wl,--end-group $(PKG_LIBS) -ldl

BINS          += $(B)/bin/dted
LIBS          += $(B)/lib/libdted.a
INTERNAL_LIBS += $(B)/lib/libdted.a

# The sync engine's tests: buffers and the engine in-process, and one real
# dted with a torch trainer and SGLang-layout sinks.
UNIT_TESTS   += test_buf test_job test_pair_sm test_sink_sm test_coord_sm test_reader_sm test_job_persist
# N engines in one process on deterministic I/O (tests/unit/fixture.h):
# two source files, so a rule of its own.
# test_fixture: one scenario per seed; test_fixture_explore: seeded
# schedules of publish, apply, join, leave, restart and partition.  Both
# share the fixture and its sync helpers (fixture_sync.c).
FIXTURE_SRCS := tests/unit/fixture.c tests/unit/fixture_sync.c
FIXTURE_DEPS := $(FIXTURE_SRCS) tests/unit/fixture.h tests/unit/fixture_sync.h tests/unit/fixture_side.h \
                tests/unit/tiny_llama_ref.h tests/unit/adamw_ref.h $(INTERNAL_LIBS) $(GEN_HEADERS)
UNIT_TESTS   += test_fixture test_fixture_explore
# The coordinator's re-plan: cached plans give what a plan from scratch gives.
UNIT_TESTS   += test_replan
$(B)/tests/test_fixture: tests/unit/test_fixture.c $(FIXTURE_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(FIXTURE_SRCS) -o $@ $(LDFLAGS) \
		-Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group $(PKG_LIBS) $(CMOCKA_LIBS) -ldl
# Its nodes restart one at a time: dbuf_fini (the process's buffer
# registry, which the last dte_engine_free ends) is wrapped, so the test
# itself ends the registry once a schedule's last engine is gone.
$(B)/tests/test_fixture_explore: tests/unit/test_fixture_explore.c $(FIXTURE_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(FIXTURE_SRCS) -o $@ $(LDFLAGS) -Wl,--wrap=dbuf_fini \
		-Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group $(PKG_LIBS) $(CMOCKA_LIBS) -ldl
# The engine's own tests run on the fixture's I/O too (one node).
$(B)/tests/test_job: tests/unit/test_job.c tests/unit/io_filter.h tests/unit/fixture_side.h \
                     $(FIXTURE_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -MF $@.d -MT $@ tests/unit/test_job.c $(FIXTURE_SRCS) -o $@ \
		$(LDFLAGS) -Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group $(PKG_LIBS) \
		$(CMOCKA_LIBS) -ldl
# Two engines in one process share the buffer registry (the last one ends it).
UNIT_TESTS   += test_engines
$(B)/tests/test_engines: tests/unit/test_engines.c tests/unit/fixture.c tests/unit/fixture.h \
                         $(INTERNAL_LIBS) $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) tests/unit/test_engines.c tests/unit/fixture.c -o $@ $(LDFLAGS) \
		-Wl,--start-group $(INTERNAL_LIBS) -Wl,--end-group $(PKG_LIBS) $(CMOCKA_LIBS) -ldl
# The errno -> status table, and a grep that the engine names no wire status.
UNIT_TESTS   += test_derr
# K > 1: the side table of first-marked elements (daemon/side_table.h).
UNIT_TESTS   += test_side_table
SYSTEM_TESTS += tests/system/errconv_grep.sh
# The engine's files call only downward (docs/SYNC.md, Layers), from nm.
SYSTEM_TESTS += tests/system/engine_layers.sh
# The engine keeps no mutable state outside its instance (struct dte_engine).
SYSTEM_TESTS += tests/system/engine_api.sh
# No two files of the daemon call each other, around any loop (nm).
SYSTEM_TESTS += tests/system/call_loops.py
# route.c alone: local queue, remote dispatch, a decorator both ways.
UNIT_TESTS   += test_route
SYSTEM_TESTS += tests/system/sync_local.py tests/system/sync_capture.py tests/system/sync_verify.py
SYSTEM_TESTS += tests/system/apply_on_arrival.py
# A write skipped inside the apply: caught by the read-back, undone (DTE_TEST_HOOK=skip-write).
SYSTEM_TESTS += tests/system/skip_write.py
# the cheaper of sparse and dense per pair and version (daemon/pair_sm.c)
SYSTEM_TESTS += tests/system/sync_mode.py
# The loop answers clients while a dense 2^28-element version is applied and
# while dtectl verify sums it; SIGTERM mid-apply drains the worker.
SYSTEM_TESTS += tests/system/loop_latency.py
# Publish interval K = 4 on the adamw_fixtures steps: exact, and the union's
# false positives gone (daemon/side_table.h), capped, a wrong drop caught.
SYSTEM_TESTS += tests/system/sync_k4.py
# Publish that does not stop the trainer (protocol 2): async publish, the
# step waits for a capture the test build holds, exact sink, errors raised.
SYSTEM_TESTS += tests/system/sync_async_publish.py
# The same with detect = snapshot (daemon/job_snapshot.c).
SYSTEM_TESTS += tests/system/sync_local_snapshot.sh

# Operations: the metrics registry and exposition; every dtectl command
# against a real dted with real versions.
UNIT_TESTS   += test_metrics
SYSTEM_TESTS += tests/system/ops.py

# Two groups of daemons that share only a directory: a trainer's group
# writes, SGLang sinks' groups read (tests/system/storage_sync.py).
SYSTEM_TESTS += tests/system/storage_sync.py
UNIT_TESTS   += test_job_storage

# A fresh sink's receive arena (daemon/recvpool.h).
UNIT_TESTS += test_recvpool
# Workers wake the loop (daemon/wake.h).
UNIT_TESTS += test_wake
