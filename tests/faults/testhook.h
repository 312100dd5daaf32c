/* tests/faults/testhook.h — fault injection for tests/faults (DTE_TEST_HOOK).
 *
 * Linked only into the test build of the daemon, $(B)/tests/dted-faults
 * (tests/faults/faults.mk), where testhook_decor.c installs these
 * functions as decorators of the record transport (route.h's struct
 * route_decorator), the capture and the sink's staged values (job_ext.h)
 * before main() runs.  The production dted contains none of it and never
 * reads DTE_TEST_HOOK (tests/faults/prod_hooks.py checks both).  In the
 * test build it is inert unless the environment variable DTE_TEST_HOOK is
 * set when the daemon starts.  It names one fault and the versions it
 * hits:
 *
 *   DTE_TEST_HOOK=<fault>@<version>[/<period>]
 *
 * the fault fires at <version> and, with a period, again at every
 * <version> + k·<period> (so one daemon serves several trials).  Faults:
 *
 *   die-in-counts     sender: the second remote COUNTS of the version is
 *                     dropped with everything after it and the daemon
 *                     SIGKILLs itself 300 ms later (what was handed to UCX
 *                     before gets out): sinks hold some COUNTS, not all.
 *   die-in-payload    the same at the second remote PAYLOAD: a sink holds
 *                     COUNTS announcing a payload that never comes.
 *   die-in-relay      relay (a sink daemon forwarding to its relay
 *                     children): once the first remote COUNTS or PAYLOAD
 *                     of the version came in, its second RELAYED is
 *                     dropped with every send after it and the daemon
 *                     SIGKILLs itself 300 ms later: the children hold one
 *                     record of the version, not all.
 *   corrupt-payload   receiver: one byte in the middle of the first
 *                     non-empty PAYLOAD of the version is flipped.
 *   dup               receiver: every COUNTS/PAYLOAD/STAGED/APPLIED of the
 *                     version is delivered twice.
 *   reorder           receiver: every record of the version is held back
 *                     until the next record arrives, which overtakes it
 *                     (adjacent pairs swap; a held record with no
 *                     follower goes after 50 ms).
 *   wrong-value       sink: once the version's first sparse source part
 *                     has passed every staging check, one of its values is
 *                     flipped: a well-formed payload with a wrong value,
 *                     which only the apply's checksum can catch.
 *   drop-join         sender: the <version>-th JOIN sent to another daemon
 *                     (counted from 1; with a period, every period-th after
 *                     it) is dropped, as a dying link would lose it.
 *   drop-plan         coordinator: the first PLAN sent to another daemon of
 *                     its <version>-th plan (the term's counter, see
 *                     proto/peer_protocol.h; with a period, also of every
 *                     period-th plan after it) is dropped.
 *   capture-stall     the capture worker of the version waits (at most
 *                     60 s) until the file named by DTE_TEST_HOOK_RELEASE
 *                     exists: the loop must keep serving meanwhile.
 *   storage-read-stall a storage reader job's first read of the version (its
 *                     position plus one; on the read's worker thread) writes
 *                     <DTE_TEST_HOOK_RELEASE>.held.<version>, then waits (at
 *                     most 60 s) until DTE_TEST_HOOK_RELEASE exists, and
 *                     removes it (with a period, the next version's read is
 *                     held again): the loop must keep serving meanwhile, and
 *                     a SIGTERM must wait for the read.
 *   wrong-drop        source, publish interval K > 1: the publish of the
 *                     version withholds one marked element that did change
 *                     (the side table's drop rule broken once,
 *                     daemon/side_table.h); only the sink's checksum can
 *                     catch it.  Like capture-stall it does not log: the
 *                     publish counts one element fewer than changed.
 *   skip-write        sink: the apply (or apply on arrival) of the
 *                     version puts the old value back into the first
 *                     element its first sparse entry wrote, after the
 *                     write: a write silently skipped, which only the
 *                     sink's own read-back verification can catch; the
 *                     apply is then undone (the sink stays on the version
 *                     before, bit for bit) and the next version is dense.
 *
 * A hook that fires logs "test hook: ..." at warning level, so a test can
 * tell it did (capture-stall, on a worker thread, does not log).  Module
 * state is per process, like route.c.  die-in-* and the receiver faults
 * act on remote records only (the remote transport's decorator), never on
 * the local queue.
 */
#ifndef DTED_TESTHOOK_H
#define DTED_TESTHOOK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include "proto/peer.pb-c.h"

/* Reads DTE_TEST_HOOK.  Returns 0 (no hook, or one armed: logged as
 * "test hook armed: <spec>") or -1 when the spec is malformed or names an
 * unknown fault (logged; the daemon then refuses to start, so a misspelt
 * hook cannot make a fault test run without its fault) or on a loop error. */
int  testhook_init(uv_loop_t *loop);
/* Delivers a held record (if any) and closes the timer. */
void testhook_fini(void);

/* Before a remote send (the decorated transport's send).  Returns 1 when the record must be dropped (the
 * daemon is about to die), 0 to send it. */
int testhook_send(Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen);

/* Instead of delivering a received record directly: returns 1 when the
 * hook took the record over (delivered it altered, twice, or held it),
 * 0 when the caller delivers it as usual. */
int testhook_deliver(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		     size_t hdrlen, const void *data, size_t len);

/* The sink is staging a sparse source part of `version`: 1 when it must
 * flip one value of it (wrong-value; once per version; on the loop:
 * testhook_decor.c's alter, on the staging thread, flips it). */
int testhook_sink_value(uint64_t version);

/* At the start of a capture, on the worker thread (capture-stall). */
void testhook_capture(uint64_t version);
/* Before a storage reader job reads `version`, on its worker thread
 * (storage-read-stall). */
void testhook_storage_read(uint64_t version);

/* At the start of a publish's capture, on the worker thread: 1 to break
 * the side tables' drop rule once (wrong-drop; it does not log). */
int testhook_capture_wrong_drop(uint64_t version);
/* skip-write: 1 (and logs) when a sink's apply of this version (or its
 * apply on arrival) is to leave one written element on its old value. */
int testhook_apply_select(uint64_t version);

#endif
