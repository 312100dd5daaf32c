/* daemon/job_ext.h — the sync engine's extension points.
 *
 * Each engine has its own set (struct dte_engine, ext), copied at
 * dte_engine_new from job_ext_builtin when a build links one.  Every
 * member is NULL in the production dted, which then calls nothing (and
 * has nothing to call: it links no job_ext_builtin, nor code that sets
 * them).  A test build links a constant job_ext_builtin
 * (tests/faults: tests/faults/testhook.c and tests/faults/testhook_decor.c, fault
 * injection, docs/HACKING.md); an engine's set is not changed while its
 * work runs, so worker threads read it without a lock.  A unit test may
 * set its own engine's members.  The record transport has its own
 * (struct route_decorator, route.h).
 */
#ifndef DTED_JOB_EXT_H
#define DTED_JOB_EXT_H

#include <stddef.h>
#include <stdint.h>

struct job_ext {
	/* At the start of capturing `version`, on the capture worker thread,
	 * before anything is read from the source's buffers.  May block (the
	 * loop keeps serving); must not log (the log belongs to the loop). */
	void (*capture_start)(uint64_t version);
	/* A sink starts staging `version`, on the loop thread (may log):
	 * called at the first part of each sparse source's payload; 1 to
	 * have sink_alter called once, on the first entry of that source
	 * that passes every check. */
	int (*sink_select)(uint64_t version);
	/* On the staging thread (must not log), after every check of the
	 * entry: `bytes` is its last value as it will be applied (len 2: one
	 * BF16 in host order) or, when the entry is kept encoded, the last
	 * byte of its encoding (len 1).  May alter them; the apply's
	 * checksum is what must then catch it. */
	void (*sink_alter)(void *bytes, size_t len);
	/* A storage reader job is about to read `version` (its position
	 * plus one) from the shared directory, on the read's worker thread
	 * (job_storage.c).  May block (the loop keeps serving); must not
	 * log. */
	void (*storage_read)(uint64_t version);
	/* At the start of capturing a publish of `version`, on the capture
	 * worker (must not log): 1 to break the side tables' drop rule once
	 * (daemon/side_table.h): one marked element that did change is not
	 * sent either.  The sink's checksum must then catch it. */
	int (*capture_wrong_drop)(uint64_t version);
	/* A sink's apply of `version` is handed to a worker, on the loop
	 * (may log): 1 to have apply_skip called once, on the apply worker,
	 * for that version's first sparse entry written. */
	int (*apply_select)(uint64_t version);
	/* On the apply worker (must not log), right after the entry's writes:
	 * `elem` is the first element it wrote, `old` what it held before.
	 * May put `old` back (a write silently skipped); the apply's own
	 * verification, which reads the memory, must then catch it. */
	void (*apply_skip)(uint16_t *elem, uint16_t old);
};

/* The hooks a test build links (testhook_decor.c); absent (a weak
 * reference, NULL) in the production dted.  Constant: nothing global
 * changes at run time. */
extern const struct job_ext job_ext_builtin __attribute__((weak));

#endif
