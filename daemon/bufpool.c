/* daemon/bufpool.c — see bufpool.h. */
#include <stdlib.h>
#include "daemon/bufpool.h"

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
