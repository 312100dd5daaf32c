/* daemon/bufpool.c — see bufpool.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/bufpool.h"

/* A large buffer on transparent huge pages where the kernel allows them
 * (enabled = madvise or always): its first write faults once per 2 MiB
 * instead of once per 4 KiB.  Measured on the dense capture (extract of
 * 2^24 elements into a fresh 32 MiB buffer, one core): 25-34 ms with
 * 4 KiB pages, 9-10 ms with huge pages, 3 ms into a buffer already
 * faulted in.  The capacity is rounded up to whole huge pages. */
#define BPOOL_HUGE ((size_t)2 << 20)

static void *alloc_large(size_t need, size_t *cap)
{
	size_t c = (need + BPOOL_HUGE - 1) / BPOOL_HUGE * BPOOL_HUGE;
	void *p = aligned_alloc(BPOOL_HUGE, c);

	if (!p)
		return NULL;
	/* No MADV_HUGEPAGE: faster alone (above), but in the dense path
	 * end to end (dense_probe.py at 10 Gbit/s, A/B in one sitting) the
	 * kernel's direct compaction for huge pages (THP defrag = madvise)
	 * made the sink's CPU per version bimodal, 0.18-0.79 s against a
	 * steady 0.24-0.27 s with 4 KiB pages, and the bench's dense sync
	 * 40 % slower. */
	*cap = c;
	return p;
}

void *bpool_get(struct bpool *bp, size_t need, size_t *cap)
{
	void *p = NULL;
	unsigned best = BPOOL_SLOTS;

	if (need >= BPOOL_MIN) {
		pthread_mutex_lock(&bp->mu);
		/* The smallest kept buffer that fits. */
		for (unsigned i = 0; i < bp->n; i++)
			if (bp->slot[i].cap >= need &&
			    (best == BPOOL_SLOTS || bp->slot[i].cap < bp->slot[best].cap))
				best = i;
		if (best < BPOOL_SLOTS) {
			p = bp->slot[best].p;
			*cap = bp->slot[best].cap;
			bp->held -= *cap;
			bp->slot[best] = bp->slot[--bp->n];
			bp->hits++;
		} else {
			bp->misses++;
		}
		pthread_mutex_unlock(&bp->mu);
		if (p)
			return p;
	}
	if (need >= BPOOL_MIN)
		return alloc_large(need, cap);
	if (!(p = malloc(need ? need : 1)))
		return NULL;
	*cap = need ? need : 1;
	return p;
}

void bpool_put(struct bpool *bp, void *p, size_t cap)
{
	if (!p)
		return;
	if (cap >= BPOOL_MIN) {
		pthread_mutex_lock(&bp->mu);
		if (bp->held + cap <= bp->max_bytes) {
			if (bp->n == BPOOL_SLOTS) {
				/* Full: the smallest kept one makes room. */
				unsigned s = 0;

				for (unsigned i = 1; i < bp->n; i++)
					if (bp->slot[i].cap < bp->slot[s].cap)
						s = i;
				if (bp->slot[s].cap < cap) {
					void *old = bp->slot[s].p;

					bp->held -= bp->slot[s].cap;
					bp->slot[s].p = p;
					bp->slot[s].cap = cap;
					bp->held += cap;
					pthread_mutex_unlock(&bp->mu);
					free(old);
					return;
				}
			} else {
				bp->slot[bp->n].p = p;
				bp->slot[bp->n].cap = cap;
				bp->n++;
				bp->held += cap;
				pthread_mutex_unlock(&bp->mu);
				return;
			}
		}
		pthread_mutex_unlock(&bp->mu);
	}
	free(p);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23	/* Linux 5.14 */
#endif

/* How many more buffers of `need` the pool wants, and has room for. */
static unsigned prefill_want(struct bpool *bp, size_t need, unsigned count)
{
	size_t cap = (need + BPOOL_HUGE - 1) / BPOOL_HUGE * BPOOL_HUGE;
	unsigned have = 0, want;

	pthread_mutex_lock(&bp->mu);
	for (unsigned i = 0; i < bp->n; i++)
		have += bp->slot[i].cap >= need;
	want = count > have ? count - have : 0;
	if (want > BPOOL_SLOTS - bp->n)
		want = BPOOL_SLOTS - bp->n;
	while (want && bp->held + (size_t)want * cap > bp->max_bytes)
		want--;
	pthread_mutex_unlock(&bp->mu);
	return want;
}

unsigned bpool_prefill(struct bpool *bp, size_t need, unsigned count)
{
	long pg = sysconf(_SC_PAGESIZE);
	unsigned made = 0;

	if (need < BPOOL_MIN)
		return 0;
	count = prefill_want(bp, need, count);
	for (; made < count; made++) {
		size_t cap;
		uint8_t *p = alloc_large(need, &cap);

		if (!p)
			break;
		/* A write fault per page, storing nothing the buffer needs
		 * (its user writes every byte it sends); the kernel does it in
		 * one call where it can. */
		if (madvise(p, cap, MADV_POPULATE_WRITE) < 0)
			for (size_t o = 0; o < cap; o += (size_t)(pg > 0 ? pg : 4096))
				p[o] = 0;
		bpool_put(bp, p, cap);	/* kept, or freed when the pool filled meanwhile */
	}
	return made;
}

void bpool_trim(struct bpool *bp)
{
	void *p[BPOOL_SLOTS];
	unsigned n;

	pthread_mutex_lock(&bp->mu);
	n = bp->n;
	for (unsigned i = 0; i < n; i++)
		p[i] = bp->slot[i].p;
	bp->n = 0;
	bp->held = 0;
	pthread_mutex_unlock(&bp->mu);
	for (unsigned i = 0; i < n; i++)
		free(p[i]);
}
