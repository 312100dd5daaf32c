/* daemon/bufpool.h — large scratch buffers kept for reuse.
 *
 * A fresh buffer of tens of MiB costs a page fault and a zeroed page per
 * 4 KiB on its first write: on a VM about 20 ms per 32 MiB, ten times the
 * write itself.  The dense path moves a model's worth of such buffers per
 * version (payload parts at the source, their copies in the router, the
 * parts a sink holds until the version is complete), so each place keeps
 * the few buffers it just released and takes them again for the next part.
 * A pool is emptied (bpool_trim) at the end of the phase that used it, so
 * an idle daemon holds none of it.  A new large buffer is asked for on
 * transparent huge pages (madvise; the kernel's setting decides), which
 * cuts the faults of its first write by 512.  Thread-safe. */
#ifndef DTE_BUFPOOL_H
#define DTE_BUFPOOL_H

#include <pthread.h>
#include <stddef.h>

/* Smaller buffers are not kept: a sparse version's parts (part_size, 4 MiB
 * by default) fault in a few MiB, which is cheaper than holding them. */
#define BPOOL_MIN	((size_t)16 << 20)
#define BPOOL_SLOTS	8

struct bpool {
	pthread_mutex_t mu;
	size_t max_bytes;         /* capacity kept at most */
	size_t held;              /* capacity kept now */
	struct { void *p; size_t cap; } slot[BPOOL_SLOTS];
	unsigned n;
	unsigned long hits, misses;
};

#define BPOOL_INIT(max) { PTHREAD_MUTEX_INITIALIZER, (max), 0, { { 0, 0 } }, 0, 0, 0 }

/* A buffer of at least `need` bytes (a kept one when one is big enough,
 * else malloc'ed), its capacity in *cap; NULL when out of memory. */
void *bpool_get(struct bpool *bp, size_t need, size_t *cap);

/* Give back a buffer of capacity cap (from bpool_get or malloc): kept when
 * it is large and there is room, else freed.  NULL is fine. */
void bpool_put(struct bpool *bp, void *p, size_t cap);

/* Keep up to `count` buffers of at least `need` bytes ready, their pages
 * written once (populated), so a phase known to come (a source's dense
 * version: daemon/job_capture.c, from a worker thread) does not pay its
 * first-touch page faults while it runs.  Buffers already kept that fit
 * count; the pool's max_bytes and slots bound the rest.  Returns how many
 * it added. */
unsigned bpool_prefill(struct bpool *bp, size_t need, unsigned count);

/* Free every kept buffer. */
void bpool_trim(struct bpool *bp);

#endif
