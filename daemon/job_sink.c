/* daemon/job_sink.c — the sink side: collect COUNTS and PAYLOADs per
 * version, decode them (every position checked against its entry) into
 * staging, and apply staged versions in order when the client asks,
 * verifying each buffer's checksum against the sum of the partials.
 *
 * A version is staged whole or not at all: a sparse pair must build on
 * exactly the version the sink holds (staged or applied last), otherwise
 * the version is refused (APPLIED base_mismatch) and the sources repair
 * densely.  A version that is dense from every source supersedes what is
 * staged before it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_cuda.h"
#include "daemon/job_ext.h"
#include "daemon/job_sink.h"
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

/* Apply on arrival (the section at the end of this file). */
struct jaswap {
	uint64_t src;
	uint32_t part, first, entries;
	uint8_t *data;            /* the part as received (owned); values swapped in place */
	size_t len;
	struct jentry *e;         /* copies of its entries */
	uint64_t *cnt;            /* their counts */
	uint32_t *slot;           /* their sink buffer slots */
	/* the entries swapped in so far, in order: index, payload offset, length */
	uint32_t *eidx;
	uint64_t *eoff, *elen;
	uint32_t nswapped;
	size_t voff;              /* the raw view's offset in data */
	int dense;                /* a dense part: every entry its whole box */
};

void jsink_staged_free(struct jstaged *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->w[i].pos);
		free(s->w[i].val);
	}
	for (size_t i = 0; i < s->nheld; i++)
		recvpool_free(s->held[i]);
	free(s->held);
	free(s->isum);
	free(s->w);
	free(s->expect);
	free(s->covered);
	free(s->srcs);
	free(s);
}

/* What applying st needs, once applied: its writes' payload bytes and
 * decoded arrays (maps, partials and sources stay). */
static void staged_drop_data(struct jstaged *st)
{
	for (size_t i = 0; i < st->n; i++) {
		free(st->w[i].pos);
		free(st->w[i].val);
		st->w[i].pos = NULL;
		st->w[i].val = NULL;
		st->w[i].enc = NULL;
		st->w[i].enc_len = 0;
	}
	for (size_t i = 0; i < st->nheld; i++)
		recvpool_free(st->held[i]);
	st->nheld = 0;
}

void jsink_pend_src_clear(struct jpend_src *s)
{
	if (s->counts)
		dtep__counts__free_unpacked(s->counts, NULL);
	s->counts = NULL;
	for (size_t k = 0; k < s->nparts; k++) {
		recvpool_free(s->parts[k].data);
		free(s->parts[k].cnt);
	}
	free(s->parts);
	s->parts = NULL;
	s->nparts = s->cap = 0;
	s->bytes = 0;
}

void jsink_pend_free(struct jpend *p)
{
	for (size_t i = 0; i < p->n; i++)
		jsink_pend_src_clear(&p->s[i]);
	free(p->s);
	free(p);
}

void jsink_pend_drop(struct jlocal *l, struct jpend *p)
{
	for (struct jpend **pp = &jsink_of(l)->pend; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	jsink_pend_free(p);
}

/* One transition of version v at sink l: the table (sink_sm.c, docs/SYNC.md
 * "A version at a sink") decides, the caller only executes the action it
 * returns.  A cell the table marks "—" (the event cannot reach that state)
 * is logged as a daemon bug and the caller does nothing. */
enum sink_vaction sink_decide(const struct jlocal *l, uint64_t v, enum sink_vstate s,
			      enum sink_vevent ev)
{
	struct sink_step d = sink_sm_step(s, ev);

	if (d.act == SINK_A_NONE)
		DLOG_E("sink %llx version %llu: event %d in state %s has no transition (bug)",
		       (unsigned long long)l->info.id, (unsigned long long)v, (int)ev,
		       sink_sm_state_name(s));
	else
		DLOG_D("sink %llx version %llu: %s -> %s (%s)", (unsigned long long)l->info.id,
		       (unsigned long long)v, sink_sm_state_name(s), sink_sm_state_name(d.next),
		       sink_sm_action_name(d.act));
	return d.act;
}

/* The state the sink's fields give version v, before its pending version
 * is looked up (jsink_pend_state, after). */
enum sink_vstate jsink_vstate(struct jlocal *l, uint64_t v)
{
	const struct jsink *k = jsink_of(l);
	struct sink_view w = { .held = k->held, .staging = k->staging, .applying = k->applying,
			       .applied = k->applied, .failed = k->failed };

	for (const struct jstaged *st = k->staged; st && !w.chained; st = st->next)
		w.chained = st->version == v;
	for (const struct jpend *p = k->pend; p && !w.pending; p = p->next)
		if (p->version == v)
			w.pending = p->refused ? 2 : 1;
	if (k->arrive) {
		w.arrive = k->arrive->version;
		w.arrive_state = k->arrive->state;
	}
	return sink_sm_state(&w, v);
}

/* A pending version's state: collecting, or refused (kept without data). */
enum sink_vstate jsink_pend_state(const struct jpend *p)
{
	return p->refused ? SINK_V_REFUSED : SINK_V_COLLECTING;
}

/* An APPLIED held back (the storage writer's sink, struct jwriter). */
struct japplied {
	uint64_t version;
	uint64_t *srcs;
	size_t nsrcs;
	Dtep__ApplyResult result;
	char why[256];
	double ms;
};

void jsink_japplied_free(struct japplied *a)
{
	if (a) {
		free(a->srcs);
		free(a);
	}
}

int jsink_make_writer(struct jlocal *l)
{
	struct jsink *k = jsink_of(l);

	if (!k->w && !(k->w = calloc(1, sizeof(*k->w))))
		return -ENOMEM;
	return 0;
}

void jsink_free(struct dte_engine *e, struct jlocal *l)
{
	struct jsink *k = jsink_of(l);

	if (k->w) {
		jsink_japplied_free(k->w->deferred);
		free(k->w);
		k->w = NULL;
	}
	if (k->arrive) {
		struct jarrive *a = k->arrive;

		/* Every cell: → gone, the swaps undone (undo, continue,
		 * drain): on a worker, or here at shutdown once the workers
		 * are drained (the engine never finds a torn version). */
		(void)sink_decide(l, a->version, a->state,
				  e->stopping ? SINK_EV_SHUTDOWN : SINK_EV_DETACHED);
		k->arrive = NULL;
		jsink_arrive_orphan(a);
	}
	jops_sink_free(e, l);
	recvpool_retire(k->rpool);
	k->rpool = NULL;
	free(k->vsum);
	k->vsum = NULL;
	k->vkey = 0;
	while (k->pend) {
		struct jpend *p = k->pend;

		k->pend = p->next;
		if (sink_decide(l, p->version, jsink_pend_state(p), SINK_EV_DETACHED) ==
		    SINK_A_FREE)
			jsink_pend_free(p);
	}
	while (k->staged) {
		struct jstaged *s = k->staged;

		k->staged = s->next;
		if (sink_decide(l, s->version, SINK_V_STAGED, SINK_EV_DETACHED) == SINK_A_FREE)
			jsink_staged_free(s);
	}
}

uint64_t jsink_newest_staged(const struct jlocal *l)
{
	const struct jsink *k = jsink_cof(l);
	const struct jstaged *s = k->staged;

	while (s && s->next)
		s = s->next;
	/* A version on its way into the buffers (an apply on a worker) is
	 * held too. */
	return s ? s->version : k->applying ? k->applying : k->applied;
}

/* The memory a dense version of l lands in, populated ahead
 * (recvpool.h): its payload is the sink's BF16 elements plus each entry's
 * framing (8 bytes, a part header of 32 at most per entry, 64 of
 * alignment): 2 bytes per element of its host buffers and 1/32 more cover
 * models whose entries are over 3 KiB; past the arena, payloads are
 * malloc'ed.  A fresh sink gets one at attach (job.c: its first version
 * is dense). */
struct recvpool *jsink_arena(const struct jlocal *l)
{
	size_t bytes = 0;

	for (size_t i = 0; i < l->nbufs; i++) {
		const struct dbuf *b = l->bufs[i];

		if (b && !b->cuda && b->map)
			bytes += 2 * b->length;	/* BF16 on the wire, whatever it holds */
	}
	return bytes ? recvpool_prepare(bytes + bytes / 32 + ((size_t)1 << 20)) : NULL;
}

/* The arena the sink's next version lands in (recvpool.h): the one it
 * had is retired (it goes once its last piece is back: bump-allocated,
 * it serves one version), and a new one is populated ahead when the next
 * version is likely dense. */
void jsink_arena_next(struct job *j, struct jlocal *l, int dense_next)
{
	struct jsink *k = jsink_of(l);

	if (k->rpool || dense_next)
		DLOG_D("job %s: sink %llx: receive arena %s", j->name,
		       (unsigned long long)l->info.id,
		       dense_next ? "populated for a dense version next" : "retired");
	recvpool_retire(k->rpool);
	k->rpool = dense_next ? jsink_arena(l) : NULL;
}

void jsink_replanned(struct job *j)
{
	for (struct jlocal *l = j->locals; l; l = l->next) {
		struct jpend *p, *next;

		if (l->info.role != JROLE_SINK)
			continue;
		for (p = jsink_of(l)->pend; p; p = next) {
			next = p->next;
			if (p->epoch == j->epoch)
				continue;
			if (jsink_of(l)->arrive && jsink_of(l)->arrive->version == p->version) {
				/* undone (the sources refuse it anyway) */
				jsink_arrive_event(j, l, SINK_EV_REPLAN,
						   DTEP__APPLY_RESULT__APPLY_REFUSED, "re-planned");
				if (!jsink_of(l)->arrive ||
				    jsink_of(l)->arrive->state != SINK_V_RETREATING)
					jsink_pend_drop(l, p);
				continue;
			}
			if (sink_decide(l, p->version, jsink_pend_state(p), SINK_EV_REPLAN) ==
			    SINK_A_FREE)
				jsink_pend_drop(l, p);
		}
	}
}

/* One APPLIED per source daemon of the sink. */
void jsink_send_applied(struct job *j, struct jlocal *l, uint64_t version, const uint64_t *srcs,
			size_t nsrcs, Dtep__ApplyResult result, const char *msg, double ms)
{
	Dtep__Applied m = DTEP__APPLIED__INIT;
	Dtep__JobRef ref;
	const char *sent[64];
	size_t nsent = 0;

	job_fill_ref(j, &ref);
	m.job = &ref;
	m.version = version;
	m.dst = l->info.id;
	m.result = result;
	m.message = (char *)(msg ? msg : "");
	m.apply_ms = ms;
	for (size_t i = 0; i < nsrcs; i++) {
		const struct jpinfo *p = job_part(j, srcs[i]);
		size_t k;

		if (!p)
			continue;
		for (k = 0; k < nsent && strcmp(sent[k], p->node); k++)
			;
		if (k < nsent)
			continue;
		if (nsent < 64)
			sent[nsent++] = p->node;
		job_send_to_node(j, p->node, DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED, &m.base, NULL, 0);
	}
}

void jsink_send_deferred(struct job *j, struct jlocal *l)
{
	struct jwriter *w = jsink_of(l)->w;
	struct japplied *a = w ? w->deferred : NULL;

	if (!a)
		return;
	w->deferred = NULL;
	jsink_send_applied(j, l, a->version, a->srcs, a->nsrcs, a->result, a->why, a->ms);
	jsink_japplied_free(a);
}

/* Send an APPLIED now, or hold it for jsink_send_deferred() (one held
 * before it, not yet sent, goes first). */
void jsink_applied_or_defer(struct job *j, struct jlocal *l, uint64_t version,
			    const uint64_t *srcs, size_t nsrcs, Dtep__ApplyResult result,
			    const char *why, double ms)
{
	struct jwriter *w = jsink_of(l)->w;
	struct japplied *a;

	if (!w || !(a = calloc(1, sizeof(*a))) ||
	    !(a->srcs = malloc((nsrcs ? nsrcs : 1) * sizeof(*srcs)))) {
		if (w) {
			free(a);
			jsink_send_deferred(j, l);
		}
		jsink_send_applied(j, l, version, srcs, nsrcs, result, why, ms);
		return;
	}
	a->version = version;
	memcpy(a->srcs, srcs, nsrcs * sizeof(*srcs));
	a->nsrcs = nsrcs;
	a->result = result;
	snprintf(a->why, sizeof(a->why), "%s", why ? why : "");
	a->ms = ms;
	jsink_send_deferred(j, l);
	w->deferred = a;
}

void jsink_refuse_version(struct job *j, struct jlocal *l, struct jpend *p,
			  Dtep__ApplyResult result, const char *why)
{
	uint64_t *srcs = calloc(p->n ? p->n : 1, sizeof(*srcs));

	DLOG_W("job %s: sink %llx refuses version %llu: %s", j->name,
	       (unsigned long long)l->info.id, (unsigned long long)p->version, why);
	j->refused++;
	dmetrics_add(DM_REFUSED, result == DTEP__APPLY_RESULT__APPLY_BASE_MISMATCH ?
		     "base_mismatch" : "bad_payload", 1);
	if (srcs) {
		for (size_t i = 0; i < p->n; i++)
			srcs[i] = p->s[i].src;
		jsink_send_applied(j, l, p->version, srcs, p->n, result, why, 0);
	}
	free(srcs);
}

/* A version refused while its records still arrive: what it held goes,
 * the entry stays (no data) so later parts of it are dropped, until a
 * newer version is staged or the pending cap takes it. */
void jsink_pend_refuse_exec(struct job *j, struct jlocal *l, struct jpend *p, const char *why)
{
	jsink_refuse_version(j, l, p, DTEP__APPLY_RESULT__APPLY_REFUSED, why);
	for (size_t i = 0; i < p->n; i++)
		jsink_pend_src_clear(&p->s[i]);
	p->refused = 1;
}

static void pend_refuse(struct job *j, struct jlocal *l, struct jpend *p, const char *why)
{
	if (jsink_of(l)->arrive && jsink_of(l)->arrive->version == p->version) {
		jsink_arrive_event(j, l, SINK_EV_CONTRADICTS, DTEP__APPLY_RESULT__APPLY_REFUSED,
				   why);
		return;
	}
	switch (sink_decide(l, p->version, jsink_pend_state(p), SINK_EV_CONTRADICTS)) {
	case SINK_A_REFUSE:
		jsink_pend_refuse_exec(j, l, p, why);
		break;
	default:	/* refused already: dropped */
		break;
	}
}

/* Whether one source's records so far agree with each other: 0, or -1
 * with why.  Parts may come before their COUNTS, so this runs on every
 * arrival; duplicates are caught when a part is added. */
static int pend_src_check(const struct jpend_src *s, char *why, size_t whylen)
{
	const Dtep__Counts *c = s->counts;

	if (!c)
		return 0;
	if (s->nparts > c->parts || s->bytes > c->payload_bytes ||
	    (s->nparts == c->parts && s->bytes != c->payload_bytes)) {
		snprintf(why, whylen, "source %llx: %zu parts of %llu bytes, COUNTS names %u of %llu",
			 (unsigned long long)s->src, s->nparts, (unsigned long long)s->bytes, c->parts,
			 (unsigned long long)c->payload_bytes);
		return -EPROTO;
	}
	for (size_t k = 0; k < s->nparts; k++) {
		const struct jpart *pt = &s->parts[k];

		if (pt->part >= c->parts) {
			snprintf(why, whylen, "source %llx: part %u past the %u COUNTS names",
				 (unsigned long long)s->src, pt->part, c->parts);
			return -EPROTO;
		}
		/* A part that described itself (PAYLOAD.counts) must say what
		 * COUNTS says: it may already be in the buffers. */
		if (!pt->cnt)
			continue;
		if (c->mode != (Dtep__Mode)pt->mode ||
		    (c->mode == DTEP__MODE__MODE_SPARSE && c->base_version != pt->base) ||
		    (uint64_t)pt->first + pt->entries > c->n_counts ||
		    memcmp(pt->cnt, c->counts + pt->first, pt->entries * sizeof(*pt->cnt))) {
			snprintf(why, whylen, "source %llx: part %u's counts or base contradict its "
				 "COUNTS", (unsigned long long)s->src, pt->part);
			return -EPROTO;
		}
	}
	return 0;
}

int jsink_pend_complete(const struct jpend *p)
{
	if (p->refused)
		return 0;
	for (size_t i = 0; i < p->n; i++) {
		const struct jpend_src *s = &p->s[i];

		if (!s->counts || s->nparts != s->counts->parts || s->bytes != s->counts->payload_bytes)
			return 0;
	}
	return 1;
}

int jsink_pend_all_dense(const struct jpend *p)
{
	for (size_t i = 0; i < p->n; i++)
		if (!p->s[i].counts || p->s[i].counts->mode != DTEP__MODE__MODE_DENSE)
			return 0;
	return 1;
}

uint32_t jsink_staged_cap(const struct dte_engine *e)
{
	return e->max_staged ? e->max_staged : JOB_MAX_STAGED_DEFAULT;
}

static struct jpend *pend_get(struct job *j, struct jlocal *l, uint64_t version)
{
	struct jpend *p, *oldest = NULL;
	size_t n = 0;

	for (p = jsink_of(l)->pend; p; p = p->next) {
		if (p->version == version)
			return p;
		if ((!oldest || p->version < oldest->version) &&
		    !(jsink_of(l)->arrive && jsink_of(l)->arrive->version == p->version))
			oldest = p;	/* the version on arrival is never the one dropped */
		n++;
	}
	/* Versions still arriving count against the staging cap too: parts
	 * of a capture that failed (no COUNTS ever comes) or of versions a
	 * peer invents cannot pile up. */
	if (n >= jsink_staged_cap(j->eng) && oldest &&
	    sink_decide(l, oldest->version, jsink_pend_state(oldest), SINK_EV_CAP) ==
		    SINK_A_DROP_COUNTED) {
		DLOG_W("job %s: sink %llx: %zu versions pending, version %llu dropped incomplete",
		       j->name, (unsigned long long)l->info.id, n,
		       (unsigned long long)oldest->version);
		jsink_of(l)->staging_drops++;
		jsink_pend_drop(l, oldest);
	}
	n = 0;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	for (size_t i = 0; i < j->npairs; i++)
		n += j->pairs[i].dst == l->info.id;
	p->s = calloc(n ? n : 1, sizeof(*p->s));
	if (!p->s) {
		free(p);
		return NULL;
	}
	for (size_t i = 0; i < j->npairs; i++)
		if (j->pairs[i].dst == l->info.id)
			p->s[p->n++].src = j->pairs[i].src;
	p->version = version;
	p->epoch = j->epoch;
	p->next = jsink_of(l)->pend;
	jsink_of(l)->pend = p;
	return p;
}

struct jpend_src *jsink_pend_src(struct jpend *p, uint64_t src)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->s[i].src == src)
			return &p->s[i];
	return NULL;
}

uint64_t jsink_get64(const uint8_t *p)
{
	uint64_t x = 0;

	for (int b = 0; b < 8; b++)
		x |= (uint64_t)p[b] << (8 * b);
	return x;
}

/* A version being staged on a worker (jsink_try_stage starts it, stage_done
 * finishes it on the loop).  It owns the collected records (the jpend,
 * unlinked from the sink) and copies of what decoding reads of the sink
 * and the plan, so a detach or re-plan meanwhile cannot reach it. */
struct jstage {
	struct jtask t;
	char job[JOB_NAME_MAX];
	uint64_t participant;
	struct jpend *p;
	struct jentry **e;        /* per source: its pair's entries (NULL: no such pair) */
	size_t *ne;
	size_t ns;                /* sources (e, ne) */
	size_t nbufs;
	uint32_t *buf_ids;        /* the sink's layout buffer ids, ascending */
	uint8_t *enc;             /* per slot: jsink_keep_encoded */
	int alter;                /* extension point (job_ext.h): alter one value of the first sparse source */
	struct jstaged *st;       /* result, or NULL with err */
	char err[256];
	double ms;
};

/* Whether entries into this buffer are applied from their payload bytes
 * (host memory) or decoded at staging: device memory is scattered from
 * host arrays by the cuda backend, and the storage writer reads the
 * decoded writes of its mirror to find what changed. */
int jsink_keep_encoded(const struct job *j, const struct jlocal *l, const struct dbuf *b)
{
	if (b->cuda)
		return 0;
	return !(j->store && !strcmp(l->info.layout, JSTORE_CANON_LAYOUT));
}

/* jlocal_buf over the task's copy of the sink's buffer ids. */
static int stage_slot(const struct jstage *g, uint32_t id, size_t *slot)
{
	for (size_t i = 0; i < g->nbufs; i++) {
		if (g->buf_ids[i] == id) {
			*slot = i;
			return 1;
		}
	}
	return 0;
}

/* Check (or decode) one entry's bytes into w.  0 or a DTC_* code. */
static int stage_entry(struct jwrite *w, int enc, const struct jentry *e, uint64_t cnt,
		       const uint8_t *p, uint64_t len)
{
	uint64_t got = 0;
	int r;

	w->n = w->dense ? e->box : cnt;
	if (enc && w->dense) {
		if (len != 2 * e->box)
			return len < 2 * e->box ? DTC_ETRUNC : DTC_ECORRUPT;
	} else if (enc) {
		if ((r = dtc_sparse_payload_check(p, len, e->box, &got)) != DTC_OK)
			return r;
		if (got != cnt)
			return DTC_ECORRUPT;
	} else if (w->dense) {
		if (!(w->val = malloc(e->box * sizeof(*w->val))))
			return DTC_ENOMEM;
		return dtc_dense_decode(p, len, e->box, w->val);
	} else {
		w->pos = malloc(cnt * sizeof(*w->pos));
		w->val = malloc(cnt * sizeof(*w->val));
		if (!w->pos || !w->val)
			return DTC_ENOMEM;
		if ((r = dtc_sparse_decode(p, len, e->box, w->pos, w->val, cnt, &got)) != DTC_OK)
			return r;
		return got == cnt ? DTC_OK : DTC_ECORRUPT;
	}
	w->enc = p;
	w->enc_len = (size_t)len;
	return DTC_OK;
}

static int part_cmp(const void *a, const void *b)
{
	const struct jpart *x = a, *y = b;

	return x->part < y->part ? -1 : x->part > y->part;
}

/* Stage one source's part of a version: its parts in order (ranges in
 * entry order, no overlap, every entry with a count inside one), every
 * entry checked (positions against its box), kept encoded or decoded
 * (jsink_keep_encoded); the parts' bytes move into st, which owns them from
 * here on. */
static int decode_src(struct jstage *g, size_t si, struct jstaged *st, char *err, size_t errlen)
{
	struct jpend_src *s = &g->p->s[si];
	const struct jentry *pe = g->e[si];
	const Dtep__Counts *c = s->counts;
	int dense = c->mode == DTEP__MODE__MODE_DENSE;
	size_t w0 = st->n, covered = 0, pn = g->ne[si];
	int alter = 0;

	if (!pe || pn != c->n_counts) {
		snprintf(err, errlen, "source %llx: %zu counts for %zu entries",
			 (unsigned long long)s->src, c->n_counts, pe ? pn : 0);
		return -EBADMSG;
	}
	for (size_t i = 0; i < pn; i++) {
		const struct jentry *e = &pe[i];
		struct jwrite *w = &st->w[st->n];
		uint64_t cnt = c->counts[i];
		size_t slot;

		if (!stage_slot(g, e->dst_buf, &slot)) {
			snprintf(err, errlen, "entry %zu: sink buffer %u missing", i, e->dst_buf);
			return -EBADMSG;
		}
		memset(w, 0, sizeof(*w));
		w->dst_slot = (uint32_t)slot;
		w->dense = dense;
		w->map = e->map;
		st->covered[slot] = 1;
		st->n++;
		if (dense && cnt != e->box) {
			snprintf(err, errlen, "entry %zu: dense count %llu, box %llu", i,
				 (unsigned long long)cnt, (unsigned long long)e->box);
			return -EBADMSG;
		}
		if (cnt > e->box) {
			snprintf(err, errlen, "entry %zu: %llu positions in a box of %llu", i,
				 (unsigned long long)cnt, (unsigned long long)e->box);
			return -EBADMSG;
		}
	}
	if (s->nparts)
		qsort(s->parts, s->nparts, sizeof(*s->parts), part_cmp);
	for (size_t k = 0; k < s->nparts; k++) {
		struct jpart *pt = &s->parts[k];
		uint8_t *raw = NULL, *data;
		const uint8_t *view = NULL;
		size_t raw_len = 0, off = 0, bound = 0;
		uint64_t claimed;
		int codec, encoded = 0;

		if (pt->part != k || pt->first < covered || pt->entries == 0 ||
		    pt->entries > pn - pt->first) {
			snprintf(err, errlen, "source %llx: part %u (entries %u..+%u) missing, out of "
				 "order or overlapping", (unsigned long long)s->src, pt->part, pt->first,
				 pt->entries);
			return -EBADMSG;
		}
		for (size_t i = covered; i < pt->first; i++) {
			if (c->counts[i]) {
				snprintf(err, errlen, "entry %zu: count %llu but no part carries it", i,
					 (unsigned long long)c->counts[i]);
				return -EBADMSG;
			}
		}
		covered = (size_t)pt->first + pt->entries;
		for (size_t i = pt->first; i < covered; i++)
			if (c->counts[i])
				bound += 8 + (dense ? 2 * pe[i].box :
					      dtc_sparse_bound(c->counts[i]));
		if (dtc_chunk_info(pt->data, pt->len, &claimed, &codec) != DTC_OK || claimed > bound) {
			snprintf(err, errlen, "source %llx part %u: header invalid or larger than its "
				 "counts allow", (unsigned long long)s->src, pt->part);
			return -EBADMSG;
		}
		/* Stored raw (the same-cluster default), it is staged where it
		 * was received: no second copy of the payload. */
		if (dtc_chunk_view(pt->data, pt->len, &view, &raw_len) != DTC_OK ||
		    (!view && (!(raw = malloc(claimed ? claimed : 1)) ||
			       dtc_chunk_unpack(pt->data, pt->len, raw, claimed,
						&raw_len) != DTC_OK))) {
			snprintf(err, errlen, "source %llx: payload corrupt (checksum or framing) in "
				 "part %u", (unsigned long long)s->src, pt->part);
			free(raw);
			return -EBADMSG;
		}
		data = view ? pt->data + (view - pt->data) : raw;
		if (!k && !dense && g->alter) {
			alter = 1;	/* the first sparse source only */
			g->alter = 0;
		}
		for (size_t i = pt->first; i < covered; i++) {
			const struct jentry *e = &pe[i];
			struct jwrite *w = &st->w[w0 + i];
			uint64_t cnt = c->counts[i], len;
			int r;

			if (!cnt)
				continue;
			if (raw_len - off < 8 ||
			    (len = jsink_get64(data + off)) > raw_len - off - 8) {
				snprintf(err, errlen, "entry %zu: payload truncated", i);
				free(raw);
				return -EBADMSG;
			}
			off += 8;
			r = stage_entry(w, g->enc[w->dst_slot], e, cnt, data + off, len);
			encoded |= w->enc != NULL;
			if (r != DTC_OK) {
				snprintf(err, errlen, "entry %zu: %s", i, dtc_strerror(r));
				free(raw);
				return -EBADMSG;
			}
			if (alter) {
				/* After every check. */
				if (w->enc)
					g->t.eng->ext.sink_alter(data + off + len - 1, 1);
				else
					g->t.eng->ext.sink_alter(&w->val[w->n - 1],
								 sizeof(w->val[0]));
				alter = 0;
			}
			off += len;
		}
		if (off != raw_len) {
			snprintf(err, errlen, "source %llx part %u: %zu bytes after the last entry",
				 (unsigned long long)s->src, pt->part, raw_len - off);
			free(raw);
			return -EBADMSG;
		}
		/* The bytes the writes point into (none when all were decoded). */
		if (encoded) {
			st->held[st->nheld++] = raw ? raw : pt->data;
			if (raw)
				recvpool_free(pt->data);
			pt->data = NULL;
		} else {
			free(raw);
		}
	}
	for (size_t i = covered; i < pn; i++) {
		if (c->counts[i]) {
			snprintf(err, errlen, "entry %zu: count %llu but no part carries it", i,
				 (unsigned long long)c->counts[i]);
			return -EBADMSG;
		}
	}
	for (size_t i = 0; i < c->n_checksums; i++) {
		size_t slot;

		if (!stage_slot(g, c->checksums[i]->dst_buffer, &slot)) {
			snprintf(err, errlen, "checksum names buffer %u this sink does not have",
				 c->checksums[i]->dst_buffer);
			return -EBADMSG;
		}
		st->expect[slot] += c->checksums[i]->partial;
	}
	return 0;
}

/* Worker: the version's every record checked, kept encoded or decoded. */
static struct jstaged *decode(struct jstage *g, char *err, size_t errlen)
{
	struct jpend *p = g->p;
	struct jstaged *st = calloc(1, sizeof(*st));
	size_t nw = 0, nparts = 0, nb = g->nbufs ? g->nbufs : 1;

	for (size_t i = 0; i < p->n; i++) {
		nw += p->s[i].counts->n_counts;
		nparts += p->s[i].nparts;
	}
	if (!st || !(st->w = calloc(nw ? nw : 1, sizeof(*st->w))) ||
	    !(st->expect = calloc(nb, sizeof(*st->expect))) || !(st->covered = calloc(nb, 1)) ||
	    !(st->srcs = calloc(p->n ? p->n : 1, sizeof(*st->srcs))) ||
	    !(st->held = calloc(nparts ? nparts : 1, sizeof(*st->held)))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	st->version = p->version;
	st->all_dense = 1;
	for (size_t i = 0; i < p->n; i++) {
		st->srcs[st->nsrcs++] = p->s[i].src;
		st->all_dense &= p->s[i].counts->mode == DTEP__MODE__MODE_DENSE;
		if (decode_src(g, i, st, err, errlen) < 0)
			goto fail;
	}
	return st;
fail:
	if (st)
		jsink_staged_free(st);
	return NULL;
}

void jsink_send_staged(struct job *j, struct jlocal *l, const struct jstaged *st)
{
	for (size_t i = 0; i < st->nsrcs; i++) {
		Dtep__Staged m = DTEP__STAGED__INIT;
		Dtep__JobRef ref;
		const struct jpinfo *p = job_part(j, st->srcs[i]);

		if (!p)
			continue;
		job_fill_ref(j, &ref);
		m.job = &ref;
		m.version = st->version;
		m.src = st->srcs[i];
		m.dst = l->info.id;
		job_send_to_node(j, p->node, DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED, &m.base, NULL, 0);
	}
}

/* A sink that never applies must not stage without bound.  Past
 * max_staged_versions the staged chain goes: every version in it builds on
 * the one before (a dense one starts a new chain, see jsink_try_stage), so
 * dropping the oldest would leave a hole under all the rest; the sink
 * falls back to what it applied and its sources are told (APPLIED
 * refused), so their next version is dense.  Sparse versions in flight on
 * the dropped ones are refused by the base check. */
static void staging_cap(struct job *j, struct jlocal *l, const struct jstaged *newest)
{
	uint32_t cap = jsink_staged_cap(j->eng);
	uint64_t *srcs, version = newest->version;
	size_t n = 0, nsrcs = newest->nsrcs;
	char why[160];

	for (const struct jstaged *s = jsink_of(l)->staged; s; s = s->next)
		n++;
	if (n <= cap)
		return;
	srcs = malloc((nsrcs ? nsrcs : 1) * sizeof(*srcs));
	if (srcs)
		memcpy(srcs, newest->srcs, nsrcs * sizeof(*srcs));
	{
		/* A version staged in place is in the buffers already: it
		 * stays, the rest of the chain goes. */
		struct jstaged *keep = jsink_of(l)->staged && jsink_of(l)->staged->in_place ?
				       jsink_of(l)->staged : NULL;
		struct jstaged **pp = keep ? &keep->next : &jsink_of(l)->staged;

		while (*pp) {
			struct jstaged *s = *pp;

			*pp = s->next;
			/* cap_refuse: the chain goes, one APPLIED refused below */
			(void)sink_decide(l, s->version, SINK_V_STAGED, SINK_EV_CAP);
			jsink_staged_free(s);
		}
		/* An apply on a worker still brings the sink to its version. */
		jsink_of(l)->held = keep ? keep->version : jsink_of(l)->applying ?
				    jsink_of(l)->applying : jsink_of(l)->applied;
	}
	jsink_of(l)->staging_drops++;
	snprintf(why, sizeof(why), "%zu versions staged and none applied (max_staged_versions %u): "
		 "staging dropped, next version dense", n, cap);
	DLOG_W("job %s: sink %llx: %s", j->name, (unsigned long long)l->info.id, why);
	if (srcs)
		jsink_send_applied(j, l, version, srcs, nsrcs, DTEP__APPLY_RESULT__APPLY_REFUSED,
				   why, 0);
	free(srcs);
}

static void stage_free(struct jstage *g)
{
	if (!g)
		return;
	if (g->st)
		jsink_staged_free(g->st);
	if (g->p)
		jsink_pend_free(g->p);
	for (size_t i = 0; g->e && i < g->ns; i++)
		free(g->e[i]);
	free(g->e);
	free(g->ne);
	free(g->buf_ids);
	free(g->enc);
	free(g);
}

/* Worker: check and keep (or decode) the version; what it does not keep
 * of the records (a refused version's parts: up to the model's size) is
 * freed here, not on the loop. */
static void stage_run(struct jtask *t)
{
	struct jstage *g = (struct jstage *)t;
	uint64_t t0 = jio_now(t->eng);

	g->st = decode(g, g->err, sizeof(g->err));
	for (size_t i = 0; i < g->p->n; i++)
		jsink_pend_src_clear(&g->p->s[i]);
	g->ms = job_ms_since(t->eng, t0);
}


/* Loop: the staged version joins the sink's chain (or is refused), then
 * the next one may go. */
static void stage_done(struct jtask *t, int cancelled)
{
	struct jstage *g = (struct jstage *)t;
	struct job *j = job_find(g->t.eng, g->job);
	struct jlocal *l = j ? job_local(j, g->participant) : NULL;
	struct jstaged *st = g->st;

	enum sink_vaction act;

	if (l && l->info.role != JROLE_SINK)
		l = NULL;
	if (l)
		jsink_of(l)->staging = 0;
	dmetrics_observe(DM_PHASE_SECONDS, "stage", g->ms / 1e3);
	if (cancelled || !l) {
		/* Never started (shutdown), or the sink went away: the result
		 * is dropped (there is no sink to decide for when it is gone). */
		if (!cancelled)
			DLOG_I("job %s: sink %llx went away while version %llu was staged (dropped)",
			       g->job, (unsigned long long)g->participant,
			       (unsigned long long)g->p->version);
		stage_free(g);
		return;
	}
	act = sink_decide(l, g->p->version, SINK_V_STAGING,
			  g->p->version <= jsink_of(l)->held ? SINK_EV_SUPERSEDED :
			  st ? SINK_EV_WORKER_OK : SINK_EV_WORKER_FAILED);
	if (act == SINK_A_REFUSE) {
		jsink_refuse_version(j, l, g->p, DTEP__APPLY_RESULT__APPLY_REFUSED, g->err);
	} else if (act == SINK_A_SEND_STAGED) {
		g->st = NULL;
		if (st->all_dense) {
			/* Everything before it is overwritten anyway (but a
			 * version staged in place is in the buffers: it stays). */
			struct jstaged **op = &jsink_of(l)->staged;

			if (*op && (*op)->in_place)
				op = &(*op)->next;
			while (*op) {
				struct jstaged *o = *op;

				*op = o->next;
				if (sink_decide(l, o->version, SINK_V_STAGED, SINK_EV_SUPERSEDED) ==
				    SINK_A_FREE)
					jsink_staged_free(o);
			}
		}
		{
			struct jstaged **pp = &jsink_of(l)->staged;

			while (*pp)
				pp = &(*pp)->next;
			*pp = st;
		}
		jsink_of(l)->held = st->version;
		jsink_send_staged(j, l, st);
		DLOG_D("job %s: sink %llx staged version %llu (%s) on a worker in %.2f ms", j->name,
		       (unsigned long long)l->info.id, (unsigned long long)st->version,
		       st->all_dense ? "dense" : "sparse", g->ms);
		staging_cap(j, l, st);
	} else {
		stage_free(g);	/* drop_result: superseded meanwhile */
		return;
	}
	stage_free(g);
	jsink_try_stage(j, l);
	jev_sink_staged(j, l);
	jev_progress(j->eng);
}

/* Hand version p (complete, its base checked) to a worker: p leaves the
 * sink's pending list for the task.  0, or -1 (out of memory: p stays). */
static int stage_start(struct job *j, struct jlocal *l, struct jpend *p)
{
	struct jstage *g = calloc(1, sizeof(*g));
	size_t n = p->n ? p->n : 1, nb = l->nbufs ? l->nbufs : 1;
	int sparse = 0;

	if (j->eng->stopping) {
		free(g);
		return 0;	/* shutting down: it stays pending, nothing more is staged */
	}
	if (!g || !(g->e = calloc(n, sizeof(*g->e))) || !(g->ne = calloc(n, sizeof(*g->ne))) ||
	    !(g->buf_ids = malloc(nb * sizeof(*g->buf_ids))) || !(g->enc = malloc(nb)))
		goto fail;
	g->ns = p->n;
	for (size_t i = 0; i < p->n; i++) {
		const struct jpair *pair = job_pair(j, p->s[i].src, l->info.id);

		sparse |= p->s[i].counts->mode != DTEP__MODE__MODE_DENSE;
		if (!pair)
			continue;	/* decode refuses it */
		if (!(g->e[i] = malloc((pair->n ? pair->n : 1) * sizeof(*pair->e))))
			goto fail;
		memcpy(g->e[i], pair->e, pair->n * sizeof(*pair->e));
		g->ne[i] = pair->n;
	}
	for (size_t s = 0; s < l->nbufs; s++) {
		g->buf_ids[s] = l->buf_ids[s];
		g->enc[s] = (uint8_t)jsink_keep_encoded(j, l, l->bufs[s]);
	}
	g->nbufs = l->nbufs;
	snprintf(g->job, sizeof(g->job), "%s", j->name);
	g->participant = l->info.id;
	/* On the loop: sink_select may log, and it fires once per version
	 * (job_ext.h; NULL in production). */
	g->alter = sparse && j->eng->ext.sink_select && j->eng->ext.sink_alter &&
		   j->eng->ext.sink_select(p->version);
	for (struct jpend **pp = &jsink_of(l)->pend; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	p->next = NULL;
	g->p = p;
	jsink_of(l)->staging = p->version;
	g->t.run = stage_run;
	g->t.done = stage_done;
	jtask_start(j->eng, &g->t);
	return 0;
fail:
	stage_free(g);
	return -ENOMEM;
}

/* Stage whatever can be staged now, in version order. */
void jsink_try_stage(struct job *j, struct jlocal *l)
{
	char err[256];

	for (;;) {
		struct jpend *p, *best = NULL;
		int wait = 0;

		if (jsink_of(l)->staging)
			return;	/* a version is being staged: its base for what follows */
		if (jsink_of(l)->arrive)
			return;	/* one is in the buffers (apply on arrival): nothing else stages */

		/* Versions the sink holds already (or older) go. */
		while ((p = jsink_of(l)->pend) && p->version <= jsink_of(l)->held &&
		       sink_decide(l, p->version, jsink_pend_state(p), SINK_EV_SUPERSEDED) ==
			       SINK_A_FREE)
			jsink_pend_drop(l, p);
		for (struct jpend *next; p && p->next; p = next) {
			next = p->next;
			if (next->version <= jsink_of(l)->held &&
			    sink_decide(l, next->version, jsink_pend_state(next),
					SINK_EV_SUPERSEDED) == SINK_A_FREE) {
				jsink_pend_drop(l, next);
				next = p;
			}
		}
		for (p = jsink_of(l)->pend; p; p = p->next)
			if (jsink_pend_complete(p) && (!best || p->version < best->version))
				best = p;
		if (!best)
			return;
		for (size_t i = 0; i < best->n; i++) {
			const Dtep__Counts *c = best->s[i].counts;
			int have_base = 0;

			if (c->mode != DTEP__MODE__MODE_SPARSE || c->base_version == jsink_of(l)->held)
				continue;
			for (p = jsink_of(l)->pend; p; p = p->next)
				have_base |= p->version == c->base_version &&
					     c->base_version > jsink_of(l)->held;
			if (have_base) {
				wait = 1;	/* its base is still on the way */
				continue;
			}
			if (sink_decide(l, best->version, SINK_V_COLLECTING,
					SINK_EV_COMPLETE_NO_BASE) != SINK_A_BASE_MISMATCH)
				return;
			snprintf(err, sizeof(err), "sparse from %llx builds on version %llu; sink holds %llu",
				 (unsigned long long)best->s[i].src, (unsigned long long)c->base_version,
				 (unsigned long long)jsink_of(l)->held);
			jsink_refuse_version(j, l, best, DTEP__APPLY_RESULT__APPLY_BASE_MISMATCH,
					     err);
			jsink_pend_drop(l, best);
			best = NULL;
			break;
		}
		if (!best)
			continue;
		if (wait) {
			/* A version dense from every source needs no base: it
			 * goes ahead of sparse ones waiting on a base that may
			 * never complete (a part lost with its sender). */
			struct jpend *dense = NULL;

			for (p = jsink_of(l)->pend; p; p = p->next)
				if (p->version > best->version && jsink_pend_complete(p) &&
				    jsink_pend_all_dense(p) &&
				    (!dense || p->version < dense->version))
					dense = p;
			if (!dense)
				return;
			best = dense;
		}
		if (sink_decide(l, best->version, SINK_V_COLLECTING, SINK_EV_COMPLETE) != SINK_A_STAGE)
			return;
		if (stage_start(j, l, best) < 0) {
			/* No worker could take it: staging failed. */
			if (sink_decide(l, best->version, SINK_V_STAGING, SINK_EV_WORKER_FAILED) ==
			    SINK_A_REFUSE)
				jsink_refuse_version(j, l, best, DTEP__APPLY_RESULT__APPLY_REFUSED,
						     "out of memory");
			jsink_pend_drop(l, best);
			continue;
		}
		return;	/* one at a time: stage_done comes back here */
	}
}

/* Whether a record (COUNTS or PAYLOAD part) of version v is dropped at
 * sink l (sink_sm.h): by the state the sink's fields give v, before its
 * pending version is looked up (record_dropped_pending, after). */
static int record_dropped(struct jlocal *l, uint64_t v)
{
	return sink_sm_step(jsink_vstate(l, v), SINK_EV_RECORD).act == SINK_A_DROP;
}

/* ...and once its pending version p is found (or made). */
static int record_dropped_pending(const struct jpend *p)
{
	return sink_sm_step(jsink_pend_state(p), SINK_EV_RECORD).act == SINK_A_DROP;
}

static struct jlocal *sink_for(struct job *j, uint64_t dst, uint64_t epoch, const char *from,
			       uint64_t version, Dtep__PeerMsgType type)
{
	struct jlocal *l = job_local(j, dst);

	if (!l || l->info.role != JROLE_SINK) {
		DLOG_I("job %s: record for sink %llx, not attached here (dropped)", j->name,
		       (unsigned long long)dst);
		return NULL;
	}
	if (epoch != j->epoch) {
		char why[128];
		uint64_t src = 0;
		Dtep__Applied m = DTEP__APPLIED__INIT;
		Dtep__JobRef ref;

		(void)src;
		snprintf(why, sizeof(why), "plan epoch %llu, sink has %llu", (unsigned long long)epoch,
			 (unsigned long long)j->epoch);
		DLOG_I("job %s: version %llu for sink %llx refused: %s", j->name,
		       (unsigned long long)version, (unsigned long long)dst, why);
		j->refused++;
		dmetrics_add(DM_REFUSED, "stale_epoch", 1);
		job_fill_ref(j, &ref);
		m.job = &ref;
		m.version = version;
		m.dst = dst;
		m.result = DTEP__APPLY_RESULT__APPLY_REFUSED;
		m.message = why;
		if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS)
			jio_send(j->eng, from, NULL, DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED, &m.base, NULL,
				 0);
		return NULL;
	}
	return l;
}

void jsink_counts(struct job *j, const char *from, const Dtep__Counts *m, const uint8_t *hdr,
		  size_t hdrlen)
{
	struct jlocal *l = sink_for(j, m->dst, m->epoch, from, m->version, DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS);
	const struct jpair *pair;
	struct jpend *p;
	struct jpend_src *s;
	char why[192];

	if (!l)
		return;
	pair = job_pair(j, m->src, m->dst);
	if (!pair || pair->n != m->n_counts || m->version == 0 ||
	    (m->mode != DTEP__MODE__MODE_SPARSE && m->mode != DTEP__MODE__MODE_DENSE) ||
	    m->payload_bytes > ((uint64_t)1 << 40) || m->parts > JOB_MAX_PARTS ||
	    !m->parts != !m->payload_bytes) {
		j->refused++;
		DLOG_W("job %s: COUNTS from %s for %llx->%llx v%llu malformed (pair %s, %zu counts)",
		       j->name, from, (unsigned long long)m->src, (unsigned long long)m->dst,
		       (unsigned long long)m->version, pair ? "known" : "unknown", m->n_counts);
		return;
	}
	if (record_dropped(l, m->version)) {
		DLOG_I("job %s: COUNTS for version %llu but sink %llx holds %llu (dropped)", j->name,
		       (unsigned long long)m->version, (unsigned long long)l->info.id,
		       (unsigned long long)jsink_of(l)->held);
		return;
	}
	p = pend_get(j, l, m->version);
	if (p && record_dropped_pending(p))
		return;
	s = p ? jsink_pend_src(p, m->src) : NULL;
	if (!s || s->counts) {
		DLOG_W("job %s: COUNTS from %llx for version %llu %s", j->name,
		       (unsigned long long)m->src, (unsigned long long)m->version,
		       p ? "duplicated or unexpected" : "(out of memory)");
		return;
	}
	s->counts = dtep__counts__unpack(NULL, hdrlen, hdr);
	if (!s->counts)
		return;
	if (pend_src_check(s, why, sizeof(why)) < 0)
		pend_refuse(j, l, p, why);
	else
		jsink_arrive_record(j, l, p, s, 1);
	jsink_try_stage(j, l);
	jev_sink_staged(j, l);
}

/* One PAYLOAD part: kept until its COUNTS and every other part named
 * there are in (jsink_try_stage).  A part that cannot belong to an acceptable
 * version is dropped; one that contradicts the version's other records
 * (a duplicate, a range past the pair, an index past what COUNTS names)
 * refuses the version. */
void jsink_payload(struct job *j, const char *from, const Dtep__Payload *m, const void *data,
		   size_t len)
{
	struct jlocal *l = sink_for(j, m->dst, m->epoch, from, m->version, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD);
	const struct jpair *pair;
	struct jpend *p;
	struct jpend_src *s;
	struct jpart *pt;
	char why[192];

	if (!l)
		return;
	if (record_dropped(l, m->version)) {
		DLOG_I("job %s: PAYLOAD part %u for version %llu but sink %llx holds %llu (dropped)",
		       j->name, m->part, (unsigned long long)m->version,
		       (unsigned long long)l->info.id, (unsigned long long)jsink_of(l)->held);
		return;
	}
	pair = job_pair(j, m->src, m->dst);
	if (!len || len > ((size_t)1 << 40) || !pair || m->version == 0 ||
	    m->part >= JOB_MAX_PARTS) {
		j->refused++;
		DLOG_W("job %s: PAYLOAD from %s for %llx->%llx v%llu malformed (dropped)", j->name,
		       from, (unsigned long long)m->src, (unsigned long long)m->dst,
		       (unsigned long long)m->version);
		return;
	}
	p = pend_get(j, l, m->version);
	if (p && record_dropped_pending(p))
		return;
	s = p ? jsink_pend_src(p, m->src) : NULL;
	if (!s) {
		DLOG_W("job %s: PAYLOAD from %llx for version %llu unexpected", j->name,
		       (unsigned long long)m->src, (unsigned long long)m->version);
		return;
	}
	if (!m->entries || m->first_entry >= pair->n || m->entries > pair->n - m->first_entry) {
		snprintf(why, sizeof(why), "source %llx: part %u names entries %u..+%u of %zu",
			 (unsigned long long)m->src, m->part, m->first_entry, m->entries, pair->n);
		pend_refuse(j, l, p, why);
		jsink_try_stage(j, l);
		return;
	}
	for (size_t k = 0; k < s->nparts; k++) {
		if (s->parts[k].part == m->part) {
			snprintf(why, sizeof(why), "source %llx: part %u twice",
				 (unsigned long long)m->src, m->part);
			pend_refuse(j, l, p, why);
			jsink_try_stage(j, l);
			return;
		}
	}
	if (s->nparts == s->cap) {
		size_t nc = s->cap ? 2 * s->cap : 4;
		void *np = realloc(s->parts, nc * sizeof(*s->parts));

		if (!np)
			return;
		s->parts = np;
		s->cap = nc;
	}
	if (m->n_counts) {
		/* A part that describes itself: one count per entry of its
		 * range, none past its entry's box (dense: each the box). */
		int dense = m->mode == DTEP__MODE__MODE_DENSE;
		int bad = m->n_counts != m->entries ||
			  (m->mode != DTEP__MODE__MODE_SPARSE && !dense);

		for (size_t i = 0; !bad && i < m->n_counts; i++)
			bad = dense ? m->counts[i] != pair->e[m->first_entry + i].box
				    : m->counts[i] > pair->e[m->first_entry + i].box;
		if (bad) {
			snprintf(why, sizeof(why), "source %llx: part %u's counts do not fit its "
				 "%u entries", (unsigned long long)m->src, m->part, m->entries);
			pend_refuse(j, l, p, why);
			jsink_try_stage(j, l);
			return;
		}
	}
	pt = &s->parts[s->nparts];
	memset(pt, 0, sizeof(*pt));
	if (m->n_counts) {
		if (!(pt->cnt = malloc(m->n_counts * sizeof(*pt->cnt))))
			return;
		memcpy(pt->cnt, m->counts, m->n_counts * sizeof(*pt->cnt));
		pt->base = m->base_version;
		pt->mode = m->mode;
	}
	/* A large part that landed in memory of its own is kept as it is
	 * (the router hands it over); anything else is copied, into the
	 * sink's arena while it has one (recvpool.h: a fresh sink's dense
	 * version). */
	if (!(pt->data = j->eng->io.take_data(j->eng->io.ctx, data))) {
		if (!(pt->data = recvpool_get(len)) && !(pt->data = malloc(len))) {
			free(pt->cnt);
			pt->cnt = NULL;
			return;
		}
		memcpy(pt->data, data, len);
	}
	pt->len = len;
	pt->part = m->part;
	pt->first = m->first_entry;
	pt->entries = m->entries;
	s->nparts++;
	s->bytes += len;
	if (pend_src_check(s, why, sizeof(why)) < 0)
		pend_refuse(j, l, p, why);
	else
		jsink_arrive_record(j, l, p, s, 0);
	jsink_try_stage(j, l);
	jev_sink_staged(j, l);
}

/* The boxes and buffers a verified sum is over: same key, same sum
 * domain.  Never 0 (0 means "not verified"). */
uint64_t jsink_verify_key(struct dbuf *const *bufs, const struct jstaged *st)
{
	uint64_t h = dtc_mix64(st->n + 1);

	for (size_t i = 0; i < st->n; i++) {
		const struct jwrite *w = &st->w[i];
		const struct dbuf *b = bufs[w->dst_slot];
		const int64_t *m = (const int64_t *)&w->map;

		h = dtc_mix64(h ^ w->dst_slot) + (uint64_t)(uintptr_t)b->ptr + b->length;
		h = dtc_mix64(h ^ w->map.ndim);
		for (size_t k = 1; k < sizeof(w->map) / sizeof(*m); k++)
			h = dtc_mix64(h ^ (uint64_t)m[k]);
	}
	return h ? h : 1;
}

/* Dense values straight from the payload when they can be read in place
 * (little-endian, 2-byte aligned), else through a decoded copy. */
static int apply_dense_enc(const struct jwrite *w, struct dbuf *b)
{
	uint16_t *tmp = NULL;
	int r;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	if (!((uintptr_t)w->enc & 1))
		return jdev_dense_apply(&w->map, (const uint16_t *)(const void *)w->enc, b->ptr,
					b->length);
#endif
	if (!(tmp = malloc(w->n * sizeof(*tmp))))
		return DTC_ENOMEM;
	r = dtc_dense_decode(w->enc, w->enc_len, w->n, tmp);
	if (r == DTC_OK)
		r = jdev_dense_apply(&w->map, tmp, b->ptr, b->length);
	free(tmp);
	return r;
}

/* The element of box position pos (row-major over the box). */
static uint16_t *box_elem(const struct dte_box_map *m, uint16_t *base, uint64_t pos)
{
	int64_t at = m->dst_offset;

	for (uint32_t d = m->ndim; d-- > 0;) {
		at += (int64_t)(pos % (uint64_t)m->extent[d]) * m->dst_stride[d];
		pos /= (uint64_t)m->extent[d];
	}
	return base + at;
}

/* The test build's skipped write (job_ext.h): the first element the
 * entry's swap wrote gets back the value it held, which the swapped
 * payload holds now. */
int jsink_skip_one(void (*skip)(uint16_t *elem, uint16_t old), const struct dte_box_map *m,
		   const uint8_t *enc, size_t len, uint64_t n, uint16_t *dst)
{
	uint64_t *pos = malloc((n ? n : 1) * sizeof(*pos)), got = 0;
	int done = 0;
	uint16_t *old = malloc((n ? n : 1) * sizeof(*old));

	/* The first position the write changed: a detection reports some
	 * elements near a BF16 boundary whose value stays (the guard band),
	 * and leaving one of those "unwritten" would change nothing. */
	if (pos && old && dtc_sparse_decode(enc, len, dtc_box_size(m), pos, old, n, &got) ==
	    DTC_OK)
		for (uint64_t i = 0; i < got; i++)
			if (*box_elem(m, dst, pos[i]) != old[i]) {
				skip(box_elem(m, dst, pos[i]), old[i]);
				done = 1;
				break;
			}
	free(pos);
	free(old);
	return done;
}

/* Write one staged version.  Host entries from their payload are
 * swapped in (the payload keeps the old values: w->swapped, undone by
 * undo_writes), and a sparse one is then read back: delta[slot] gets
 * Σ mix(i, memory) − mix(i, old) over its positions, the change of the
 * buffer's sum as the memory holds it, not as the apply meant to write
 * it.  *undoable is cleared by a write that cannot be undone (device
 * memory, decoded writes, a map that may alias).  Returns 1 when every
 * write it made is in delta (so the version can be verified
 * incrementally), 0 when not, -EIO with why on a failed write. */
static int apply_version(struct dbuf *const *bufs, struct jstaged *st, uint64_t *delta,
			 int *undoable, void (*skip)(uint16_t *elem, uint16_t old), char *why,
			 size_t whylen)
{
	int tracked = !st->all_dense;

	for (size_t i = 0; i < st->n; i++) {
		struct jwrite *w = &st->w[i];
		struct dbuf *b = bufs[w->dst_slot];
		uint64_t got = 0, sn = 0;
		int r;

		if (!w->n)
			continue;
		if (w->enc && !w->dense && dtc_map_injective(&w->map)) {
			r = dtc_sparse_swap_payload(dtc_backend_cpu(), &w->map,
						    (uint8_t *)(uintptr_t)w->enc, w->enc_len, b->ptr,
						    b->length, &got, NULL);
			if (r == DTC_OK) {
				w->swapped = 1;
				if (skip &&
				    jsink_skip_one(skip, &w->map, w->enc, w->enc_len, w->n, b->ptr))
					skip = NULL;	/* else the next entry's */
				r = dtc_sparse_readback_payload(dtc_backend_cpu(), &w->map, w->enc,
								w->enc_len, b->ptr, b->length, &got,
								&delta[w->dst_slot]);
			}
		} else if (w->enc && w->dense && !((uintptr_t)w->enc & 1) &&
			   __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && dtc_map_injective(&w->map)) {
			/* Dense: verified by the full pass, which reads the box. */
			tracked = 0;
			r = dtc_dense_swap_payload(dtc_backend_cpu(), &w->map,
						   (uint8_t *)(uintptr_t)w->enc, w->enc_len, b->ptr,
						   b->length, &sn);
			w->swapped = r == DTC_OK;
		} else {
			uint64_t unused = 0;

			tracked = 0;
			*undoable = 0;
			r = w->enc && !w->dense ?
			    dtc_sparse_apply_payload(dtc_backend_cpu(), &w->map, w->enc, w->enc_len,
						     b->ptr, b->length, &got, &unused)
			    : w->enc ? apply_dense_enc(w, b)
			    : w->dense ? jdev_dense_apply(&w->map, w->val, b->ptr, b->length)
			    : jdev_scatter_apply(&w->map, w->pos, w->val, w->n, b->ptr, b->length);
		}
		if (r != DTC_OK) {
			snprintf(why, whylen, "apply of version %llu: %s",
				 (unsigned long long)st->version, dtc_strerror(r));
			return -EIO;
		}
	}
	return tracked;
}

/* Every swap of the versions from st on undone, last first (versions,
 * then entries; maps are injective, so each swap undoes exactly): the
 * buffers hold what they held before the first write, bit for bit.  The
 * recursion is as deep as the versions of one apply (max_staged_versions
 * at most). */
static void undo_writes(struct dbuf *const *bufs, struct jstaged *st)
{
	if (!st)
		return;
	undo_writes(bufs, st->next);
	for (size_t i = st->n; i-- > 0;) {
		struct jwrite *w = &st->w[i];
		struct dbuf *b = bufs[w->dst_slot];
		uint64_t got = 0, sn = 0;

		if (!w->swapped)
			continue;
		if (w->dense)
			(void)dtc_dense_swap_payload(dtc_backend_cpu(), &w->map,
						     (uint8_t *)(uintptr_t)w->enc, w->enc_len,
						     b->ptr, b->length, &sn);
		else
			(void)dtc_sparse_swap_payload(dtc_backend_cpu(), &w->map,
						      (uint8_t *)(uintptr_t)w->enc, w->enc_len,
						      b->ptr, b->length, &got, NULL);
		w->swapped = 0;
	}
}

/* Σ mix over the boxes of st, per covered slot, into sum[]. */
int jsink_full_sums(size_t nbufs, struct dbuf *const *bufs, const struct jstaged *st,
		    uint64_t *sum)
{
	memset(sum, 0, nbufs * sizeof(*sum));
	for (size_t i = 0; i < st->n; i++) {
		const struct jwrite *w = &st->w[i];
		uint64_t part = 0;

		/* Host or device: the backend's (vectorized, threaded) box sum. */
		if (jdev_checksum_box(&w->map, bufs[w->dst_slot]->ptr, bufs[w->dst_slot]->length,
				      &part) != DTC_OK)
			return -EIO;	/* unreadable is not verified */
		sum[w->dst_slot] += part;
	}
	return 0;
}

void job_set_verify_full_every(struct dte_engine *e, uint32_t n)
{
	e->verify_full_every = n;
}

uint32_t jsink_full_every(const struct dte_engine *e)
{
	return e->verify_full_every ? e->verify_full_every : JOB_VERIFY_FULL_EVERY_DEFAULT;
}

/* ----------------------------------------------------------------- apply
 * An apply runs on a worker (job_task.c).  The loop takes the staged
 * versions <= v off the sink (they belong to the task from then on),
 * references the sink's buffers and copies its verified state; the
 * worker writes and sums; the loop, back in apply_done, looks the sink up
 * again and commits the result (applied version, verified state,
 * APPLIED, the answer) or, when the sink went away meanwhile, drops it.
 * While it runs the sink keeps staging (l->applying is the version it
 * will hold); a second apply of the same sink is refused. */
struct japply {
	struct jtask t;
	char job[JOB_NAME_MAX];
	uint64_t participant, conn;
	uint32_t req_id;
	jsink_applied_fn then;    /* internal caller instead of an answer */
	void (*prep)(void *arg, const struct jstaged *first);	/* on the worker, first */
	void *arg;
	struct jstaged *list;     /* the versions, in order */
	struct jstaged *last;
	size_t nbufs;
	struct dbuf **bufs;       /* referenced until the task ends */
	uint64_t *vsum;           /* in: verified sums; out: the new ones */
	uint64_t vkey;
	uint32_t since_full, full_every;
	uint64_t t0;
	uint64_t skip;            /* job_ext: the version whose first write apply_skip sees */
	uint64_t in_place;        /* worker: the version staged in place it began with; 0: none */
	/* worker results */
	struct jsink_apply_result r;
	uint64_t *sum, *delta;
	int incremental;
};

static void japply_free(struct japply *a)
{
	while (a->list) {
		struct jstaged *s = a->list;

		a->list = s->next;
		jsink_staged_free(s);
	}
	for (size_t i = 0; i < a->nbufs; i++)
		if (a->bufs[i])
			dbuf_unref(a->bufs[i]);
	free(a->bufs);
	free(a->vsum);
	free(a->sum);
	free(a->delta);
	free(a);
}

/* Worker: everything it touches is the task's. */
static void apply_run(struct jtask *t)
{
	struct japply *a = (struct japply *)t;
	struct jsink_apply_result *r = &a->r;
	int incremental = a->vkey != 0, undoable = 1;
	struct jstaged *written = NULL;	/* the first version this task writes */
	uint64_t t0 = jio_now(t->eng);

	r->ok = 1;
	if (a->prep)
		a->prep(a->arg, a->list);
	for (struct jstaged *st = a->list; st; st = st->next) {
		if (st->in_place) {
			/* Applied on arrival and verified (it is always the
			 * first): its sums are the verified state from here. */
			memcpy(a->vsum, st->isum, a->nbufs * sizeof(*a->vsum));
			a->vkey = st->ikey;
			a->in_place = st->version;
			r->key = st->ikey;
			incremental = 1;
		} else if (!r->failed_apply) {
			int tr = apply_version(a->bufs, st, a->delta, &undoable,
					       st->version == a->skip ? a->t.eng->ext.apply_skip : NULL,
					       r->why, sizeof(r->why));

			if (!written)
				written = st;

			if (tr < 0)
				r->failed_apply = 1;
			r->key = jsink_verify_key(a->bufs, st);
			incremental &= tr == 1 && r->key == a->vkey;
		}
		a->last = st;
		r->n++;
	}
	incremental &= a->since_full + r->n < a->full_every;
	/* The content must now be exactly what the sources computed. */
	if (!r->failed_apply && incremental) {
		for (size_t s = 0; s < a->nbufs; s++)
			a->sum[s] = a->vsum[s] + a->delta[s];
	} else if (!r->failed_apply && jsink_full_sums(a->nbufs, a->bufs, a->last, a->sum) < 0) {
		r->failed_apply = 1;
		snprintf(r->why, sizeof(r->why), "checksum failed: a box outside its buffer");
	}
	for (size_t s = 0; s < a->nbufs && !r->failed_apply; s++) {
		if (!a->last->covered[s] || a->sum[s] == a->last->expect[s])
			continue;
		r->ok = 0;
		snprintf(r->why, sizeof(r->why), "buffer %s: checksum %016llx, expected %016llx (%s)",
			 a->bufs[s]->name, (unsigned long long)a->sum[s],
			 (unsigned long long)a->last->expect[s], incremental ? "incremental" : "full pass");
		break;
	}
	if (r->failed_apply)
		r->ok = 0;
	if (!r->ok && undoable) {
		/* A failed check never leaves the sink on what failed: every
		 * write of this apply is swapped back, and the buffers are what
		 * they were (the version before, or the one staged in place
		 * ahead of them, whose sums a->vsum holds), bit for bit. */
		undo_writes(a->bufs, written);
		r->undone = 1;
	}
	r->incremental = incremental;
	r->version = a->last->version;
	/* The payloads (a dense version holds the model's size) are
	 * unmapped here, not on the loop: the loop needs only the newest
	 * version's maps, partials and sources (and, undone, those of the
	 * version staged in place it began with: the sink stays on it). */
	{
		struct jstaged *keep = r->undone && a->in_place && a->list != a->last ?
				       a->list : NULL;
		struct jstaged **pp = keep ? &keep->next : &a->list;

		while (*pp != a->last) {
			struct jstaged *st = *pp;

			*pp = st->next;
			jsink_staged_free(st);
		}
		if (keep)
			staged_drop_data(keep);
	}
	staged_drop_data(a->last);
	r->work_ms = job_ms_since(t->eng, t0);
}

/* Loop: an apply failed its check and was undone, so the sink holds the
 * version it held before (applied).  Staged versions that build on the
 * failed one (sparse, up to the first dense one) go, refused: nothing with
 * a hole under it is applied; held falls back to what is left. */
static void fail_fallback(struct job *j, struct jlocal *l)
{
	struct jsink *k = jsink_of(l);
	char why[160];

	while (k->staged && !k->staged->all_dense && !k->staged->in_place) {
		struct jstaged *s = k->staged;

		k->staged = s->next;
		(void)sink_decide(l, s->version, SINK_V_STAGED, SINK_EV_CAP);
		snprintf(why, sizeof(why), "staged on version %llu, whose check failed and was undone",
			 (unsigned long long)k->failed);
		jsink_send_applied(j, l, s->version, s->srcs, s->nsrcs,
				   DTEP__APPLY_RESULT__APPLY_REFUSED, why, 0);
		jsink_staged_free(s);
	}
	k->held = k->applied;
	for (const struct jstaged *s = k->staged; s; s = s->next)
		k->held = s->version;
	if (k->staging > k->held)
		k->held = k->staging;
}

/* Loop: commit what the worker did to the sink, if it is still there. */
static void apply_done(struct jtask *t, int cancelled)
{
	struct japply *a = (struct japply *)t;
	struct jsink_apply_result *r = &a->r;
	struct dte_engine *e = t->eng;
	struct job *j = job_find(e, a->job);
	struct jlocal *l = j ? job_local(j, a->participant) : NULL;
	Dte__ApplyReply rep = DTE__APPLY_REPLY__INIT;
	enum sink_vaction act;

	r->ms = job_ms_since(t->eng, a->t0);
	if (l && l->info.role != JROLE_SINK)
		l = NULL;
	if (l)
		jsink_of(l)->applying = 0;
	if (e->stopping && !cancelled)
		DLOG_N("shutdown: the apply of version %llu of sink %llx (job %s) came back from "
		       "its worker after %.1f ms", (unsigned long long)r->version,
		       (unsigned long long)a->participant, a->job, r->work_ms);
	if (cancelled) {
		/* Shutdown drains an apply (applying × shutdown); one that
		 * never started wrote nothing: answered busy. */
		if (l)
			(void)sink_decide(l, r->version, SINK_V_APPLYING, SINK_EV_SHUTDOWN);
		if (a->then)
			a->then(NULL, NULL, r, a->arg);
		else
			job_reply(e, a->conn, a->req_id, -EBUSY,
				  "the daemon is shutting down; nothing was applied", 0, NULL);
		japply_free(a);
		return;
	}
	if (!l) {
		/* applying × detached: went_away (no sink left to decide for) */
		DLOG_N("job %s: sink %llx went away while version %llu was applied; result dropped",
		       a->job, (unsigned long long)a->participant, (unsigned long long)r->version);
		if (a->then)
			a->then(NULL, NULL, r, a->arg);
		else
			job_reply(e, a->conn, a->req_id, -ENOENT,
				  "the sink went away while its apply ran", 0, NULL);
		japply_free(a);
		return;
	}
	act = sink_decide(l, a->last->version, SINK_V_APPLYING,
			  r->ok ? SINK_EV_WORKER_OK : SINK_EV_WORKER_FAILED);
	if (act == SINK_A_SEND_APPLIED) {
		memcpy(jsink_of(l)->vsum, a->sum, l->nbufs * sizeof(*jsink_of(l)->vsum));
		jsink_of(l)->vkey = r->key;
		jsink_of(l)->since_full = r->incremental ? jsink_of(l)->since_full + r->n : 0;
	} else if (r->undone) {
		/* The buffers are bit for bit what the verified state (or the
		 * version staged in place first) describes. */
		memcpy(jsink_of(l)->vsum, a->vsum, l->nbufs * sizeof(*jsink_of(l)->vsum));
		jsink_of(l)->vkey = a->vkey;
	} else {
		jsink_of(l)->vkey = 0;	/* the next apply recomputes everything */
	}
	if (!r->failed_apply) {
		if (r->incremental)
			jsink_of(l)->incremental_verifies++;
		else
			jsink_of(l)->full_verifies++;
		dmetrics_add(DM_APPLY_VERIFY, r->incremental ? "incremental" : "full", 1);
	}
	/* A dense version onto one the sink held (the source's cost choice,
	 * which it makes again from the same rates) or a failed check (a
	 * dense repair follows): the next is likely dense too. */
	jsink_arena_next(j, l, !r->ok || (jsink_of(l)->applied && a->last->all_dense));
	if (!r->ok)
		jsink_of(l)->failed = a->last->version;
	if (r->ok || !r->undone) {
		jsink_of(l)->applied = a->last->version;
		jops_applied(e, l, a->last);
	} else {
		/* Undone: the sink stays on what it held (or on the version
		 * staged in place that this apply began with) until the dense
		 * repair lands; what was staged on the failed version goes. */
		if (a->in_place) {
			jsink_of(l)->applied = a->in_place;
			jops_applied(e, l, a->list);
		}
		fail_fallback(j, l);
	}
	dmetrics_add(DM_VERSIONS_APPLIED, NULL, r->ok || !r->undone ? r->n : 0);
	if (!r->ok) {
		dmetrics_add(DM_CHECKSUM_FAILURES, NULL, 1);
		jsink_of(l)->checksum_failures++;
		jsink_of(l)->apply_undos += r->undone != 0;
		if (r->undone)
			DLOG_E("job %s: sink %llx version %llu: %s; dense repair requested; undone: "
			       "the sink holds version %llu until it lands", j->name,
			       (unsigned long long)l->info.id, (unsigned long long)a->last->version,
			       r->why, (unsigned long long)jsink_of(l)->applied);
		else
			DLOG_E("job %s: sink %llx version %llu: %s; dense repair requested; not undone "
			       "(device or decoded writes)", j->name, (unsigned long long)l->info.id,
			       (unsigned long long)a->last->version, r->why);
	} else {
		DLOG_D("job %s: sink %llx version %llu verified (%s) on a worker in %.2f ms", j->name,
		       (unsigned long long)l->info.id, (unsigned long long)a->last->version,
		       r->incremental ? "incremental" : "full pass", r->work_ms);
	}
	dmetrics_observe(DM_PHASE_SECONDS, "apply", r->ms / 1e3);
	jsink_applied_or_defer(j, l, a->last->version, a->last->srcs, a->last->nsrcs,
			       act == SINK_A_SEND_APPLIED ? DTEP__APPLY_RESULT__APPLY_OK :
			       DTEP__APPLY_RESULT__APPLY_CHECKSUM_FAILED, r->why, r->ms);
	r->checksum_failures = jsink_of(l)->checksum_failures;
	if (a->then) {
		a->then(j, l, r, a->arg);
	} else {
		/* The version the buffers hold now: an undone apply left
		 * them on the one before, and applied none. */
		rep.version = jsink_of(l)->applied;
		rep.applied = r->ok || !r->undone ? r->n : 0;
		rep.checksum_ok = r->ok;
		rep.checksum_failures = jsink_of(l)->checksum_failures;
		rep.apply_ms = r->work_ms;
		job_reply(e, a->conn, a->req_id, 0, "", DTE__RESPONSE__BODY_APPLY,
			  &rep);
	}
	japply_free(a);
	jev_progress(e);
}

static int apply_start(struct job *j, struct jlocal *l, uint64_t version, uint64_t conn,
		       uint32_t req_id, void (*prep)(void *arg, const struct jstaged *first),
		       jsink_applied_fn then, void *arg, char *err, size_t errlen)
{
	struct japply *a;
	struct jstaged **tail;
	size_t nb = l->nbufs ? l->nbufs : 1;

	if (j->eng->stopping)
		return derr_fail(err, errlen, -EBUSY,
			     "job %s: the daemon is shutting down", j->name);
	if (jsink_of(l)->applying &&
	    sink_decide(l, version, SINK_V_APPLYING, SINK_EV_APPLY) == SINK_A_BUSY)
		return derr_fail(err, errlen, -EBUSY,
			     "job %s: sink %llx is applying version %llu already", j->name,
			     (unsigned long long)l->info.id, (unsigned long long)jsink_of(l)->applying);
	if (!jsink_of(l)->vsum)
		jsink_of(l)->vsum = calloc(nb, sizeof(*jsink_of(l)->vsum));
	a = calloc(1, sizeof(*a));
	if (!jsink_of(l)->vsum || !a || !(a->bufs = calloc(nb, sizeof(*a->bufs))) ||
	    !(a->vsum = malloc(nb * sizeof(*a->vsum))) || !(a->sum = calloc(nb, sizeof(*a->sum))) ||
	    !(a->delta = calloc(nb, sizeof(*a->delta)))) {
		if (a)
			japply_free(a);
		return derr_fail(err, errlen, -ENOMEM, "job %s: out of memory",
			     j->name);
	}
	snprintf(a->job, sizeof(a->job), "%s", j->name);
	a->participant = l->info.id;
	a->conn = conn;
	a->req_id = req_id;
	a->then = then;
	a->prep = prep;
	a->arg = arg;
	for (size_t i = 0; i < l->nbufs; i++) {
		a->bufs[i] = l->bufs[i];
		dbuf_ref(a->bufs[i]);
	}
	a->nbufs = l->nbufs;
	memcpy(a->vsum, jsink_of(l)->vsum, l->nbufs * sizeof(*a->vsum));
	a->vkey = jsink_of(l)->vkey;
	a->since_full = jsink_of(l)->since_full;
	a->full_every = jsink_full_every(j->eng);
	/* The versions move to the task, in order. */
	tail = &a->list;
	while (jsink_of(l)->staged && jsink_of(l)->staged->version <= version &&
	       sink_decide(l, jsink_of(l)->staged->version, SINK_V_STAGED, SINK_EV_APPLY) ==
		       SINK_A_APPLY) {
		struct jstaged *st = jsink_of(l)->staged;

		jsink_of(l)->staged = st->next;
		st->next = NULL;
		*tail = st;
		tail = &st->next;
		jsink_of(l)->applying = st->version;
		/* On the loop (it may log), once per apply (job_ext.h). */
		if (!a->skip && !st->in_place && j->eng->ext.apply_select &&
		    j->eng->ext.apply_skip && j->eng->ext.apply_select(st->version))
			a->skip = st->version;
	}
	jsink_of(l)->apply_gen++;
	DLOG_I("job %s: sink %llx: apply up to version %llu handed to a worker", j->name,
	       (unsigned long long)l->info.id, (unsigned long long)jsink_of(l)->applying);
	a->t0 = jio_now(j->eng);
	a->t.run = apply_run;
	a->t.done = apply_done;
	jtask_start(j->eng, &a->t);
	return 0;
}

int jsink_apply_start(struct job *j, struct jlocal *l, uint64_t version, uint64_t conn,
		      uint32_t req_id, jsink_applied_fn then, void *arg, char *err,
		      size_t errlen)
{
	return apply_start(j, l, version, conn, req_id, NULL, then, arg, err, errlen);
}

int jsink_apply_start_prep(struct job *j, struct jlocal *l, uint64_t version,
			   void (*prep)(void *arg, const struct jstaged *first),
			   jsink_applied_fn then, void *arg, char *err, size_t errlen)
{
	return apply_start(j, l, version, 0, 0, prep, then, arg, err, errlen);
}

int job_apply(struct dte_engine *e, uint64_t conn, uint32_t req_id,
	      const Dte__ApplyRequest *rq, Dte__ApplyReply *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j = job_find(e, rq->job);
	struct jlocal *l;
	int st;

	if (!j) {
		snprintf(err, errlen, "unknown job \"%s\"", rq->job ? rq->job : "");
		return -ENOENT;
	}
	l = job_local_owned(j, rq->participant, conn);
	if (!l || l->info.role != JROLE_SINK) {
		snprintf(err, errlen, "job %s: no sink participant %llx on this connection", j->name,
			 (unsigned long long)rq->participant);
		return -ENOENT;
	}
	if (!jsink_of(l)->applying &&
	    (!jsink_of(l)->staged || jsink_of(l)->staged->version > rq->version)) {
		/* Nothing staged at or below it: its state answers. */
		enum sink_vstate vs = jsink_vstate(l, rq->version);

		if (sink_decide(l, rq->version, vs, SINK_EV_APPLY) == SINK_A_ANSWER) {
			/* A failed version (its check failed, undone): the sink
			 * holds the version before it, and says so. */
			rep->version = jsink_of(l)->applied;
			rep->checksum_ok = vs != SINK_V_FAILED;
			rep->checksum_failures = jsink_of(l)->checksum_failures;
			return 0;
		}
		snprintf(err, errlen, "job %s: version %llu is not staged (newest staged %llu, applied %llu)",
			 j->name, (unsigned long long)rq->version,
			 (unsigned long long)jsink_newest_staged(l),
			 (unsigned long long)jsink_of(l)->applied);
		return -ENOENT;
	}
	st = jsink_apply_start(j, l, rq->version, conn, req_id, NULL, NULL, err, errlen);
	if (st == 0)
		*deferred = 1;
	return st;
}

/* ------------------------------------------------------ apply on arrival
 * docs/SYNC.md, "Apply on arrival".  A sink parked at its safe point (its
 * client waits in wait_staged, jsink.parked) takes a version (sparse on
 * the base its buffers hold, or dense) part by part: each part is checked and
 * swapped into the buffers on a worker as it arrives (the payload gets
 * the old values in place of the new ones, dtc_sparse_swap_payload), so
 * a version that fails (a part that fails its checks, the sums, a record
 * that contradicts, a re-plan, the sink going away) is undone exactly by
 * swapping every part again in reverse order, and one that cannot go on
 * this way (the park ends, a compressed record of it, a newer
 * version coming) is undone and then staged as usual from the very bytes
 * it arrived as.  Once every part is in and the sums match, the version
 * is staged "in place" (jstaged.in_place): STAGED, wait_staged answers,
 * and apply(v) writes nothing.  The engine sees it only then.
 *
 * One jarrive per sink at a time, one task of it on a worker at a time;
 * while it exists nothing else of the sink is staged (so nothing else is
 * applied into the buffers).  Every transition goes through sink_sm. */
static void arrive_kick(struct job *j, struct jlocal *l);
static int arrive_take(struct job *j, struct jlocal *l, struct jarrive *a,
		       const struct jpend_src *s, struct jpart *pt);
static int arrive_part_fits(struct job *j, struct jlocal *l, const struct jpend_src *s,
			    const struct jpart *pt);

static void aswap_free(struct jaswap *w)
{
	recvpool_free(w->data);
	free(w->e);
	free(w->cnt);
	free(w->slot);
	free(w->eidx);
	free(w->eoff);
	free(w->elen);
}

static void arrive_free(struct jarrive *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->nsw; i++)
		aswap_free(&a->sw[i]);
	free(a->sw);
	for (size_t i = 0; i < a->nbufs; i++)
		if (a->bufs[i])
			dbuf_unref(a->bufs[i]);
	free(a->bufs);
	free(a->buf_ids);
	free(a->delta);
	free(a->dsum);
	free(a->srcs);
	if (a->st)
		jsink_staged_free(a->st);
	free(a->vsum);
	free(a->sum);
	free(a);
}

static struct jpend *pend_find(struct jlocal *l, uint64_t v)
{
	for (struct jpend *p = jsink_of(l)->pend; p; p = p->next)
		if (p->version == v)
			return p;
	return NULL;
}

/* Worker: swap part w into the buffers (every entry checked first: the
 * chunk's framing and checksum, each entry's payload against its box and
 * count); 0, or -1 with err (the entries swapped so far stay recorded
 * for the undo). */
static int swap_part(struct jarrive *a, struct jaswap *w, char *err, size_t errlen)
{
	const uint8_t *view = NULL;
	size_t raw_len = 0, off = 0;
	uint64_t claimed, bound = 0;
	uint8_t *data;
	int codec;

	for (uint32_t i = 0; i < w->entries; i++)
		if (w->cnt[i])
			bound += 8 + (w->dense ? 2 * w->cnt[i] : dtc_sparse_bound(w->cnt[i]));
	if (dtc_chunk_info(w->data, w->len, &claimed, &codec) != DTC_OK || claimed > bound ||
	    dtc_chunk_view(w->data, w->len, &view, &raw_len) != DTC_OK || !view) {
		snprintf(err, errlen, "source %llx part %u: header, framing or checksum invalid",
			 (unsigned long long)w->src, w->part);
		return -EBADMSG;
	}
	w->voff = (size_t)(view - w->data);
	data = w->data + w->voff;
	/* Every entry checked before anything is written. */
	for (uint32_t i = 0; i < w->entries; i++) {
		uint64_t len, got = 0;

		if (!w->cnt[i])
			continue;
		if (raw_len - off < 8 || (len = jsink_get64(data + off)) > raw_len - off - 8 ||
		    (w->dense ? w->cnt[i] != w->e[i].box || len != 2 * w->cnt[i] ||
				((uintptr_t)(data + off + 8) & 1)
			      : dtc_sparse_payload_check(data + off + 8, (size_t)len, w->e[i].box,
							 &got) != DTC_OK || got != w->cnt[i])) {
			snprintf(err, errlen, "source %llx part %u entry %u: payload invalid",
				 (unsigned long long)w->src, w->part, w->first + i);
			return -EBADMSG;
		}
		off += 8 + len;
	}
	if (off != raw_len) {
		snprintf(err, errlen, "source %llx part %u: %zu bytes after the last entry",
			 (unsigned long long)w->src, w->part, raw_len - off);
		return -EBADMSG;
	}
	off = 0;
	for (uint32_t i = 0; i < w->entries; i++) {
		struct dbuf *b;
		uint64_t len, got = 0;
		int r;

		if (!w->cnt[i])
			continue;
		len = jsink_get64(data + off);
		off += 8;
		b = a->bufs[w->slot[i]];
		if (a->alter) {
			/* After every check (job_ext.h): the last value's high byte. */
			a->eng->ext.sink_alter(data + off + len - 1, 1);
			a->alter = 0;
		}
		if (w->dense) {
			uint64_t sn = 0;

			r = dtc_dense_swap_payload(dtc_backend_cpu(), &w->e[i].map, data + off,
						   (size_t)len, b->ptr, b->length, &sn);
			if (r == DTC_OK)
				a->dsum[w->slot[i]] += sn;
		} else {
			/* Swapped in, then read back: the sums get what the
			 * memory holds, not what the swap meant to write. */
			r = dtc_sparse_swap_payload(dtc_backend_cpu(), &w->e[i].map, data + off,
						    (size_t)len, b->ptr, b->length, &got, NULL);
			if (r == DTC_OK && a->skip &&
			    jsink_skip_one(a->eng->ext.apply_skip, &w->e[i].map, data + off,
					   (size_t)len, got, b->ptr))
				a->skip = 0;
		}
		if (r != DTC_OK) {
			snprintf(err, errlen, "source %llx part %u entry %u: %s",
				 (unsigned long long)w->src, w->part, w->first + i, dtc_strerror(r));
			return -EINVAL;
		}
		w->eidx[w->nswapped] = i;
		w->eoff[w->nswapped] = off;
		w->elen[w->nswapped] = len;
		w->nswapped++;
		if (!w->dense && (r = dtc_sparse_readback_payload(dtc_backend_cpu(), &w->e[i].map,
								  data + off, (size_t)len, b->ptr,
								  b->length, &got,
								  &a->delta[w->slot[i]])) != DTC_OK) {
			snprintf(err, errlen, "source %llx part %u entry %u: read back: %s",
				 (unsigned long long)w->src, w->part, w->first + i, dtc_strerror(r));
			return -EINVAL;
		}
		off += len;
	}
	return 0;
}

/* Worker (or the loop at shutdown, the workers drained): every swap
 * undone, last first.  What is undone is forgotten, so it never runs
 * twice over the same entry. */
static void undo_all(struct jarrive *a)
{
	for (size_t k = a->nsw; k-- > 0;) {
		struct jaswap *w = &a->sw[k];
		uint8_t *data;

		if (!w->nswapped)
			continue;
		/* Where the view was when it was swapped in (its checksum
		 * no longer holds: old values are in it). */
		data = w->data + w->voff;
		while (w->nswapped) {
			uint32_t m = w->nswapped - 1, i = w->eidx[m];
			struct dbuf *b = a->bufs[w->slot[i]];
			uint64_t got = 0, d = 0;

			if (w->dense) {
				(void)dtc_dense_swap_payload(dtc_backend_cpu(), &w->e[i].map,
							     data + w->eoff[m], (size_t)w->elen[m],
							     b->ptr, b->length, &d);
			} else {
				(void)dtc_sparse_swap_payload(dtc_backend_cpu(), &w->e[i].map,
							      data + w->eoff[m],
							      (size_t)w->elen[m], b->ptr, b->length,
							      &got, &d);
				a->delta[w->slot[i]] += d;	/* back to 0 once all are undone */
			}
			w->nswapped = m;
		}
	}
}

/* How many of the version's parts are dense. */
static size_t arrive_dense_parts(const struct jarrive *a)
{
	size_t n = 0;

	for (size_t k = 0; k < a->nsw; k++)
		n += a->sw[k].dense != 0;
	return n;
}

/* Worker: the sums of the version's boxes, as the apply checks them. */
static void arrive_verify(struct jarrive *a)
{
	struct jstaged *st = a->st;
	size_t dense = arrive_dense_parts(a);
	int incremental;

	a->key = jsink_verify_key(a->bufs, st);
	/* A dense part's changes are not in delta: no incremental sums. */
	incremental = a->vkey && a->key == a->vkey && a->since_full + 1 < a->full_every &&
		      !dense;
	if (dense && dense == a->nsw) {
		/* Every part dense, so every entry of the version (arrive_cover
		 * checked they cover the pairs) was swapped in whole and summed
		 * from the buffer right after its swap: that is the full pass
		 * over the boxes, already done part by part. */
		memcpy(a->sum, a->dsum, a->nbufs * sizeof(*a->sum));
	} else if (incremental) {
		for (size_t s = 0; s < a->nbufs; s++)
			a->sum[s] = a->vsum[s] + a->delta[s];
	} else if (jsink_full_sums(a->nbufs, a->bufs, st, a->sum) < 0) {
		a->failed = 1;
		snprintf(a->err, sizeof(a->err), "checksum failed: a box outside its buffer");
		return;
	}
	a->incremental = incremental;
	for (size_t s = 0; s < a->nbufs; s++) {
		if (!st->covered[s] || a->sum[s] == st->expect[s])
			continue;
		a->failed = 1;
		snprintf(a->err, sizeof(a->err), "buffer %s: checksum %016llx, expected %016llx (%s, "
			 "applied on arrival)", a->bufs[s]->name, (unsigned long long)a->sum[s],
			 (unsigned long long)st->expect[s], incremental ? "incremental" : "full pass");
		return;
	}
}

static void arrive_run(struct jtask *t)
{
	struct jarrive *a = (struct jarrive *)t;

	switch (a->op) {
	case JA_SWAP:
		a->swapped_parts = 0;
		for (size_t k = a->next; k < a->upto && !a->failed; k++) {
			if (swap_part(a, &a->sw[k], a->err, sizeof(a->err)) < 0)
				a->failed = 1;
			else
				a->swapped_parts++;
		}
		break;
	case JA_VERIFY:
		arrive_verify(a);
		break;
	case JA_UNDO:
		undo_all(a);
		break;
	}
}

static void arrive_done(struct jtask *t, int cancelled);

static void arrive_task(struct jarrive *a, enum ja_op op)
{
	a->op = op;
	a->busy = 1;
	a->t.run = arrive_run;
	a->t.done = arrive_done;
	jtask_start(a->eng, &a->t);
}

/* The sink is gone (or going): undo what is in the buffers and free, on a
 * worker while the loop runs, here when it no longer does (shutdown, the
 * workers drained). */
void jsink_arrive_orphan(struct jarrive *a)
{
	a->orphan = 1;
	if (a->busy)
		return;	/* its done comes back here */
	if (a->eng->stopping || !jio_workers(a->eng)) {
		undo_all(a);
		arrive_free(a);
		return;
	}
	arrive_task(a, JA_UNDO);
}

/* The version goes back: from arriving to undoing (failed: report reason
 * once undone, unless reported) or to retreating (staged as usual once
 * undone).  The undo starts when no task of it is on a worker. */
static void arrive_back(struct job *j, struct jlocal *l, struct jarrive *a, enum sink_vstate to,
			Dtep__ApplyResult result, const char *why)
{
	if (to == SINK_V_UNDOING && a->state != SINK_V_UNDOING) {
		struct jpend *p = pend_find(l, a->version);

		a->result = result;
		snprintf(a->why, sizeof(a->why), "%s", why ? why : "");
		if (p) {
			/* Later records of it are dropped (refused, data gone). */
			for (size_t i = 0; i < p->n; i++)
				jsink_pend_src_clear(&p->s[i]);
			p->refused = 1;
		}
		DLOG_W("job %s: sink %llx: version %llu applied on arrival fails (%s): undone",
		       j->name, (unsigned long long)l->info.id, (unsigned long long)a->version,
		       a->why);
	} else if (to == SINK_V_RETREATING) {
		DLOG_I("job %s: sink %llx: version %llu leaves apply on arrival (%s): undone, then "
		       "staged", j->name, (unsigned long long)l->info.id,
		       (unsigned long long)a->version, why);
	}
	a->state = to;
	arrive_kick(j, l);
}

/* One event for the sink's arriving version: the table decides, this
 * executes.  Returns the action. */
enum sink_vaction jsink_arrive_event(struct job *j, struct jlocal *l, enum sink_vevent ev,
				     Dtep__ApplyResult result, const char *why)
{
	struct jarrive *a = jsink_of(l)->arrive;
	enum sink_vaction act = sink_decide(l, a->version, a->state, ev);
	struct sink_step d = sink_sm_step(a->state, ev);

	switch (act) {
	case SINK_A_UNDO:
		if (d.next == SINK_V_GONE) {
			jsink_of(l)->arrive = NULL;
			jsink_of(l)->arrival_undos++;
			dmetrics_add(DM_APPLY_ON_ARRIVAL, "undo", 1);
			jsink_arrive_orphan(a);
		} else {
			arrive_back(j, l, a, SINK_V_UNDOING, result, why);
		}
		break;
	case SINK_A_RETREAT:
		arrive_back(j, l, a, SINK_V_RETREATING, 0, why);
		break;
	case SINK_A_REFUSE: {
		/* retreating × contradicts: refused now, undone as it goes */
		struct jpend *p = pend_find(l, a->version);

		if (p)
			jsink_pend_refuse_exec(j, l, p, why);
		a->reported = 1;
		a->state = SINK_V_UNDOING;
		break;
	}
	case SINK_A_CONTINUE:
	case SINK_A_DRAIN:
		if (d.next == SINK_V_GONE) {
			jsink_of(l)->arrive = NULL;
			jsink_arrive_orphan(a);
		} else {
			if (d.next == SINK_V_UNDOING && a->state != SINK_V_UNDOING && why)
				snprintf(a->why, sizeof(a->why), "%s", why);
			a->state = d.next;
		}
		break;
	default:
		break;
	}
	return act;
}

/* The version's every record in: the parts' ranges in entry order, no
 * overlap, every entry with a count inside one (decode_src's rules, on
 * the records' metadata).  0, or -1 with why. */
static int arrive_cover(const struct jpend *p, char *why, size_t whylen)
{
	for (size_t si = 0; si < p->n; si++) {
		const struct jpend_src *s = &p->s[si];
		const Dtep__Counts *c = s->counts;
		size_t covered = 0;

		for (uint32_t k = 0; k < s->nparts; k++) {
			const struct jpart *pt = NULL;

			for (size_t q = 0; q < s->nparts && !pt; q++)
				if (s->parts[q].part == k)
					pt = &s->parts[q];
			if (!pt || pt->first < covered) {
				snprintf(why, whylen, "source %llx: part %u missing or overlapping",
					 (unsigned long long)s->src, k);
				return -EPROTO;
			}
			for (size_t i = covered; i < pt->first; i++)
				if (c->counts[i])
					goto uncovered;
			covered = (size_t)pt->first + pt->entries;
		}
		for (size_t i = covered; i < c->n_counts; i++)
			if (c->counts[i])
				goto uncovered;
		continue;
uncovered:
		snprintf(why, whylen, "source %llx: an entry with a count that no part carries",
			 (unsigned long long)s->src);
		return -EPROTO;
	}
	return 0;
}

/* The version as staged in place: its entries' maps (for the sums and
 * for verify), what the sources' sums expect, its sources. */
static struct jstaged *arrive_staged(struct job *j, struct jlocal *l, const struct jpend *p,
				     char *why, size_t whylen)
{
	struct jstaged *st = calloc(1, sizeof(*st));
	size_t nw = 0, nb = l->nbufs ? l->nbufs : 1;

	for (size_t i = 0; i < p->n; i++)
		nw += p->s[i].counts->n_counts;
	if (!st || !(st->w = calloc(nw ? nw : 1, sizeof(*st->w))) ||
	    !(st->expect = calloc(nb, sizeof(*st->expect))) || !(st->covered = calloc(nb, 1)) ||
	    !(st->srcs = calloc(p->n ? p->n : 1, sizeof(*st->srcs))) ||
	    !(st->isum = calloc(nb, sizeof(*st->isum))))
		goto fail;
	st->version = p->version;
	st->in_place = 1;
	st->all_dense = jsink_pend_all_dense(p);
	for (size_t i = 0; i < p->n; i++) {
		const Dtep__Counts *c = p->s[i].counts;
		const struct jpair *pair = job_pair(j, p->s[i].src, l->info.id);

		st->srcs[st->nsrcs++] = p->s[i].src;
		if (!pair || pair->n != c->n_counts)
			goto fail;
		for (size_t e = 0; e < pair->n; e++) {
			struct jwrite *w = &st->w[st->n];
			const uint32_t *slot = NULL;

			for (size_t b = 0; b < l->nbufs; b++)
				if (l->buf_ids[b] == pair->e[e].dst_buf)
					slot = (const uint32_t *)&l->buf_ids[b];
			if (!slot)
				goto fail;
			w->dst_slot = (uint32_t)(slot - l->buf_ids);
			w->map = pair->e[e].map;
			w->n = c->counts[e];
			st->covered[w->dst_slot] = 1;
			st->n++;
		}
		for (size_t k = 0; k < c->n_checksums; k++) {
			size_t b;

			for (b = 0; b < l->nbufs && l->buf_ids[b] != c->checksums[k]->dst_buffer; b++)
				;
			if (b == l->nbufs)
				goto fail;
			st->expect[b] += c->checksums[k]->partial;
		}
	}
	return st;
fail:
	snprintf(why, whylen, "the version's entries or checksums name a buffer this sink lacks");
	if (st)
		jsink_staged_free(st);
	return NULL;
}

/* Start what the arriving version needs next, if no task of it runs. */
static void arrive_kick(struct job *j, struct jlocal *l)
{
	struct jsink *k = jsink_of(l);
	struct jarrive *a = k->arrive;
	struct jpend *p;
	char why[256];

	if (!a || a->busy || j->eng->stopping)
		return;
	if (a->state == SINK_V_UNDOING || a->state == SINK_V_RETREATING) {
		arrive_task(a, JA_UNDO);
		return;
	}
	p = pend_find(l, a->version);
	/* The parts that came (with their source's COUNTS) move to the
	 * jarrive here, with no task of it running: a worker never sees its
	 * array change. */
	for (size_t i = 0; p && i < p->n; i++) {
		for (size_t q = 0; q < p->s[i].nparts; q++) {
			struct jpart *pt = &p->s[i].parts[q];

			/* With its source's COUNTS, or describing itself. */
			if (!pt->data ||
			    (!p->s[i].counts && !arrive_part_fits(j, l, &p->s[i], pt)))
				continue;
			if (arrive_take(j, l, a, &p->s[i], pt) < 0) {
				jsink_arrive_event(j, l, SINK_EV_UNPARK, 0,
						   "a part it cannot take on arrival");
				return;
			}
		}
	}
	if (a->next < a->nsw) {
		a->upto = a->nsw;
		arrive_task(a, JA_SWAP);
		return;
	}
	if (!p || !jsink_pend_complete(p))
		return;
	if (arrive_cover(p, why, sizeof(why)) < 0) {
		jsink_arrive_event(j, l, SINK_EV_CONTRADICTS, DTEP__APPLY_RESULT__APPLY_REFUSED,
				   why);
		return;
	}
	if (sink_decide(l, a->version, a->state, SINK_EV_COMPLETE) != SINK_A_VERIFY)
		return;
	if (!(a->st = arrive_staged(j, l, p, why, sizeof(why)))) {
		jsink_arrive_event(j, l, SINK_EV_WORKER_FAILED, DTEP__APPLY_RESULT__APPLY_REFUSED,
				   why);
		return;
	}
	memcpy(a->vsum, k->vsum, l->nbufs * sizeof(*a->vsum));
	a->vkey = k->vkey;
	a->since_full = k->since_full;
	a->full_every = jsink_full_every(j->eng);
	arrive_task(a, JA_VERIFY);
}

/* Loop: a task of the arriving version came back. */
static void arrive_done(struct jtask *t, int cancelled)
{
	struct jarrive *a = (struct jarrive *)t;
	struct job *j = job_find(a->eng, a->job);
	struct jlocal *l = j ? job_local(j, a->participant) : NULL;
	struct jsink *k;

	a->busy = 0;
	if (l && (l->info.role != JROLE_SINK || jsink_of(l)->arrive != a))
		l = NULL;
	if (a->orphan || !l) {
		/* The sink went away: what is swapped in goes back (the
		 * undo's own done frees it). */
		if (a->op == JA_UNDO || cancelled) {
			if (cancelled)
				undo_all(a);	/* shutdown: the workers are drained */
			arrive_free(a);
		} else {
			jsink_arrive_orphan(a);
		}
		return;
	}
	if (cancelled)
		return;	/* shutdown: jsink_free undoes it */
	k = jsink_of(l);
	switch (a->op) {
	case JA_SWAP:
		k->arrival_parts += a->swapped_parts;
		dmetrics_add(DM_APPLY_ON_ARRIVAL, "part", (double)a->swapped_parts);
		a->next += a->swapped_parts;
		if (a->failed) {
			a->next = a->nsw;	/* the failed part's swapped entries are undone too */
			/* Arriving: → undoing (it kicks the undo itself).  Already
			 * undoing or retreating (the swap ran when it began): the
			 * undo goes on, kicked below. */
			if (jsink_arrive_event(j, l, SINK_EV_WORKER_FAILED,
					       DTEP__APPLY_RESULT__APPLY_REFUSED, a->err) !=
			    SINK_A_CONTINUE)
				return;
		}
		break;
	case JA_VERIFY:
		if (a->state != SINK_V_ARRIVING) {
			/* It left arrival while its sums ran: the undo goes on. */
			jsink_staged_free(a->st);
			a->st = NULL;
			break;
		}
		if (a->failed) {
			k->checksum_failures++;
			k->vkey = 0;
			jsink_arena_next(j, l, 1);	/* a dense repair follows */
			dmetrics_add(DM_CHECKSUM_FAILURES, NULL, 1);
			jsink_arrive_event(j, l, SINK_EV_WORKER_FAILED,
					   DTEP__APPLY_RESULT__APPLY_CHECKSUM_FAILED, a->err);
			return;
		}
		if (sink_decide(l, a->version, a->state, SINK_EV_WORKER_OK) == SINK_A_SEND_STAGED) {
			struct jstaged *st = a->st, **pp = &k->staged;
			struct jpend *p = pend_find(l, a->version);

			a->st = NULL;
			memcpy(st->isum, a->sum, l->nbufs * sizeof(*st->isum));
			st->ikey = a->key;
			while (*pp)
				pp = &(*pp)->next;
			*pp = st;
			k->held = st->version;
			k->arrive = NULL;
			if (p)
				jsink_pend_drop(l, p);	/* every part of it is in the buffers */
			k->arrival_versions++;
			dmetrics_add(DM_APPLY_ON_ARRIVAL, "version", 1);
			if (a->incremental)
				k->incremental_verifies++;
			else
				k->full_verifies++;
			dmetrics_add(DM_APPLY_VERIFY, a->incremental ? "incremental" : "full", 1);
			jsink_send_staged(j, l, st);
			DLOG_D("job %s: sink %llx version %llu applied on arrival (%zu parts), staged "
			       "in place", j->name, (unsigned long long)l->info.id,
			       (unsigned long long)st->version, a->nsw);
			arrive_free(a);
			jsink_try_stage(j, l);
			jev_sink_staged(j, l);
			jev_progress(j->eng);
		}
		return;
	case JA_UNDO:
		switch (sink_decide(l, a->version, a->state, SINK_EV_WORKER_OK)) {
		case SINK_A_SEND_FAILED:
			if (!a->reported) {
				j->refused++;
				dmetrics_add(DM_REFUSED, "bad_payload", 1);
				jsink_send_applied(j, l, a->version, a->srcs, a->nsrcs, a->result,
						   a->why, 0);
			}
			k->arrival_undos++;
			dmetrics_add(DM_APPLY_ON_ARRIVAL, "undo", 1);
			break;
		case SINK_A_RESTAGE: {
			/* The parts' bytes are as they arrived again: back into
			 * the pending version, staged as usual. */
			struct jpend *p = pend_find(l, a->version);

			for (size_t i = 0; p && i < a->nsw; i++) {
				struct jpend_src *s = jsink_pend_src(p, a->sw[i].src);

				for (size_t q = 0; s && q < s->nparts; q++) {
					if (s->parts[q].part == a->sw[i].part && !s->parts[q].data) {
						s->parts[q].data = a->sw[i].data;
						a->sw[i].data = NULL;
					}
				}
			}
			k->arrival_retreats++;
			dmetrics_add(DM_APPLY_ON_ARRIVAL, "retreat", 1);
			break;
		}
		default:
			break;
		}
		k->arrive = NULL;
		arrive_free(a);
		jsink_try_stage(j, l);
		jev_sink_staged(j, l);
		jev_progress(j->eng);
		return;
	}
	arrive_kick(j, l);
}

/* Take part pt of source s into the arriving version (its bytes move to
 * the jarrive): 0, or -1 when it cannot go on arrival (compressed) or
 * out of memory. */
static int arrive_take(struct job *j, struct jlocal *l, struct jarrive *a,
		       const struct jpend_src *s, struct jpart *pt)
{
	const struct jpair *pair = job_pair(j, s->src, l->info.id);
	struct jaswap *w;
	uint64_t claimed;
	int codec;

	if (!pair || pt->first + (uint64_t)pt->entries > pair->n || !pt->data ||
	    dtc_chunk_info(pt->data, pt->len, &claimed, &codec) != DTC_OK ||
	    codec != DTC_CODEC_RAW)
		return -EINVAL;
	if (a->nsw == a->cap) {
		size_t nc = a->cap ? 2 * a->cap : 8;
		void *np = realloc(a->sw, nc * sizeof(*a->sw));

		if (!np)
			return -ENOMEM;
		a->sw = np;
		a->cap = nc;
	}
	w = &a->sw[a->nsw];
	memset(w, 0, sizeof(*w));
	w->src = s->src;
	w->part = pt->part;
	w->first = pt->first;
	w->entries = pt->entries;
	w->dense = (s->counts ? (int)s->counts->mode : pt->mode) == DTEP__MODE__MODE_DENSE;
	if (!(w->e = malloc(pt->entries * sizeof(*w->e))) ||
	    !(w->cnt = malloc(pt->entries * sizeof(*w->cnt))) ||
	    !(w->slot = malloc(pt->entries * sizeof(*w->slot))) ||
	    !(w->eidx = malloc(pt->entries * sizeof(*w->eidx))) ||
	    !(w->eoff = malloc(pt->entries * sizeof(*w->eoff))) ||
	    !(w->elen = malloc(pt->entries * sizeof(*w->elen)))) {
		aswap_free(w);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < pt->entries; i++) {
		const struct jentry *e = &pair->e[pt->first + i];
		size_t b;

		for (b = 0; b < a->nbufs && a->buf_ids[b] != e->dst_buf; b++)
			;
		if (b == a->nbufs) {
			aswap_free(w);
			return -EINVAL;
		}
		w->e[i] = *e;
		/* COUNTS, or the part's own (equal once COUNTS comes:
		 * pend_src_check) */
		w->cnt[i] = s->counts ? s->counts->counts[pt->first + i] : pt->cnt[i];
		w->slot[i] = (uint32_t)b;
	}
	w->data = pt->data;
	w->len = pt->len;
	pt->data = NULL;	/* the jarrive's now; the record stays counted */
	a->nsw++;
	return 0;
}

/* Whether src's pair into l swaps element by element (every map
 * injective: no destination element written twice). */
static int arrive_pair_ok(struct job *j, struct jlocal *l, uint64_t src)
{
	const struct jpair *pair = job_pair(j, src, l->info.id);

	if (!pair)
		return 0;
	for (size_t i = 0; i < pair->n; i++)
		if (!dtc_map_injective(&pair->e[i].map))
			return 0;
	return 1;
}

/* Whether a record of this mode and base goes onto what l holds: dense
 * replaces every element whatever the buffers hold; sparse needs them at
 * its base. */
static int arrive_base_ok(const struct jlocal *l, int mode, uint64_t base)
{
	return mode == DTEP__MODE__MODE_DENSE ||
	       (mode == DTEP__MODE__MODE_SPARSE && base == jsink_cof(l)->applied);
}

/* Whether source s's COUNTS lets its version go on arrival at l. */
static int arrive_fits(struct job *j, struct jlocal *l, const struct jpend_src *s)
{
	const Dtep__Counts *c = s->counts;

	return c && arrive_base_ok(l, c->mode, c->base_version) && arrive_pair_ok(j, l, s->src);
}

/* Whether part pt of source s can be swapped in at l before its COUNTS:
 * it describes itself (PAYLOAD.counts) as a delta on what l holds. */
static int arrive_part_fits(struct job *j, struct jlocal *l, const struct jpend_src *s,
			    const struct jpart *pt)
{
	return pt->cnt && arrive_base_ok(l, pt->mode, pt->base) && arrive_pair_ok(j, l, s->src);
}

/* Whether sink l can take version p on arrival now: parked, nothing
 * staged, staging or applying, its buffers host memory it applies from
 * payload bytes. */
static int arrive_can_start(struct job *j, struct jlocal *l, const struct jpend *p)
{
	const struct jsink *k = jsink_of(l);

	if (!k->parked || k->arrive || k->staged || k->staging || k->applying ||
	    k->held != k->applied || j->eng->stopping || !jio_workers(j->eng) || p->refused || k->w ||
	    p->version <= k->held)
		return 0;
	for (size_t b = 0; b < l->nbufs; b++)
		if (!jsink_keep_encoded(j, l, l->bufs[b]))
			return 0;
	for (size_t i = 0; i < p->n; i++)
		if (p->s[i].counts && !arrive_fits(j, l, &p->s[i]))
			return 0;
	return 1;
}

static struct jarrive *arrive_new(struct job *j, struct jlocal *l, const struct jpend *p)
{
	struct jarrive *a = calloc(1, sizeof(*a));
	size_t nb = l->nbufs ? l->nbufs : 1;

	if (!a || !(a->bufs = calloc(nb, sizeof(*a->bufs))) ||
	    !(a->buf_ids = malloc(nb * sizeof(*a->buf_ids))) ||
	    !(a->delta = calloc(nb, sizeof(*a->delta))) ||
	    !(a->dsum = calloc(nb, sizeof(*a->dsum))) ||
	    !(a->srcs = calloc(p->n ? p->n : 1, sizeof(*a->srcs))) ||
	    !(a->vsum = calloc(nb, sizeof(*a->vsum))) || !(a->sum = calloc(nb, sizeof(*a->sum))) ||
	    (!jsink_of(l)->vsum && !(jsink_of(l)->vsum = calloc(nb, sizeof(uint64_t))))) {
		arrive_free(a);
		return NULL;
	}
	a->eng = j->eng;
	snprintf(a->job, sizeof(a->job), "%s", j->name);
	a->participant = l->info.id;
	a->version = p->version;
	a->state = SINK_V_ARRIVING;
	/* What an undo reports unless a failure says more (never "ok"). */
	a->result = DTEP__APPLY_RESULT__APPLY_REFUSED;
	snprintf(a->why, sizeof(a->why), "undone after apply on arrival");
	for (size_t b = 0; b < l->nbufs; b++) {
		a->bufs[b] = l->bufs[b];
		dbuf_ref(a->bufs[b]);
		a->buf_ids[b] = l->buf_ids[b];
	}
	a->nbufs = l->nbufs;
	for (size_t i = 0; i < p->n; i++)
		a->srcs[a->nsrcs++] = p->s[i].src;
	/* On the loop (it may log), once per version (job_ext.h). */
	a->alter = j->eng->ext.sink_select && j->eng->ext.sink_alter &&
		   j->eng->ext.sink_select(p->version);
	a->skip = j->eng->ext.apply_select && j->eng->ext.apply_skip &&
		  j->eng->ext.apply_select(p->version);
	return a;
}

/* A record of version p (from source s; counts: it was its COUNTS) was
 * kept: what it does to apply on arrival. */
void jsink_arrive_record(struct job *j, struct jlocal *l, struct jpend *p, struct jpend_src *s,
			 int counts)
{
	struct jsink *k = jsink_of(l);
	struct jarrive *a = k->arrive;

	if (p->refused)
		return;
	if (a && a->version != p->version) {
		/* A newer version coming: the arriving one must not hold it
		 * up (nothing else stages while it is in the buffers). */
		if (p->version > a->version && a->state == SINK_V_ARRIVING)
			jsink_arrive_event(j, l, SINK_EV_UNPARK, 0, "a newer version arrives");
		return;
	}
	if (!a) {
		/* Started by COUNTS, or by a part that describes itself. */
		if ((!counts && !(s->nparts && arrive_part_fits(j, l, s, &s->parts[s->nparts - 1]))) ||
		    !arrive_can_start(j, l, p) ||
		    sink_decide(l, p->version, jsink_pend_state(p), SINK_EV_PARKED) !=
			    SINK_A_ARRIVE ||
		    !(a = arrive_new(j, l, p)))
			return;
		k->arrive = a;
		DLOG_D("job %s: sink %llx parked: version %llu applied on arrival", j->name,
		       (unsigned long long)l->info.id, (unsigned long long)p->version);
		arrive_kick(j, l);	/* takes the parts that came before */
		return;
	}
	if (a->state != SINK_V_ARRIVING)
		return;	/* undoing: dropped (refused); retreating: kept in p */
	if (counts && !arrive_fits(j, l, s)) {
		jsink_arrive_event(j, l, SINK_EV_UNPARK, 0, "a COUNTS on another base");
		return;
	}
	/* arriving × record: swapped in, in arrival order (arrive_kick takes
	 * it once its source's COUNTS is in and no task of it runs) */
	if (sink_decide(l, p->version, a->state, SINK_EV_RECORD) != SINK_A_SWAP)
		return;
	arrive_kick(j, l);
}

int jsink_park_ending(struct job *j, struct jlocal *l)
{
	struct jarrive *a = jsink_of(l)->arrive;

	if (!a)
		return 0;
	if (a->state == SINK_V_ARRIVING)
		jsink_arrive_event(j, l, SINK_EV_UNPARK, 0, "its park ends");
	return jsink_of(l)->arrive != NULL;
}

/* Sinks parked in the engine (e->parked_total: the dted_sinks_parked
 * gauge). */
void jsink_parked(struct dte_engine *e, struct jlocal *l)
{
	jsink_of(l)->parked++;
	dmetrics_set(DM_SINKS_PARKED, NULL, (double)++e->parked_total);
}

void jsink_unparked(struct dte_engine *e, struct jlocal *l)
{
	if (!jsink_of(l)->parked)
		return;
	jsink_of(l)->parked--;
	if (e->parked_total)
		e->parked_total--;
	dmetrics_set(DM_SINKS_PARKED, NULL, (double)e->parked_total);
}
