/* daemon/job_storage.c — the storage transport of a job (job_storage.h,
 * docs/STORAGE.md).
 *
 * Writer: one daemon writes, the coordinator, because the library
 * assumes one writer per version.  Sources on any daemon feed it through
 * the engine (a sink participant with the canonical layout), so several
 * source daemons, K > 1 marks and dense repair work exactly as between
 * daemons; the price is one canonical BF16 copy of the model (2 B per
 * element) on the coordinator, which is also what lets it write the
 * delta against verified content and keyframes at any version.
 *
 * Reader: verification is the library's (manifest schema, spec hash,
 * chunk sizes and xxh3, every position inside its tensor and sorted);
 * after apply each sink buffer's checksum is compared with a prediction:
 * for a dense version the sum over its values, for a delta the previous
 * verified sum minus the old elements' terms plus the new ones.  The old
 * values are read from the sink buffer when the version is staged, which
 * holds the previous version because a version is staged only once every
 * local sink applied the one before it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "daemon/job_ext.h"
#include "daemon/job_state.h"
#include "daemon/job_coord.h"
#include "daemon/job_sink_engine.h"
#include "daemon/job_src.h"
#include "daemon/job_src_engine.h"
#include "daemon/job_local.h"
#include "daemon/job_task.h"
#include "daemon/job_storage.h"
#include "daemon/log.h"
#include "daemon/reader_sm.h"
#include "daemon/storage/storage.h"
#include "daemon/storage/watch.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

#define DEF_KEYFRAME_EVERY 10u
#define DEF_KEEP_VERSIONS  32u
#define DEF_KEEP_KEYFRAMES 2u
#define READER_STALE_S     600.0   /* gc ignores readers silent for this long */
#define WATCH_MS           200u    /* backstop (inotify) or poll period */
#define APPLY_POLL_MS      10u     /* while staged versions wait for apply */
/* Buffer owners that are not control connections (those count from 1). */
#define OWNER_BASE         (1ull << 62)
/* A relay reader applies at most this many versions to its source before
 * it publishes the last of them (a reader behind the writer catches up in
 * one version: the snapshot detect sends what changed since the last). */
#define RELAY_BATCH        64u
#define RELAY_SETTLE_MS    200.0

/* A local sink participant fed from storage. */
struct rsink {
	uint64_t id;
	struct dte_layout lay;
	size_t *piece, *slot;      /* this rank's pieces and their buffer slots */
	size_t np, nslots;
	uint64_t *P, *Pnew;        /* per slot: verified and predicted checksums */
	enum reader_sstate state;  /* changed only by rsink_step (reader_sm.h) */
	uint64_t fails0;           /* its checksum failures when its version was staged */
	struct rsink *next;
};

struct rread;
struct rfeed;

struct jstore {
	struct jstore_cfg cfg;
	struct dte_engine *eng;    /* its engine (outlives the store: shutdown drains it) */
	struct job *job;           /* NULL once the job is gone */
	uint64_t *toff;            /* [ntensors + 1]: tensor starts, canonical flat */
	uint64_t *numel;
	struct dts_model model;
	/* writer */
	struct dts_writer *w;
	uint64_t owner, canon;
	struct dbuf *mirror;
	int mirror_known;          /* the mirror holds the writer's head */
	int64_t head;              /* the writer's head, as the loop may read it */
	struct wcommit *wc;        /* the commit on a worker thread, or NULL */
	char jname[JOB_NAME_MAX];  /* the job's name, for workers */
	struct dte_spec_tensor *tens; /* [ntensors]: the spec's tensors, for workers */
	/* reader */
	struct dts_reader *r;      /* a worker's while rd is set */
	struct rread *rd;          /* the read on a worker, or NULL */
	int rekick;                /* a tick came while rd was out: look again */
	int64_t ack;               /* applied everywhere, position not recorded yet */
	int64_t rpos;              /* the reader's position, as the loop may read it */
	struct dte_watch *watch;   /* the engine's I/O's (engine_io.h); NULL: none */
	struct dte_timer *timer;
	int timer_on;
	int64_t staging;           /* version staged to the sinks, -1 none */
	struct rsink *sinks;
	uint64_t broken;
	char error[256];
	/* relay reader (relay_start; s->r and the watch as a reader's) */
	uint64_t src;              /* its source participant; 0: not a relay */
	struct dbuf *theta;        /* that source's FP32 buffer */
	uint64_t *foff;            /* [ntensors]: tensor starts in theta's elements */
	uint8_t *halves;           /* [ntensors]: an FP32 tensor, carried as halves */
	int64_t pend;              /* read into theta, not published yet; -1 none */
	int64_t pub;               /* published, its capture not seen ended; -1 none */
	int64_t last;              /* the newest published (θ holds it); -1 none */
	int64_t step;              /* publishes so far (the step each one names) */
	struct rfeed *fd;          /* the read on a worker, or NULL */
	uint64_t relay_reads, relay_bytes; /* versions read, chunk bytes read */
	size_t fed;                /* pairs the last publish had */
	uint64_t seen_epoch, seen_at; /* the plan a first publish waits on, since when */
	uint64_t read_at;          /* the last read's start */
};

/* In the engine: store_owners (the writers' buffer owners drawn:
 * OWNER_BASE + n, unique within the engine; the buffer registry is
 * process-wide, so engines sharing a process with their own routers
 * will need distinct bases), store_commits (writers' commits on
 * workers). */

static void store_destroy(struct jstore *s);

const char *jstore_transport_name(int t)
{
	return t == JSTORE_STORAGE ? "storage" : t == JSTORE_BOTH ? "both" : "ucx";
}

int jstore_parse(const struct jcreate_args *rq, struct jstore_cfg *c, char *err, size_t errlen)
{
	const char *t = rq->transport && *rq->transport ? rq->transport : "ucx";
	const char *role = rq->storage_role && *rq->storage_role ? rq->storage_role : "writer";
	const char *watch = rq->storage_watch && *rq->storage_watch ? rq->storage_watch : "inotify";

	memset(c, 0, sizeof(*c));
	if (!strcmp(t, "ucx"))
		c->transport = JSTORE_UCX;
	else if (!strcmp(t, "storage"))
		c->transport = JSTORE_STORAGE;
	else if (!strcmp(t, "both"))
		c->transport = JSTORE_BOTH;
	else
		return derr_fail(err, errlen, -EINVAL, "transport \"%s\" unknown (ucx, storage, both)", t);
	if (c->transport == JSTORE_UCX)
		return 0;
	if (!rq->storage_root || rq->storage_root[0] != '/' ||
	    strlen(rq->storage_root) >= sizeof(c->root) - 256)
		return derr_fail(err, errlen, -EINVAL, "transport %s needs storage_root, an absolute path", t);
	snprintf(c->root, sizeof(c->root), "%s", rq->storage_root);
	if (!strcmp(role, "reader"))
		c->reader = 1;
	else if (strcmp(role, "writer"))
		return derr_fail(err, errlen, -EINVAL, "storage_role \"%s\" unknown (writer, reader)", role);
	/* A reader job with transport both is a relay reader: its
	 * coordinator alone reads the directory and feeds the job's sinks,
	 * on every daemon of the cluster, over UCX (relay_start). */
	c->relay = c->reader && c->transport == JSTORE_BOTH;
	if ((c->watch_mode = dts_watch_mode_parse(watch)) < 0)
		return derr_fail(err, errlen, -EINVAL, "storage_watch \"%s\" unknown (inotify, poll)", watch);
	c->keyframe_every = rq->keyframe_every ? rq->keyframe_every : DEF_KEYFRAME_EVERY;
	c->keep_versions = rq->keep_versions ? rq->keep_versions : DEF_KEEP_VERSIONS;
	c->keep_keyframes = rq->keep_keyframes ? rq->keep_keyframes : DEF_KEEP_KEYFRAMES;
	if (c->keyframe_every > 1000000 || c->keep_versions > 1000000 || c->keep_keyframes > 1000)
		return derr_fail(err, errlen, -EINVAL, "keyframe_every, keep_versions or keep_keyframes out of "
				"range");
	return 0;
}

int jstore_same_job(const struct job *j, const struct jstore_cfg *b)
{
	const struct jstore_cfg *a = j->store ? &j->store->cfg : NULL;

	if (!a)
		return b->transport == JSTORE_UCX;
	return a->transport == b->transport && a->reader == b->reader &&
	       !strcmp(a->root, b->root) && a->keyframe_every == b->keyframe_every &&
	       a->keep_versions == b->keep_versions && a->keep_keyframes == b->keep_keyframes;
}

int jstore_attach_check(const struct job *j, int role, char *err, size_t errlen)
{
	const struct jstore *s = j->store;

	if (!s)
		return 0;
	if (s->cfg.reader && role == JROLE_SOURCE)
		return derr_fail(err, errlen, -EINVAL, "job %s reads from storage: sources attach to the "
				"writer's job on their own cluster", j->name);
	if (!s->cfg.reader && s->cfg.transport == JSTORE_STORAGE && role == JROLE_SINK)
		return derr_fail(err, errlen, -EINVAL, "job %s writes to storage only: sinks attach to a reader "
				"job (storage_role reader) or the job uses transport both", j->name);
	return 0;
}

int jstore_fp8_check(const struct job *j, char *err, size_t errlen)
{
	/* A relay reader's sinks are fed by its source, which quantizes θ
	 * (the stored BF16 values) with the engine's rule as any source. */
	if (j->store && j->store->cfg.reader && !j->store->cfg.relay)
		return derr_fail(err, errlen, -EOPNOTSUPP, "job %s reads from storage, which holds "
				 "BF16 values; an FP8 sink's codes and scales are computed by a source "
				 "from θ: attach it to a job fed over UCX, or make this cluster's reader "
				 "a relay reader (transport both; docs/STORAGE.md)", j->name);
	return 0;
}

/* ------------------------------------------------------------ helpers */

/* The storage library's codes (DTS_*, small negatives of their own) as
 * the daemon's negative errnos (derr.h). */
static int dts_errno(int rc)
{
	switch (rc) {
	case DTS_OK:
		return 0;
	case DTS_EINVAL:
	case DTS_ESPEC:
		return -EINVAL;
	case DTS_ENOMEM:
		return -ENOMEM;
	case DTS_EAGAIN:
		return -EAGAIN;
	case DTS_EEXIST:
		return -EEXIST;
	default:	/* the file system, or what it holds, is bad */
		return -EIO;
	}
}

static struct jhist *hist_add(struct job *j, uint64_t version)
{
	struct jhist *h = &j->hist[j->nhist % JOB_HISTORY];

	memset(h, 0, sizeof(*h));
	h->version = version;
	j->nhist++;
	return h;
}

static void unravel(const struct dte_spec_tensor *t, uint64_t idx, int64_t *c)
{
	for (int d = (int)t->ndim - 1; d >= 0; d--) {
		c[d] = (int64_t)(idx % (uint64_t)t->shape[d]);
		idx /= (uint64_t)t->shape[d];
	}
}

/* Every version of [from, to] into flat, starting from the newest keyframe
 * at or before `to` (the library verifies each part it loads). */
static int rebuild(struct jstore *s, uint64_t to, uint16_t *flat, char *err, size_t errlen)
{
	struct dts_catalog cat;
	ssize_t k = -1;
	int rc;

	if ((rc = dts_catalog_load(&cat, s->cfg.root, s->jname, 0, err, errlen)))
		return dts_errno(rc);
	rc = -EIO;
	for (size_t i = 0; i < cat.nv; i++)
		if (cat.v[i].version <= to && cat.v[i].keyframe && !cat.v[i].bad)
			k = (ssize_t)i;
	if (k < 0) {
		rc = derr_fail(err, errlen, -ENOENT, "no readable keyframe at or before v%llu",
			       (unsigned long long)to);
		goto out;
	}
	for (size_t i = (size_t)k; i < cat.nv && cat.v[i].version <= to; i++) {
		const struct dts_cat_version *cv = &cat.v[i];
		int key = i == (size_t)k || cv->base < 0;
		struct dts_version *v;

		if (cv->version != cat.v[k].version + (i - (size_t)k)) {
			snprintf(err, errlen, "v%llu missing in the chain from keyframe v%llu",
				 (unsigned long long)(cat.v[k].version + (i - (size_t)k)),
				 (unsigned long long)cat.v[k].version);
			goto out;
		}
		if ((rc = dts_version_load(s->cfg.root, s->jname, cv->version,
					   key ? DTS_PART_KEYFRAME : DTS_PART_DELTA, &s->model, &v, err,
					   errlen))) {
			rc = dts_errno(rc);
			goto out;
		}
		rc = -EIO;
		for (uint32_t t = 0; t < v->ntensors && t < s->model.ntensors; t++) {
			const struct dts_tensor_data *td = &v->t[t];

			if (v->dense)
				memcpy(flat + s->toff[t], td->val, s->numel[t] * sizeof(uint16_t));
			else
				for (uint64_t q = 0; q < td->count; q++)
					flat[s->toff[t] + td->pos[q]] = td->val[q];
		}
		dts_version_free(v);
		if (cv->version == to)
			rc = 0;
	}
	if (rc)
		rc = derr_fail(err, errlen, -ENOENT, "v%llu is not committed",
			       (unsigned long long)to);
out:
	dts_catalog_fini(&cat);
	return rc;
}

/* ------------------------------------------------------------- writer */

struct change {
	uint64_t idx;
	uint16_t val;
};

static int change_cmp(const void *a, const void *b)
{
	const struct change *x = a, *y = b;

	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* What a staged version really changes in the mirror (flagged elements
 * whose value did not move are dropped), in canonical order. */
static int collect_changes(const uint16_t *m, uint64_t total, const struct jstaged *st,
			   struct change **out, size_t *nout)
{
	struct change *ch = NULL;
	size_t n = 0, cap = 0;

	for (size_t i = 0; i < st->n; i++) {
		const struct jwrite *w = &st->w[i];
		const struct dte_box_map *map = &w->map;

		for (uint64_t k = 0; k < w->n; k++) {
			uint64_t rel = w->dense ? k : w->pos[k], at = 0;
			int64_t dst = map->dst_offset;

			for (int d = (int)map->ndim - 1; d >= 0; d--) {
				dst += (int64_t)(rel % (uint64_t)map->extent[d]) * map->dst_stride[d];
				rel /= (uint64_t)map->extent[d];
			}
			if (dst < 0 || (uint64_t)dst >= total) {
				free(ch);
				return -ERANGE;
			}
			at = (uint64_t)dst;
			if (m[at] == w->val[k])
				continue;
			if (n == cap) {
				size_t nc = cap ? 2 * cap : 4096;
				void *p = realloc(ch, nc * sizeof(*ch));

				if (!p) {
					free(ch);
					return -ENOMEM;
				}
				ch = p;
				cap = nc;
			}
			ch[n].idx = at;
			ch[n++].val = w->val[k];
		}
	}
	if (n)
		qsort(ch, n, sizeof(*ch), change_cmp);
	*out = ch;
	*nout = n;
	return 0;
}

/* One version's commit, done on a libuv worker: compressing and writing
 * the chunks, the fsyncs and the gc take seconds for a large model, and
 * on the loop they would stall every other client and peer meanwhile.
 * While it runs the loop leaves the writer, the mirror (no version is
 * applied to it: writer_staged waits) and the tensor table alone. */
struct wcommit {
	struct dte_work work;	/* first: the work is the commit */
	struct jstore *s;
	char job[JOB_NAME_MAX];
	uint64_t version;
	struct change *ch;
	size_t n;
	unsigned flags;
	int requested;
	/* results, for the loop */
	int rc;
	char err[512];
	struct dts_gc_result gc;
	int gc_rc;
	char gc_err[256];
};

static void commit_work(struct dte_work *w)
{
	struct wcommit *c = (struct wcommit *)w;
	struct jstore *s = c->s;
	const uint16_t *m = s->mirror->ptr;
	struct dts_gc_cfg gc = { s->cfg.keep_versions, s->cfg.keep_keyframes, READER_STALE_S, 0 };
	uint64_t *pos = NULL;
	uint16_t *val = NULL;
	size_t n = c->n;
	int rc;

	if ((rc = dts_writer_begin(s->w, c->version, c->flags, c->err, sizeof(c->err))))
		goto fail;
	if (dts_writer_has_base(s->w) && n) {
		size_t i = 0;

		pos = malloc(n * sizeof(*pos));
		val = malloc(n * sizeof(*val));
		if (!pos || !val) {
			snprintf(c->err, sizeof(c->err), "out of memory");
			rc = DTS_ENOMEM;
			goto fail;
		}
		for (uint32_t t = 0; t < s->model.ntensors && i < n; t++) {
			size_t k = 0;

			for (; i < n && c->ch[i].idx < s->toff[t + 1]; i++, k++) {
				pos[k] = c->ch[i].idx - s->toff[t];
				val[k] = c->ch[i].val;
			}
			if (k && (rc = dts_writer_put_sparse(s->w, t, pos, val, k, c->err,
							     sizeof(c->err))))
				goto fail;
		}
	}
	if (dts_writer_needs_dense(s->w))
		for (uint32_t t = 0; t < s->model.ntensors; t++)
			if ((rc = dts_writer_put_dense(s->w, t, m + s->toff[t], c->err,
						       sizeof(c->err))))
				goto fail;
	if ((rc = dts_writer_commit(s->w, c->err, sizeof(c->err))))
		goto fail;
	c->gc_rc = dts_gc(s->cfg.root, c->job, &gc, &c->gc, c->gc_err, sizeof(c->gc_err));
	goto out;
fail:
	dts_writer_abort(s->w);
out:
	c->rc = rc;
	free(pos);
	free(val);
}

static void writer_staged(struct jstore *s, struct job *j, struct jlocal *l);

/* Back on the loop: report the commit, then go on with what was staged
 * meanwhile. */
static void commit_after(struct dte_work *w, int cancelled)
{
	struct wcommit *c = (struct wcommit *)w;
	struct jstore *s = c->s;
	struct job *j;
	struct jhist *h;
	const char *cause;

	s->eng->store_commits--;
	s->wc = NULL;
	if (!(j = s->job)) {
		/* The job went while the commit was out: the store is ours. */
		free(c->ch);
		free(c);
		store_destroy(s);
		return;
	}
	s->head = dts_writer_head(s->w);
	if (c->rc == 0) {
		int keyframe = c->version % s->cfg.keyframe_every == 0 || c->requested ||
			       (c->flags & DTS_BEGIN_NOBASE);

		if ((h = jhist_find(j, c->version)))
			snprintf(h->note, sizeof(h->note), "storage: %zu changed%s", c->n,
				 keyframe ? ", keyframe" : "");
		DLOG_D("job %s: storage v%llu committed: %zu changed%s", j->name,
		       (unsigned long long)c->version, c->n,
		       c->requested ? " (keyframe requested)" : "");
		if (c->gc_rc)
			DLOG_W("job %s: storage gc: %s", j->name, c->gc_err);
		else if (c->gc.removed || c->gc.orphans_removed)
			DLOG_I("job %s: storage gc removed %llu versions (%llu bytes), %llu "
			       "leftovers; floor v%lld", j->name,
			       (unsigned long long)c->gc.removed,
			       (unsigned long long)c->gc.removed_bytes,
			       (unsigned long long)c->gc.orphans_removed, (long long)c->gc.floor);
	} else {
		DLOG_E("job %s: storage v%llu not written (%s): %s", j->name,
		       (unsigned long long)c->version, dts_strerror(c->rc), c->err);
		/* The errno text ends err after a long path: a 96-byte history
		 * note cut at the front would hide "No space left on device", so
		 * the note and dtectl job carry the cause first.  broken counts
		 * versions the writer could not commit (a reader counts refused
		 * ones). */
		cause = strrchr(c->err, ':');
		cause = cause && cause[1] == ' ' ? cause + 2 : c->err;
		s->broken++;
		snprintf(s->error, sizeof(s->error), "v%llu not written: %s: %.200s",
			 (unsigned long long)c->version, dts_strerror(c->rc), c->err);
		if ((h = jhist_find(j, c->version)))
			snprintf(h->note, sizeof(h->note), "storage write failed (%s): %.60s",
				 dts_strerror(c->rc), cause);
	}
	free(c->ch);
	free(c);
	(void)cancelled;
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (l->info.id == s->canon) {
			jsink_send_deferred(j, l);
			writer_staged(s, j, l);
			break;
		}
}

/* Hand version's changes (ch, n: taken over) to a worker to commit; l is
 * the canonical sink, whose held APPLIED goes once the commit is back. */
static void writer_commit(struct jstore *s, struct job *j, struct jlocal *l, uint64_t version,
			  struct change *ch, size_t n, int nobase)
{
	struct wcommit *c = calloc(1, sizeof(*c));
	int e = 0;

	if (!c) {
		free(ch);
		s->broken++;
		snprintf(s->error, sizeof(s->error), "v%llu not written: out of memory",
			 (unsigned long long)version);
		DLOG_E("job %s: storage v%llu not written: out of memory", j->name,
		       (unsigned long long)version);
		jsink_send_deferred(j, l);
		return;
	}
	c->s = s;
	snprintf(c->job, sizeof(c->job), "%s", j->name);
	c->version = version;
	c->ch = ch;
	c->n = n;
	c->requested = dts_keyframe_take(s->cfg.root, j->name);
	c->flags = (nobase ? DTS_BEGIN_NOBASE : 0) | (c->requested ? DTS_BEGIN_KEYFRAME : 0);
	s->wc = c;
	s->eng->store_commits++;
	if ((e = jio_queue(s->eng, &c->work, commit_work, commit_after)) < 0) {
		if (jio_workers(s->eng))
			DLOG_W("job %s: storage v%llu: no worker (%s); writing on the loop",
			       j->name, (unsigned long long)version, strerror(-e));
		commit_work(&c->work);
		commit_after(&c->work, 0);
	}
}

/* A version of the canonical sink on its way through the mirror: applied
 * on a worker (job_sink_apply.c), then committed (writer_commit). */
struct wapply {
	uint64_t version;
	int all_dense, known;
	const uint16_t *mirror;   /* the canonical copy: the apply task holds it */
	uint64_t total;           /* its elements */
	int collect_failed;       /* worker: out of memory or a write outside it */
	struct change *ch;
	size_t n;
};

/* Worker, before the version is written to the mirror: what it changes
 * (a dense version reads the whole mirror: not on the loop). */
static void writer_collect(void *arg, const struct jstaged *st)
{
	struct wapply *w = arg;

	w->collect_failed = collect_changes(w->mirror, w->total, st, &w->ch, &w->n) < 0;
}

static void writer_applied(struct job *j, struct jlocal *l, const struct jsink_apply_result *r,
			   void *arg)
{
	struct wapply *w = arg;
	struct jstore *s = j ? j->store : NULL;

	if (!s || !s->w || !l || l->info.id != s->canon) {
		/* The job, its store or the sink went away meanwhile. */
		free(w->ch);
		free(w);
		return;
	}
	if (w->collect_failed) {
		DLOG_E("job %s: storage v%llu: out of memory or a write outside the mirror",
		       j->name, (unsigned long long)w->version);
		w->known = 0;
	}
	if (!r->ok) {
		/* The sources repair the mirror densely at the next version. */
		s->mirror_known = 0;
	} else if (!w->known && !w->all_dense) {
		DLOG_W("job %s: storage v%llu not written: the canonical copy is not known "
		       "good before it (the next dense version repairs)", j->name,
		       (unsigned long long)w->version);
	} else {
		/* its APPLIED goes once the commit is back (commit_after, which
		 * goes on with the next staged version) */
		s->mirror_known = 1;
		writer_commit(s, j, l, w->version, w->ch, w->n, !w->known);
		free(w);
		return;
	}
	jsink_send_deferred(j, l);
	free(w->ch);
	free(w);
	writer_staged(s, j, l);
}

static void writer_staged(struct jstore *s, struct job *j, struct jlocal *l)
{
	/* One version at a time: the next one is applied to the mirror only
	 * once the commit before it is done with the mirror, and only one
	 * apply runs (its completion, writer_applied, comes back here). */
	if (jsink_of(l)->staged && !s->wc && !jsink_of(l)->applying &&
	    !s->eng->stopping) {
		const struct jstaged *st = jsink_of(l)->staged;
		struct wapply *w = calloc(1, sizeof(*w));
		char err[256];

		if (!w) {
			DLOG_E("job %s: storage v%llu: out of memory", j->name,
			       (unsigned long long)st->version);
			s->mirror_known = 0;
			return;
		}
		w->version = st->version;
		w->all_dense = st->all_dense;
		w->known = s->mirror_known;
		w->mirror = s->mirror->ptr;
		w->total = s->toff[s->model.ntensors];
		if (jsink_apply_start_prep(j, l, w->version, writer_collect, writer_applied, w, err,
					   sizeof(err)) < 0) {
			DLOG_E("job %s: storage v%llu: %s", j->name, (unsigned long long)w->version,
			       err);
			free(w->ch);
			free(w);
			s->mirror_known = 0;
		}
	}
}

/* The canonical sink's completion (jsink_make_writer): a version staged. */
static void writer_sink_staged(struct job *j, struct jlocal *l)
{
	struct jstore *s = j->store;

	if (s && s->w && l->info.id == s->canon)
		writer_staged(s, j, l);
}

/* The daemon-owned canonical buffer of the writer's sink (BF16) or the
 * relay reader's source (FP32): `total` elements in a sealed memfd like a
 * client's buffer, registered under the store's own owner. */
static int canon_buffer(struct jstore *s, uint64_t total, int dtype, const char *name,
			struct dbuf **out, char *err, size_t errlen)
{
	size_t elem = dtype == DBUF_FP32 ? 4 : 2;
	uint64_t id;
	int fd, e;

	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)((total ? total : 1) * elem)) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		e = -errno;
		if (fd >= 0)
			close(fd);
		return derr_fail(err, errlen, e, "%s: %s", name, strerror(-e));
	}
	s->owner = OWNER_BASE + ++s->eng->store_owners;
	if ((e = dbuf_register_fd(s->owner, fd, 0, total ? total : 1, dtype, name, &id, err,
				  errlen)) < 0)
		return e;
	*out = dbuf_get(s->owner, id);
	return 0;
}

/* l (made with one buffer slot) becomes the job's participant in the
 * canonical layout over buf, owned by the store; its id. */
static uint64_t canon_link(struct jstore *s, struct job *j, struct jlocal *l, struct dbuf *buf)
{
	l->bufs[0] = buf;
	l->buf_ids[0] = 0;
	dbuf_ref(buf);
	l->info.id = job_participant_id_new(j->eng);
	snprintf(l->info.layout, sizeof(l->info.layout), "%s", JSTORE_CANON_LAYOUT);
	snprintf(l->info.node, sizeof(l->info.node), "%s", jio_self(j->eng));
	l->owner = s->owner;
	l->next = j->locals;
	j->locals = l;
	return l->info.id;
}

static int writer_start(struct jstore *s, struct job *j, char *err, size_t errlen)
{
	struct dts_writer_cfg wc;
	struct jlocal *l = NULL;
	uint64_t total = s->toff[s->model.ntensors];
	int64_t head;
	int e;

	memset(&wc, 0, sizeof(wc));
	wc.root = s->cfg.root;
	wc.job = j->name;
	wc.model = s->model;
	wc.keyframe_every = s->cfg.keyframe_every;
	if ((e = dts_writer_open(&s->w, &wc, err, errlen)))
		return dts_errno(e);
	if ((e = canon_buffer(s, total, DBUF_BF16, "storage canonical", &s->mirror, err,
			      errlen)) < 0)
		return e;
	head = s->head = dts_writer_head(s->w);
	s->mirror_known = 1;
	if (head >= 0) {
		char why[512];

		if (rebuild(s, (uint64_t)head, s->mirror->ptr, why, sizeof(why)) < 0) {
			DLOG_W("job %s: storage head v%lld unreadable (%s); the next version is a "
			       "keyframe without base", j->name, (long long)head, why);
			s->mirror_known = 0;
		} else {
			DLOG_N("job %s: storage resumes after v%lld", j->name, (long long)head);
		}
	}
	l = jlocal_new(JROLE_SINK, 1);
	if (!l || jsink_make_writer(l, writer_sink_staged) < 0) {
		jlocal_free(j->eng, l);
		return derr_fail(err, errlen, -ENOMEM, "out of memory");
	}
	s->canon = canon_link(s, j, l, s->mirror);
	DLOG_N("job %s: storage writer on %s/%s (keyframe every %u, keep %u versions, %u "
	       "keyframes), head v%lld", j->name, s->cfg.root, j->name, s->cfg.keyframe_every,
	       s->cfg.keep_versions, s->cfg.keep_keyframes, (long long)head);
	job_send_join(j);
	return 0;
}

/* ------------------------------------------------------------- reader */

/* One transition of a sink fed from storage: the table (reader_sm.c,
 * docs/SYNC.md "A sink fed from storage") decides and stores the state,
 * the caller only executes the action it returns.  A cell the table marks
 * "—" (the event cannot reach that state) is logged as a daemon bug, the
 * state is kept and the caller does nothing. */
static enum reader_saction rsink_step(const struct job *j, struct rsink *rs,
				      enum reader_sevent ev)
{
	struct reader_step d = reader_sm_step(rs->state, ev);

	if (d.act == READER_A_NONE) {
		DLOG_E("job %s: sink %llx: storage reader: %s in state %s has no transition (bug)",
		       j->name, (unsigned long long)rs->id, reader_sm_event_name(ev),
		       reader_sm_state_name(rs->state));
		return d.act;
	}
	DLOG_D("job %s: sink %llx: storage reader: %s -> %s (%s)", j->name,
	       (unsigned long long)rs->id, reader_sm_state_name(rs->state),
	       reader_sm_state_name(d.next), reader_sm_action_name(d.act));
	rs->state = d.next;
	return d.act;
}

static void rsink_free(struct rsink *rs)
{
	dte_layout_fini(&rs->lay);
	free(rs->piece);
	free(rs->slot);
	free(rs->P);
	free(rs->Pnew);
	free(rs);
}

static struct rsink *rsink_new(struct job *j, struct jlocal *l)
{
	struct rsink *rs = calloc(1, sizeof(*rs));
	char err[256];

	if (!rs)
		return NULL;
	if (jlayout_build(j, JROLE_SINK, l->info.layout, l->info.rank, NULL, &rs->lay, err, sizeof(err))) {
		DLOG_E("job %s: sink %llx: %s", j->name, (unsigned long long)l->info.id, err);
		free(rs);
		return NULL;
	}
	rs->piece = calloc(rs->lay.npieces + 1, sizeof(*rs->piece));
	rs->slot = calloc(rs->lay.npieces + 1, sizeof(*rs->slot));
	rs->P = calloc(l->nbufs + 1, sizeof(*rs->P));
	rs->Pnew = calloc(l->nbufs + 1, sizeof(*rs->Pnew));
	if (!rs->piece || !rs->slot || !rs->P || !rs->Pnew) {
		rsink_free(rs);
		return NULL;
	}
	for (size_t i = 0; i < rs->lay.npieces; i++) {
		const struct dte_piece *p = &rs->lay.pieces[i];
		size_t slot;

		if (p->rank != l->info.rank || !jlocal_buf(l, p->buf, &slot) ||
		    p->tensor >= j->spec.n)
			continue;
		rs->piece[rs->np] = i;
		rs->slot[rs->np++] = slot;
	}
	rs->nslots = l->nbufs;
	rs->id = l->info.id;
	(void)rsink_step(j, rs, READER_EV_ANNOUNCED);	/* made: dense first */
	return rs;
}

/* The sinks list follows the job's local sinks. */
static void sync_sinks(struct jstore *s, struct job *j)
{
	for (struct rsink **pp = &s->sinks; *pp;) {
		struct jlocal *l = job_local(j, (*pp)->id);

		if (!l) {
			struct rsink *gone = *pp;

			*pp = gone->next;
			(void)rsink_step(j, gone, READER_EV_GONE);	/* free: it is unlinked */
			rsink_free(gone);
		} else {
			pp = &(*pp)->next;
		}
	}
	for (struct jlocal *l = j->locals; l; l = l->next) {
		struct rsink *rs;

		if (l->info.role != JROLE_SINK || !l->announced)
			continue;
		for (rs = s->sinks; rs && rs->id != l->info.id; rs = rs->next)
			;
		if (rs || !(rs = rsink_new(j, l)))
			continue;
		rs->next = s->sinks;
		s->sinks = rs;
	}
}

static struct dte_box_map piece_map(const struct dte_piece *p)
{
	struct dte_box_map m;

	memset(&m, 0, sizeof(m));
	m.ndim = p->ndim;
	m.dst_offset = p->offset;
	for (uint32_t d = 0; d < p->ndim; d++) {
		m.extent[d] = p->hi[d] - p->lo[d];
		m.dst_stride[d] = p->stride[d];
	}
	return m;
}

static struct jstaged *staged_new(size_t nw, size_t nslots)
{
	struct jstaged *st = calloc(1, sizeof(*st));

	if (!st)
		return NULL;
	st->w = calloc(nw + 1, sizeof(*st->w));
	st->expect = calloc(nslots + 1, sizeof(*st->expect));
	st->covered = calloc(nslots + 1, 1);
	if (!st->w || !st->expect || !st->covered) {
		free(st->w);
		free(st->expect);
		free(st->covered);
		free(st);
		return NULL;
	}
	return st;
}

static void staged_drop(struct jstaged *st)
{
	for (size_t i = 0; i < st->n; i++) {
		free(st->w[i].pos);
		free(st->w[i].val);
	}
	free(st->w);
	free(st->expect);
	free(st->covered);
	free(st->srcs);
	free(st);
}

/* Dense: tv[t] holds every value of tensor t.  On the read's worker. */
static struct jstaged *stage_dense(const struct dte_spec_tensor *tens, struct rsink *rs,
				   const uint16_t *const *tv)
{
	struct jstaged *st = staged_new(rs->np, rs->nslots);

	if (!st)
		return NULL;
	memset(rs->Pnew, 0, rs->nslots * sizeof(*rs->Pnew));
	for (size_t q = 0; q < rs->np; q++) {
		const struct dte_piece *p = &rs->lay.pieces[rs->piece[q]];
		const struct dte_spec_tensor *t = &tens[p->tensor];
		struct jwrite *w = &st->w[st->n++];
		int64_t idx[DTE_MAX_DIMS] = { 0 };
		uint64_t vol = (uint64_t)dte_piece_volume(p), k = 0;
		int last = (int)p->ndim - 1, d;

		w->dst_slot = (uint32_t)rs->slot[q];
		w->dense = 1;
		w->map = piece_map(p);
		w->n = vol;
		st->covered[rs->slot[q]] = 1;
		if (!vol)
			continue;
		if (!(w->val = malloc(vol * sizeof(*w->val)))) {
			staged_drop(st);
			return NULL;
		}
		for (;;) {
			int64_t flat = 0, dst = p->offset;

			for (d = 0; d < (int)p->ndim; d++) {
				int64_t ts = 1;

				for (int e = d + 1; e < (int)t->ndim; e++)
					ts *= t->shape[e];
				flat += (p->lo[d] + idx[d]) * ts;
				dst += idx[d] * p->stride[d];
			}
			w->val[k] = tv[p->tensor][flat];
			rs->Pnew[rs->slot[q]] += dtc_csum_term((uint64_t)dst, w->val[k]);
			k++;
			for (d = last; d >= 0 && ++idx[d] == p->hi[d] - p->lo[d]; d--)
				idx[d] = 0;
			if (d < 0)
				break;
		}
	}
	st->all_dense = 1;
	for (size_t i = 0; i < rs->nslots; i++)
		st->expect[i] = rs->Pnew[i];
	return st;
}

/* Sparse: the changed canonical elements that fall in this rank's pieces;
 * the old values come from the sink's buffers (bufs, by slot: the read
 * holds a reference on each).  On the read's worker. */
static struct jstaged *stage_sparse(const struct dte_spec_tensor *tens, struct rsink *rs,
				    struct dbuf *const *bufs, const struct dts_version *v,
				    char *err, size_t errlen)
{
	struct jstaged *st = staged_new(rs->np, rs->nslots);

	if (!st)
		return snprintf(err, errlen, "out of memory"), NULL;
	memcpy(rs->Pnew, rs->P, rs->nslots * sizeof(*rs->Pnew));
	for (size_t q = 0; q < rs->np; q++) {
		const struct dte_piece *p = &rs->lay.pieces[rs->piece[q]];
		const struct dte_spec_tensor *t = &tens[p->tensor];
		const struct dts_tensor_data *td = p->tensor < v->ntensors ? &v->t[p->tensor] : NULL;
		const struct dbuf *b = bufs[rs->slot[q]];
		const uint16_t *cur;
		struct jwrite *w = &st->w[st->n++];
		uint64_t n = 0;

		w->dst_slot = (uint32_t)rs->slot[q];
		w->map = piece_map(p);
		st->covered[rs->slot[q]] = 1;
		if (!td || !td->count)
			continue;
		if (!b) {
			snprintf(err, errlen, "buffer slot %zu gone", rs->slot[q]);
			goto fail;
		}
		cur = b->ptr;
		w->pos = malloc(td->count * sizeof(*w->pos));
		w->val = malloc(td->count * sizeof(*w->val));
		if (!w->pos || !w->val) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		for (uint64_t k = 0; k < td->count; k++) {
			int64_t c[DTE_MAX_DIMS], dst = p->offset, rel = 0;
			int d, in = 1;

			unravel(t, td->pos[k], c);
			for (d = 0; d < (int)p->ndim && in; d++)
				in = c[d] >= p->lo[d] && c[d] < p->hi[d];
			if (!in)
				continue;
			for (d = 0; d < (int)p->ndim; d++) {
				rel = rel * (p->hi[d] - p->lo[d]) + (c[d] - p->lo[d]);
				dst += (c[d] - p->lo[d]) * p->stride[d];
			}
			if (dst < 0 || (uint64_t)dst >= b->length) {
				snprintf(err, errlen, "tensor %u element %llu maps outside buffer %s",
					 p->tensor, (unsigned long long)td->pos[k], b->name);
				goto fail;
			}
			rs->Pnew[rs->slot[q]] += dtc_csum_term((uint64_t)dst, td->val[k]) -
						 dtc_csum_term((uint64_t)dst, cur[dst]);
			w->pos[n] = (uint64_t)rel;
			w->val[n++] = td->val[k];
		}
		w->n = n;
	}
	for (size_t i = 0; i < rs->nslots; i++)
		st->expect[i] = rs->Pnew[i];
	return st;
fail:
	staged_drop(st);
	return NULL;
}

static void reader_tick(struct jstore *s);

static void on_timer(void *arg)
{
	reader_tick(arg);
}

static void timer_update(struct jstore *s)
{
	int want = s->job && (s->staging >= 0 || s->pend >= 0 || s->pub >= 0);

	if (want && !s->timer_on)
		jio_timer_start(s->eng, s->timer, APPLY_POLL_MS, APPLY_POLL_MS);
	else if (!want && s->timer_on)
		jio_timer_stop(s->eng, s->timer);
	s->timer_on = want;
}

/* Every sink that had the staged version applied it (or went away): its
 * position is recorded by the next read, on its worker (s->ack). */
static int reader_resolve(struct jstore *s, struct job *j)
{
	struct jhist *h = jhist_find(j, (uint64_t)s->staging);

	for (struct rsink *rs = s->sinks; rs; rs = rs->next) {
		struct jlocal *l = job_local(j, rs->id);

		if (rs->state != READER_S_STAGED || !l)
			continue;
		switch (rsink_step(j, rs, reader_sm_apply_event(jsink_of(l)->applied,
								(uint64_t)s->staging,
								jsink_of(l)->checksum_failures,
								rs->fails0))) {
		case READER_A_WAIT:
			return 0;
		case READER_A_REPAIR:
			if (h)
				h->failed++;
			DLOG_W("job %s: sink %llx: storage v%lld failed its checksum; rebuilt "
			       "densely at the next version", j->name, (unsigned long long)rs->id,
			       (long long)s->staging);
			break;
		case READER_A_VERIFY:
			memcpy(rs->P, rs->Pnew, rs->nslots * sizeof(*rs->P));
			if (h)
				h->ok++;
			break;
		default:
			break;
		}
	}
	s->ack = s->rpos = s->staging;
	s->staging = -1;
	return 1;
}

static void reader_refused(struct jstore *s, struct job *j, int rc, const char *why)
{
	struct jhist *h = hist_add(j, (uint64_t)(s->rpos + 1));

	s->broken++;
	j->refused++;
	snprintf(s->error, sizeof(s->error), "%s: %.200s", dts_strerror(rc), why);
	snprintf(h->note, sizeof(h->note), "refused: %.80s", s->error);
	DLOG_W("job %s: storage version refused (%s): %s", j->name, dts_strerror(rc), why);
}

/* One look at the directory, on a worker (rread_run): recording the
 * position every sink applied, reading the next version (manifest,
 * chunks, zstd unpack, xxh3), rebuilding it from a keyframe for new or
 * repaired sinks, and staging it into each sink's pieces with the
 * predicted checksums.  Those take seconds for a large model; on the loop
 * they would stall every client and peer.  While it runs (s->rd) the loop
 * leaves the reader, the rsinks (layouts, P, Pnew), the tensor tables and
 * the store alone: reader_tick only notes that it was called, sinks that
 * come or go are seen when it is back, and a job deleted meanwhile leaves
 * the store to the read's completion (rread_done), which frees it.  The
 * read holds a reference on every sink buffer it reads; it comes back on
 * the loop, which looks each sink up again by id and hands it its staged
 * version.  Shutdown waits for it like any task (job_tasks_drain). */
struct ritem {
	struct rsink *rs;
	struct dbuf **bufs;        /* [rs->nslots], each referenced (or NULL) */
	int need_dense;            /* loop: the sink's table said stage it densely */
	int dense;                 /* worker: staged densely */
	int skipped;               /* worker: dense, but no rebuild to stage from */
	struct jstaged *st;        /* worker: the staged version, or NULL */
	char err[256];             /* worker: why not staged */
};

struct rread {
	struct jtask task;         /* first: the task is the read */
	struct jstore *s;
	int64_t ack;               /* position to record first, -1 none */
	struct ritem *it;
	size_t n;                  /* sinks to stage for; 0: only the ack */
	uint64_t t0;
	/* results, for the loop */
	int ack_rc;
	char ack_err[256];
	int rc;                    /* dts_reader_next's; DTS_EAGAIN when nothing read */
	char err[512];
	uint64_t version, changed, stored;
	int dense, oom, rebuild_rc;
	char rebuild_err[512];
};

static void rread_run(struct jtask *t)
{
	struct rread *r = (struct rread *)t;
	struct jstore *s = r->s;
	struct dts_version *v = NULL;
	uint16_t *flat = NULL;
	const uint16_t **tv = NULL;
	uint32_t nt = s->model.ntensors;

	r->rc = DTS_EAGAIN;
	if (r->ack >= 0)
		r->ack_rc = dts_reader_ack(s->r, (uint64_t)r->ack, r->ack_err, sizeof(r->ack_err));
	if (!r->n)
		return;
	/* Test builds only (job_ext.h): may hold the read here. */
	if (s->eng->ext.storage_read)
		s->eng->ext.storage_read((uint64_t)(dts_reader_position(s->r) + 1));
	r->rc = dts_reader_next(s->r, &v, r->err, sizeof(r->err));
	if (r->rc != DTS_OK)
		return;
	r->version = v->version;
	r->changed = v->changed;
	r->stored = v->stored;
	r->dense = v->dense;
	if (!(tv = calloc(nt + 1, sizeof(*tv)))) {
		r->oom = 1;
		goto out;
	}
	if (v->dense) {
		for (uint32_t k = 0; k < nt; k++)
			tv[k] = v->t[k].val;
	} else {
		for (size_t i = 0; i < r->n && !flat; i++) {
			if (!r->it[i].need_dense)
				continue;
			if (!(flat = malloc(s->toff[nt] * sizeof(*flat) + 2))) {
				r->oom = 1;
				goto out;
			}
			if ((r->rebuild_rc = rebuild(s, v->version, flat, r->rebuild_err,
						     sizeof(r->rebuild_err))) < 0)
				break;
			for (uint32_t k = 0; k < nt; k++)
				tv[k] = flat + s->toff[k];
		}
	}
	for (size_t i = 0; i < r->n; i++) {
		struct ritem *it = &r->it[i];

		it->dense = v->dense || it->need_dense;
		if (it->dense && nt && !tv[0]) {
			it->skipped = 1;	/* stays dense until a rebuild works */
			continue;
		}
		it->st = it->dense ? stage_dense(s->tens, it->rs, tv)
				   : stage_sparse(s->tens, it->rs, it->bufs, v, it->err,
						  sizeof(it->err));
		if (!it->st && !it->err[0])
			snprintf(it->err, sizeof(it->err), "out of memory");
		if (it->st)
			it->st->version = v->version;
	}
out:
	free(tv);
	free(flat);
	dts_version_free(v);
}

static void rread_free(struct rread *r)
{
	for (size_t i = 0; i < r->n; i++) {
		struct ritem *it = &r->it[i];

		for (size_t k = 0; it->bufs && k < it->rs->nslots; k++)
			if (it->bufs[k])
				dbuf_unref(it->bufs[k]);
		free(it->bufs);
		if (it->st)
			staged_drop(it->st);
	}
	free(r->it);
	free(r);
}

/* Back on the loop: hand each sink still there its staged version. */
static void rread_done(struct jtask *t, int cancelled)
{
	struct rread *r = (struct rread *)t;
	struct jstore *s = r->s;
	struct job *j = s->job;
	struct jhist *h;
	int staged = 0;

	s->rd = NULL;
	if (!j) {
		/* The job went while the read was out: the store is ours. */
		rread_free(r);
		store_destroy(s);
		return;
	}
	if (cancelled) {
		/* Never ran (shutdown): the position stays to record. */
		rread_free(r);
		return;
	}
	if (r->ack >= 0 && s->ack == r->ack)
		s->ack = -1;
	if (r->ack >= 0 && r->ack_rc)
		DLOG_W("job %s: storage: cannot record position v%lld: %s", j->name,
		       (long long)r->ack, r->ack_err);
	s->rpos = dts_reader_position(s->r);
	if (r->rc != DTS_OK) {
		if (r->rc != DTS_EAGAIN)
			reader_refused(s, j, r->rc, r->err);
		goto out;
	}
	if (r->rebuild_rc < 0)
		DLOG_W("job %s: storage: cannot rebuild v%llu for new or repaired sinks: %s",
		       j->name, (unsigned long long)r->version, r->rebuild_err);
	if (r->oom) {
		DLOG_E("job %s: storage: out of memory", j->name);
		goto out;
	}
	h = hist_add(j, r->version);
	h->changed = r->changed;
	h->bytes = r->stored;
	h->elements = s->toff[s->model.ntensors];
	h->t_captured = r->t0;
	j->published++;
	for (size_t i = 0; i < r->n; i++) {
		struct ritem *it = &r->it[i];
		struct rsink *rs = it->rs;
		struct jlocal *l = job_local(j, rs->id);

		if (!l)
			continue;	/* gone: sync_sinks frees it */
		switch (rsink_step(j, rs, reader_sm_read_event(it->skipped, it->st != NULL))) {
		case READER_A_HAND:
			break;
		case READER_A_NOT_STAGED:
			DLOG_E("job %s: sink %llx: storage v%llu not staged: %s", j->name,
			       (unsigned long long)rs->id, (unsigned long long)r->version, it->err);
			continue;
		default:
			continue;	/* skipped: still dense, it waits for a rebuild */
		}
		jsink_staged_hand(l, it->st);
		it->st = NULL;
		rs->fails0 = jsink_of(l)->checksum_failures;
		h->sinks++;
		if (it->dense)
			h->dense++;
		else
			h->sparse++;
		staged++;
	}
	if (r->dense)
		snprintf(h->note, sizeof(h->note), "keyframe v%llu", (unsigned long long)r->version);
	h->transfer_ms = job_ms_since(s->eng, h->t_captured);
	s->staging = (int64_t)r->version;
	if (!staged)
		s->rekick = 1;	/* nothing to wait for: move on */
	jwait_check(s->eng);
out:
	rread_free(r);
	timer_update(s);
	if (s->rekick) {
		s->rekick = 0;
		reader_tick(s);
	}
}

/* Hand the next look at the directory to a worker. */
static void reader_read(struct jstore *s, struct job *j)
{
	struct rread *r = calloc(1, sizeof(*r));
	size_t n = 0;

	for (struct rsink *rs = s->sinks; rs; rs = rs->next)
		n++;
	if (!r || !(r->it = calloc(n + 1, sizeof(*r->it)))) {
		free(r);
		DLOG_E("job %s: storage: out of memory", j->name);
		return;
	}
	for (struct rsink *rs = s->sinks; rs; rs = rs->next) {
		struct jlocal *l = job_local(j, rs->id);
		struct ritem *it = &r->it[r->n];

		if (!l)
			continue;
		if (!(it->bufs = calloc(rs->nslots + 1, sizeof(*it->bufs)))) {
			rread_free(r);
			DLOG_E("job %s: storage: out of memory", j->name);
			return;
		}
		it->rs = rs;
		it->need_dense = rsink_step(j, rs, READER_EV_READ) == READER_A_STAGE_DENSE;
		r->n++;
		for (size_t k = 0; k < rs->nslots && k < l->nbufs; k++)
			if ((it->bufs[k] = l->bufs[k]))
				dbuf_ref(it->bufs[k]);
	}
	r->s = s;
	r->ack = s->ack;
	r->t0 = jio_now(s->eng);
	r->task.run = rread_run;
	r->task.done = rread_done;
	s->rd = r;
	jtask_start(s->eng, &r->task);
}

static void relay_tick(struct jstore *s, struct job *j);

static void reader_tick(struct jstore *s)
{
	struct job *j = s->job;

	if (!j)
		return;
	if (s->src) {
		relay_tick(s, j);
		return;
	}
	if (s->rd) {
		s->rekick = 1;	/* looked at again when the read is back */
		return;
	}
	sync_sinks(s, j);
	if (s->staging >= 0 && !reader_resolve(s, j))
		goto out;
	if (!s->eng->stopping && (s->sinks || s->ack >= 0))
		reader_read(s, j);
out:
	if (s->job)
		timer_update(s);
}

static int reader_start(struct jstore *s, struct job *j, char *err, size_t errlen)
{
	struct dts_reader_cfg rc;
	const char *node = jio_self(s->eng);
	int e;

	memset(&rc, 0, sizeof(rc));
	rc.root = s->cfg.root;
	rc.job = j->name;
	rc.name = dts_job_name_ok(node) ? node : "dted";
	rc.model = s->model;
	if ((e = dts_reader_open(&s->r, &rc, err, errlen)))
		return dts_errno(e);
	s->staging = -1;
	s->rpos = dts_reader_position(s->r);
	if (!s->eng->io.timer_new)
		return 0;	/* unit tests without a loop: ticks never run */
	if (!(s->timer = s->eng->io.timer_new(s->eng->io.ctx, on_timer, s)))
		return derr_fail(err, errlen, -ENOMEM, "timer: cannot be made");
	if (s->eng->io.watch_new) {
		char dir[4096 + 160];

		snprintf(dir, sizeof(dir), "%s/%s", s->cfg.root, j->name);
		if ((e = s->eng->io.watch_new(s->eng->io.ctx, dir, s->cfg.watch_mode, WATCH_MS,
					      on_timer, s, &s->watch)) < 0)
			return derr_fail(err, errlen, e, "watching %s: %s", dir, strerror(-e));
	}
	DLOG_N("job %s: storage reader on %s/%s as \"%s\" (%s)", j->name, s->cfg.root, j->name,
	       rc.name, s->cfg.watch_mode == DTS_WATCH_POLL ? "polling" : "inotify");
	return 0;
}


/* ------------------------------------------------------- relay reader */

/* A relay reader (storage_role reader, transport both; docs/STORAGE.md,
 * "One reader per cluster") is the job's coordinator: it alone reads the
 * directory, and the cluster's sinks, on any daemon, are fed over UCX by
 * the source it holds.  That source is daemon-owned, like the writer's
 * canonical sink: the canonical layout (jstore_canonical_layout) over one
 * FP32 buffer, θ, holding the stored BF16 values exactly (an FP32
 * tensor's halves as its bits), and the job's detect is snapshot (no
 * optimizer state).  A read on a worker applies the versions the library
 * hands out, fully verified, to θ (a keyframe all of it, a delta its
 * positions), up to RELAY_BATCH of them; back on the loop the last one is
 * published (job_publish, as a trainer's); the engine then plans, sends,
 * relays and checks it like any version.  θ is written only between
 * captures: a read starts once the last publish's capture is over. */
struct rfeed {
	struct jtask task;         /* first: the task is the read */
	struct jstore *s;
	uint64_t t0;
	/* results, for the loop */
	uint32_t n;                /* versions applied to θ */
	uint64_t last;             /* the newest of them */
	uint64_t changed, stored;  /* elements given, chunk bytes read */
	int dense;                 /* one of them was a keyframe */
	int rc;                    /* the last dts_reader_next's; DTS_EAGAIN: nothing more */
	char err[512];
	int ack_rc;                /* recording the position */
	char ack_err[256];
};

/* One verified version into θ: BF16 values widened (exact), an FP32
 * tensor's halves stored as the 16-bit units of its elements. */
static void relay_apply(const struct jstore *s, const struct dts_version *v)
{
	float *th = s->theta->ptr;

	for (uint32_t t = 0; t < v->ntensors && t < s->model.ntensors; t++) {
		const struct dts_tensor_data *td = &v->t[t];
		uint64_t n = v->dense ? s->numel[t] : td->count;

		if (s->halves[t]) {
			uint16_t *u = (uint16_t *)(th + s->foff[t]);

			for (uint64_t q = 0; q < n; q++)
				u[v->dense ? q : td->pos[q]] = td->val[q];
		} else {
			float *f = th + s->foff[t];

			for (uint64_t q = 0; q < n; q++)
				f[v->dense ? q : td->pos[q]] = dtc_bf16_f32(td->val[q]);
		}
	}
}


static void rfeed_run(struct jtask *t)
{
	struct rfeed *f = (struct rfeed *)t;
	struct jstore *s = f->s;

	/* Test builds only (job_ext.h): may hold the read here. */
	if (s->eng->ext.storage_read)
		s->eng->ext.storage_read((uint64_t)(dts_reader_position(s->r) + 1));
	for (f->rc = DTS_EAGAIN; f->n < RELAY_BATCH;) {
		struct dts_version *v = NULL;

		if ((f->rc = dts_reader_next(s->r, &v, f->err, sizeof(f->err))) != DTS_OK)
			break;
		relay_apply(s, v);
		f->n++;
		f->last = v->version;
		f->changed += v->changed;
		f->stored += v->stored;
		f->dense |= v->dense;
		dts_version_free(v);
		/* θ holds it: the reader's position (retention keeps what a
		 * registered reader still needs; a restarted relay starts
		 * again from the newest keyframe). */
		if ((f->ack_rc = dts_reader_ack(s->r, f->last, f->ack_err, sizeof(f->ack_err))))
			break;
	}
}

static void rfeed_done(struct jtask *t, int cancelled)
{
	struct rfeed *f = (struct rfeed *)t;
	struct jstore *s = f->s;
	struct job *j = s->job;

	s->fd = NULL;
	if (!j) {
		/* The job went while the read was out: the store is ours. */
		free(f);
		store_destroy(s);
		return;
	}
	s->rpos = dts_reader_position(s->r);
	if (!cancelled) {
		if (f->ack_rc)
			DLOG_W("job %s: storage: cannot record position v%llu: %s", j->name,
			       (unsigned long long)f->last, f->ack_err);
		if (f->rc != DTS_OK && f->rc != DTS_EAGAIN)
			reader_refused(s, j, f->rc, f->err);
		if (f->n) {
			s->pend = (int64_t)f->last;
			s->relay_reads += f->n;
			s->relay_bytes += f->stored;
			DLOG_I("job %s: storage relay: read %u version%s up to v%llu (%llu elements, "
			       "%llu stored bytes%s) in %.1f ms", j->name, f->n, f->n == 1 ? "" : "s",
			       (unsigned long long)f->last, (unsigned long long)f->changed,
			       (unsigned long long)f->stored, f->dense ? ", a keyframe" : "",
			       job_ms_since(s->eng, f->t0));
		}
	}
	free(f);
	relay_tick(s, j);
}

static void relay_read(struct jstore *s, struct job *j)
{
	struct rfeed *f = calloc(1, sizeof(*f));

	if (!f) {
		DLOG_E("job %s: storage: out of memory", j->name);
		return;
	}
	f->s = s;
	f->t0 = s->read_at = jio_now(s->eng);
	f->task.run = rfeed_run;
	f->task.done = rfeed_done;
	s->fd = f;
	jtask_start(s->eng, &f->task);
}

/* Whether the plan has been unchanged for RELAY_SETTLE_MS (the members of
 * a restarted relay rejoin within a few ms of each other): a version sent
 * to the sinks planned so far reaches no sink planned a moment later. */
static int relay_settled(struct jstore *s, const struct job *j)
{
	if (j->epoch != s->seen_epoch) {
		s->seen_epoch = j->epoch;
		s->seen_at = jio_now(s->eng);
		return 0;
	}
	return job_ms_since(s->eng, s->seen_at) >= RELAY_SETTLE_MS;
}

/* The source publishes what θ holds, as a trainer would (async: the
 * capture runs on a worker, relay_tick sees it end).  No optimizer: one
 * group, nothing stepped (detect = snapshot reads no hyper-parameter; the
 * capture only wants a group per entry).  again: the version published
 * last, to the pairs never sent it (jpublish_args.again). */
static int relay_source_publish(struct jstore *s, struct job *j, uint64_t version, int64_t step,
				int again, char *err, size_t errlen)
{
	struct jhparams g = { .lr = 0, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
			      .unchanged = 1 };
	struct jpublish_args a = { .job = j->name, .participant = s->src, .version = version,
				   .step = step, .groups = &g, .n_groups = 1, .async = 1,
				   .again = again };
	struct jreq rq = { .conn = s->owner };
	struct jpublish_res rep;
	int deferred;

	memset(&rep, 0, sizeof(rep));
	return job_publish(s->eng, &rq, &a, &rep, &deferred, err, errlen);
}

/* Publish what was read.  0 while the source is not planned yet, is still
 * busy, or (no sink had the last one: a relay just started, or one whose
 * sinks all left) the plan has no sinks or has not settled (asked again
 * at the next tick). */
static int relay_publish(struct jstore *s, struct job *j, struct jlocal *l)
{
	size_t fed = 0;
	char err[512];
	int rc;

	if (!l->announced || !j->complete)
		return 0;
	for (size_t i = 0; i < j->npairs; i++)
		fed += j->pairs[i].src == s->src;
	if (!s->fed && (!relay_settled(s, j) || !fed))
		return 0;
	rc = relay_source_publish(s, j, (uint64_t)s->pend, s->step + 1, 0, err, sizeof(err));
	if (rc == -EBUSY)
		return 0;
	if (rc < 0) {
		/* Not sent: θ keeps it, the next version's snapshot compare
		 * sends what changed since the last one sent. */
		DLOG_W("job %s: storage relay: v%lld not published: %s", j->name,
		       (long long)s->pend, err);
		s->pend = -1;
		s->last = -1;	/* θ holds no version published: none again */
		return 1;
	}
	s->step++;
	s->fed = fed;
	s->pub = s->last = s->pend;
	s->pend = -1;
	return 1;
}

/* Sinks planned since the last publish (a replica that joined, one a
 * restart or a re-plan gave a new pair) would otherwise wait for the
 * writer's next version: θ still holds the last one, so it is published
 * again to them alone (their pairs' first version, dense), once the plan
 * has settled.  1 when a capture started. */
static int relay_again(struct jstore *s, struct job *j, struct jlocal *l)
{
	size_t unsent = 0;
	char err[512];

	if (s->last < 0 || !l->announced || !j->complete)
		return 0;
	for (size_t i = 0; i < j->npairs; i++)
		unsent += j->pairs[i].src == s->src && j->pairs[i].sm.last_sent < (uint64_t)s->last;
	if (!unsent || !relay_settled(s, j))
		return 0;
	if (relay_source_publish(s, j, (uint64_t)s->last, s->step, 1, err, sizeof(err)) < 0) {
		DLOG_W("job %s: storage relay: v%lld again to %zu new sink pair%s: %s", j->name,
		       (long long)s->last, unsent, unsent == 1 ? "" : "s", err);
		return 0;
	}
	DLOG_I("job %s: storage relay: v%lld again, to the %zu sink pair%s planned since", j->name,
	       (long long)s->last, unsent, unsent == 1 ? "" : "s");
	s->pub = s->last;
	return 1;
}

/* The relay reader's turn: the last capture over, publish what was read,
 * then read on. */
static void relay_tick(struct jstore *s, struct job *j)
{
	struct jlocal *l = job_local(j, s->src);

	if (s->fd) {
		s->rekick = 1;	/* looked at again when the read is back */
		return;
	}
	if (!l)
		return;	/* the job is going */
	if (s->pub >= 0) {
		struct jpublish_res rep;
		char err[512];
		int rc = jsrc_captured(j, l, (uint64_t)s->pub, &rep, err, sizeof(err));

		if (!rc)
			goto out;	/* θ is still read */
		if (rc < 0)
			DLOG_W("job %s: storage relay: v%lld: %s", j->name, (long long)s->pub, err);
		s->pub = -1;
	}
	/* A version waiting for sinks (relay_publish) may be overtaken by
	 * newer ones: θ is not read meanwhile, so reads go on, at the
	 * watch's pace rather than the timer's. */
	if (s->pend >= 0 && !relay_publish(s, j, l) &&
	    job_ms_since(s->eng, s->read_at) < WATCH_MS)
		goto out;
	if (s->pend < 0 && s->pub < 0 && relay_again(s, j, l))
		goto out;
	if (s->pub < 0 && !s->eng->stopping)
		relay_read(s, j);
out:
	s->rekick = 0;
	timer_update(s);
}

static int relay_start(struct jstore *s, struct job *j, char *err, size_t errlen)
{
	struct dte_layout lay;
	struct jlocal *l;
	uint64_t total;
	int e;

	if ((e = reader_start(s, j, err, errlen)) < 0)
		return e;
	if ((e = jstore_canonical_layout(&j->spec, JROLE_SOURCE, &lay, err, errlen)) < 0)
		return e;
	total = (uint64_t)lay.bufs[0].length;
	if (!(s->foff = calloc(j->spec.n + 1, sizeof(*s->foff))) ||
	    !(s->halves = calloc(j->spec.n + 1, 1))) {
		dte_layout_fini(&lay);
		return derr_fail(err, errlen, -ENOMEM, "out of memory");
	}
	/* Where θ holds each tensor: its piece's offset (piece t is tensor t;
	 * an FP32 tensor's in 16-bit units, dte_piece_units). */
	for (uint32_t t = 0; t < j->spec.n; t++) {
		s->halves[t] = dte_piece_units(&lay, &j->spec, &lay.pieces[t]) == 2;
		s->foff[t] = (uint64_t)lay.pieces[t].offset / (s->halves[t] ? 2 : 1);
	}
	dte_layout_fini(&lay);
	/* θ lives in a sealed memfd like a trainer's (its pages are the
	 * captures' to read). */
	if ((e = canon_buffer(s, total, DBUF_FP32, "storage relay", &s->theta, err, errlen)) < 0)
		return e;
	if (!(l = jlocal_new(JROLE_SOURCE, 1)))
		return derr_fail(err, errlen, -ENOMEM, "out of memory");
	s->src = canon_link(s, j, l, s->theta);
	s->pend = s->pub = s->last = -1;
	DLOG_N("job %s: storage relay reader: one read of %s/%s feeds the job's sinks over UCX "
	       "(source %llx, %llu FP32 elements)", j->name, s->cfg.root, j->name,
	       (unsigned long long)s->src, (unsigned long long)total);
	job_send_join(j);
	reader_tick(s);
	return 0;
}

/* ----------------------------------------------------------- lifecycle */

int jstore_start(struct job *j, const struct jstore_cfg *cfg, char *err, size_t errlen)
{
	struct jstore *s;
	int rc;

	if (cfg->transport == JSTORE_UCX)
		return 0;
	if (!(s = calloc(1, sizeof(*s))) ||
	    !(s->toff = calloc(j->spec.n + 1, sizeof(*s->toff))) ||
	    !(s->numel = calloc(j->spec.n + 1, sizeof(*s->numel)))) {
		if (s)
			free(s->toff);
		free(s);
		return derr_fail(err, errlen, -ENOMEM, "out of memory");
	}
	s->cfg = *cfg;
	s->eng = j->eng;
	s->job = j;
	s->ack = -1;
	snprintf(s->jname, sizeof(s->jname), "%s", j->name);
	if (j->spec.n && !(s->tens = malloc(j->spec.n * sizeof(*s->tens)))) {
		free(s->toff);
		free(s->numel);
		free(s);
		return derr_fail(err, errlen, -ENOMEM, "out of memory");
	}
	if (j->spec.n)
		memcpy(s->tens, j->spec.t, j->spec.n * sizeof(*s->tens));
	for (uint32_t t = 0; t < j->spec.n; t++) {
		s->numel[t] = (uint64_t)j->spec.t[t].numel;
		s->toff[t + 1] = s->toff[t] + s->numel[t];
	}
	s->model.spec_hash = j->spec.hash;
	s->model.ntensors = j->spec.n;
	s->model.numel = s->numel;
	s->staging = -1;
	j->store = s;
	s->pend = s->pub = s->last = -1;
	if ((rc = cfg->relay ? (j->is_coord ? relay_start(s, j, err, errlen) : 0) :
		  cfg->reader ? reader_start(s, j, err, errlen) :
		  j->is_coord ? writer_start(s, j, err, errlen) : 0) < 0) {
		jstore_free(j);
		return rc;
	}
	return 0;
}

static void store_destroy(struct jstore *s)
{
	if (s->w)
		dts_writer_close(s->w);
	if (s->owner)
		dbuf_release_owner(s->owner);
	if (s->r && s->ack >= 0) {
		/* Applied everywhere, and no read came to record it: here
		 * (one small file, at the job's end). */
		char err[256];

		if (dts_reader_ack(s->r, (uint64_t)s->ack, err, sizeof(err)))
			DLOG_W("job %s: storage: cannot record position v%lld: %s", s->jname,
			       (long long)s->ack, err);
	}
	dts_reader_close(s->r);
	while (s->sinks) {
		struct rsink *rs = s->sinks;

		s->sinks = rs->next;
		rsink_free(rs);
	}
	free(s->toff);
	free(s->numel);
	free(s->tens);
	free(s->foff);
	free(s->halves);
	s->toff = NULL;
	s->numel = NULL;
	s->tens = NULL;
	/* The I/O's handles: no callback comes after their free (their
	 * memory is the I/O's, released once it lets go of them). */
	if (s->watch)
		s->eng->io.watch_free(s->eng->io.ctx, s->watch);
	if (s->timer)
		s->eng->io.timer_free(s->eng->io.ctx, s->timer);
	free(s);
}

void jstore_free(struct job *j)
{
	struct jstore *s = j->store;

	if (!s)
		return;
	j->store = NULL;
	s->job = NULL;
	/* A read or a commit on a worker uses the reader or the writer, the
	 * mirror and the tensor tables: its completion (rread_done,
	 * commit_after) frees the store once it is back, on the loop.  Job
	 * deletion does not wait for it; shutdown does (job_tasks_drain). */
	if (s->rd || s->wc || s->fd)
		return;
	store_destroy(s);
}


void jstore_info(const struct job *j, struct jjob_info *rep)
{
	const struct jstore *s = j->store;

	rep->transport = jstore_transport_name(s ? s->cfg.transport : JSTORE_UCX);
	if (!s)
		return;
	rep->storage_root = s->cfg.root;
	/* A relay reader's job: its coordinator reads ("relay reader"), the
	 * other daemons' sinks are fed over UCX ("relay member"). */
	rep->storage_role = s->cfg.relay ? (s->src ? "relay reader" : "relay member") :
			    s->cfg.reader ? "reader" : "writer";
	rep->storage_head = s->w ? s->head : s->r ? s->rpos : -1;
	rep->storage_broken = s->broken;
	rep->storage_error = s->error;
}
