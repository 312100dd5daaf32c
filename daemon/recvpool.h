/* daemon/recvpool.h — memory faulted in ahead for a sink's dense version.
 *
 * A dense version lands as the sink's whole model in fresh payload
 * buffers (on arrival their new values are swapped into the weights and
 * they keep the old ones until the version is verified: its undo).
 * Writing a fresh page costs a fault, a zeroed page and a memcg charge:
 * in the bench's dense version at 10 Gbit/s (2^28 elements, 0.53 GiB) the
 * page faults inside the socket receive were half the sink daemon's CPU,
 * on a core the receive saturated.  A fresh sink knows its first version
 * will be dense, so it asks for an arena the size of its model when it
 * attaches; a thread of the pool's own populates it (a write fault per
 * page that stores nothing: an atomic add of zero) while the sink waits
 * for that version, and the version's payloads are carved from it (the
 * route's receive, the sink's own copies).  The arena is retired when
 * that version is applied or the sink goes, and unmapped (again on a
 * thread of its own) once its last piece is back, so a sink holds it only
 * around the version that needs it.  The sink asks for a new one when its
 * next version is likely dense too (job_sink_version.c, jsink_arena_next).
 *
 * Any memory may be given to recvpool_free(): what an arena did not hand
 * out goes to free().  Thread-safe. */
#ifndef DTE_RECVPOOL_H
#define DTE_RECVPOOL_H

#include <stddef.h>

struct recvpool;

/* An arena of `bytes`, populated on a thread of its own from now on
 * (pieces may be carved before it is done: their pages fault in as
 * usual).  NULL when it cannot be had (no memory, no thread): the caller
 * goes on without one. */
struct recvpool *recvpool_prepare(size_t bytes);

/* No more pieces from a: it is unmapped once every piece it handed out is
 * back (recvpool_free), at once when none is out.  NULL is fine. */
void recvpool_retire(struct recvpool *a);

/* len bytes (64-byte aligned) from the first arena, not retired, with
 * room; NULL when none has (the caller mallocs). */
void *recvpool_get(size_t len);

/* p came from recvpool_get and is not yet back. */
int recvpool_owns(const void *p);

/* Give back a piece of an arena, or free() anything else.  NULL is fine. */
void recvpool_free(void *p);

/* Arenas mapped now, pieces out now, pieces carved ever (tests, logs). */
struct recvpool_stats {
	unsigned arenas;
	unsigned long out;
	unsigned long carved;
};
void recvpool_stats(struct recvpool_stats *st);

#endif
