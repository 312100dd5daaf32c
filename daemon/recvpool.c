/* daemon/recvpool.c — see recvpool.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/recvpool.h"

/* The arena is populated and unmapped 2 MiB at a time (retire checked
 * between chunks; each munmap holds mmap_lock for one chunk's pages). */
#define RP_CHUNK ((size_t)2 << 20)
#define RP_ALIGN ((size_t)64)

struct recvpool {
	uint8_t *base;
	size_t size;
	size_t bump;              /* carved up to here */
	unsigned long live;       /* pieces out */
	int retired;
	struct recvpool *next;
};

static pthread_mutex_t rp_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rp_cv = PTHREAD_COND_INITIALIZER;
static struct recvpool *rp_list;
static unsigned long rp_out;
static unsigned long rp_carved;

static int rp_done(const struct recvpool *a)
{
	return a->retired && !a->live;
}

/* The arena's thread: populate it, then wait until it is retired and
 * every piece is back, and unmap it.  Unlinked first, so no piece can be
 * carved from it or recognised as its own while it goes. */
static void *rp_thread(void *arg)
{
	struct recvpool *a = arg, **pp;
	const long pg = sysconf(_SC_PAGESIZE);
	const size_t page = pg > 0 ? (size_t)pg : 4096;
	int stop = 0;

	for (size_t off = 0; off < a->size && !stop; off += RP_CHUNK) {
		size_t end = a->size - off < RP_CHUNK ? a->size : off + RP_CHUNK;

		/* A write fault per page that stores nothing of ours: an atomic
		 * add of zero, so a receive already filling a piece here (the
		 * kernel's copy) is never undone, whichever lands first.  Not
		 * MADV_POPULATE_WRITE: it holds mmap_lock across its range and
		 * yields the CPU inside it, and on a busy machine every mmap of
		 * the process (malloc's, under its arena lock, and the loop
		 * behind that lock) waited for this thread to get a core again
		 * (job.c, prefault_run, measured it). */
		for (size_t o = off; o < end; o += page)
			(void)__atomic_fetch_add((uint64_t *)(void *)(a->base + o), 0,
						 __ATOMIC_RELAXED);
		pthread_mutex_lock(&rp_mu);
		stop = rp_done(a);
		pthread_mutex_unlock(&rp_mu);
	}
	pthread_mutex_lock(&rp_mu);
	while (!rp_done(a))
		pthread_cond_wait(&rp_cv, &rp_mu);
	for (pp = &rp_list; *pp; pp = &(*pp)->next) {
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&rp_mu);
	for (size_t off = 0; off < a->size; off += RP_CHUNK)
		munmap(a->base + off, a->size - off < RP_CHUNK ? a->size - off : RP_CHUNK);
	free(a);
	return NULL;
}

struct recvpool *recvpool_prepare(size_t bytes)
{
	struct recvpool *a;
	pthread_attr_t at;
	pthread_t t;
	void *p;
	int rc;

	if (!bytes)
		return NULL;
	bytes = (bytes + RP_CHUNK - 1) / RP_CHUNK * RP_CHUNK;
	if (!(a = calloc(1, sizeof(*a))))
		return NULL;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		free(a);
		return NULL;
	}
	a->base = p;
	a->size = bytes;
	/* The thread first: it unlinks the arena only once it is retired,
	 * which cannot happen before it is listed and returned here. */
	if ((rc = pthread_attr_init(&at)) == 0) {
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		rc = pthread_create(&t, &at, rp_thread, a);
		pthread_attr_destroy(&at);
	}
	if (rc) {
		munmap(a->base, a->size);
		free(a);
		return NULL;
	}
	pthread_mutex_lock(&rp_mu);
	a->next = rp_list;
	rp_list = a;
	pthread_mutex_unlock(&rp_mu);
	return a;
}

void recvpool_retire(struct recvpool *a)
{
	if (!a)
		return;
	pthread_mutex_lock(&rp_mu);
	a->retired = 1;
	if (rp_done(a))
		pthread_cond_broadcast(&rp_cv);
	pthread_mutex_unlock(&rp_mu);
}

void *recvpool_get(size_t len)
{
	size_t need = (len + RP_ALIGN - 1) / RP_ALIGN * RP_ALIGN;
	void *p = NULL;

	if (!len || need < len)
		return NULL;
	pthread_mutex_lock(&rp_mu);
	for (struct recvpool *a = rp_list; a && !p; a = a->next) {
		if (a->retired || a->size - a->bump < need)
			continue;
		p = a->base + a->bump;
		a->bump += need;
		a->live++;
		rp_out++;
		rp_carved++;
	}
	pthread_mutex_unlock(&rp_mu);
	return p;
}

static struct recvpool *rp_find(const void *p)
{
	for (struct recvpool *a = rp_list; a; a = a->next)
		if ((const uint8_t *)p >= a->base && (const uint8_t *)p < a->base + a->bump)
			return a;
	return NULL;
}

int recvpool_owns(const void *p)
{
	int r;

	if (!p)
		return 0;
	pthread_mutex_lock(&rp_mu);
	r = rp_find(p) != NULL;
	pthread_mutex_unlock(&rp_mu);
	return r;
}

void recvpool_free(void *p)
{
	struct recvpool *a;

	if (!p)
		return;
	pthread_mutex_lock(&rp_mu);
	if (!(a = rp_find(p))) {
		pthread_mutex_unlock(&rp_mu);
		free(p);
		return;
	}
	/* Pieces are not reused: an arena serves one version, and goes when
	 * it is retired and its last piece is back. */
	a->live--;
	rp_out--;
	if (rp_done(a))
		pthread_cond_broadcast(&rp_cv);
	pthread_mutex_unlock(&rp_mu);
}

void recvpool_stats(struct recvpool_stats *st)
{
	pthread_mutex_lock(&rp_mu);
	st->arenas = 0;
	for (struct recvpool *a = rp_list; a; a = a->next)
		st->arenas++;
	st->out = rp_out;
	st->carved = rp_carved;
	pthread_mutex_unlock(&rp_mu);
}
