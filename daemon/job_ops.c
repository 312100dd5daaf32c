/* daemon/job_ops.c — `dtectl verify` and `dtectl resync` on the sync
 * engine, and the bookkeeping they need (job_ops.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_state.h"
#include "daemon/job_task.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "gpu/elem.h"

#define FAIL(rc, ...) derr_fail(err, errlen, rc, __VA_ARGS__)

/* What a local sink's buffers must hold: kept at every apply. */
struct jverify {
	const struct jlocal *l;   /* key; dropped in jops_sink_free */
	uint64_t version;
	size_t nbufs;
	uint64_t *expect;         /* per buffer slot */
	uint8_t *covered;
	struct dte_box_map *maps; /* every entry written into the sink */
	uint32_t *slots;
	size_t nmaps;
	struct jverify *next;
};

/* Kept in the engine (verifies), newest first. */
static void jverify_free(struct jverify *v)
{
	free(v->expect);
	free(v->covered);
	free(v->maps);
	free(v->slots);
	free(v);
}

void jops_fini(struct dte_engine *e)
{
	while (e->verifies) {
		struct jverify *v = e->verifies;

		e->verifies = v->next;
		jverify_free(v);
	}
}

void jops_sink_free(struct dte_engine *e, struct jlocal *l)
{
	for (struct jverify **pp = &e->verifies; *pp; pp = &(*pp)->next) {
		if ((*pp)->l == l) {
			struct jverify *v = *pp;

			*pp = v->next;
			jverify_free(v);
			return;
		}
	}
}

void jops_applied(struct dte_engine *e, struct jlocal *l, const struct jstaged *st)
{
	struct jverify *v = calloc(1, sizeof(*v));
	size_t nb = l->nbufs ? l->nbufs : 1;

	jops_sink_free(e, l);
	if (!v)
		return;
	v->l = l;
	v->version = st->version;
	v->nbufs = l->nbufs;
	v->nmaps = st->n;
	v->expect = malloc(nb * sizeof(*v->expect));
	v->covered = malloc(nb);
	v->maps = malloc((st->n ? st->n : 1) * sizeof(*v->maps));
	v->slots = malloc((st->n ? st->n : 1) * sizeof(*v->slots));
	if (!v->expect || !v->covered || !v->maps || !v->slots) {
		/* Without it verify says "unapplied"; nothing else depends on it. */
		jverify_free(v);
		return;
	}
	memcpy(v->expect, st->expect, l->nbufs * sizeof(*v->expect));
	memcpy(v->covered, st->covered, l->nbufs);
	for (size_t i = 0; i < st->n; i++) {
		v->maps[i] = st->w[i].map;
		v->slots[i] = st->w[i].dst_slot;
	}
	v->next = e->verifies;
	e->verifies = v;
}

static const struct jverify *verify_find(const struct dte_engine *e, const struct jlocal *l)
{
	for (const struct jverify *v = e->verifies; v; v = v->next)
		if (v->l == l)
			return v;
	return NULL;
}

/* Σ mix(index, bits) over the box's destination elements, as the sink
 * checks after apply (job_sink_apply.c): an odometer over all but the last dim.
 * Every index is checked against the buffer: a map is only trusted as
 * far as the memory it names. */
static int box_sum(const struct dte_box_map *m, const uint16_t *dst, uint64_t len,
		   uint64_t *out)
{
	int64_t idx[DTE_MAX_DIMS] = { 0 };
	int last = (int)m->ndim - 1, d;
	uint64_t sum = 0;

	if (m->ndim < 1 || m->ndim > DTE_MAX_DIMS)
		return -EINVAL;
	for (d = 0; d <= last; d++)
		if (m->extent[d] <= 0)
			return *out = 0, 0;
	for (;;) {
		int64_t base = m->dst_offset;

		for (d = 0; d < last; d++)
			base += idx[d] * m->dst_stride[d];
		for (int64_t i = 0; i < m->extent[last]; i++) {
			int64_t at = base + i * m->dst_stride[last];

			if (at < 0 || (uint64_t)at >= len)
				return -ERANGE;
			sum += dtc_csum_term((uint64_t)at, dst[at]);
		}
		for (d = last - 1; d >= 0 && ++idx[d] == m->extent[d]; d--)
			idx[d] = 0;
		if (d < 0)
			break;
	}
	*out = sum;
	return 0;
}

/* Pairs of j feeding sink dst whose source is on this daemon: dense at the
 * next version.  Returns how many. */
static uint32_t force_dense_local(struct job *j, uint64_t dst, int resync)
{
	uint32_t n = 0;

	for (size_t i = 0; i < j->npairs; i++) {
		struct jpair *p = &j->pairs[i];

		if ((dst && p->dst != dst) || !job_local(j, p->src))
			continue;
		pair_sm_event(&p->sm, resync ? PAIR_EV_RESYNC : PAIR_EV_REPAIR, 0, 0);
		n++;
	}
	return n;
}

/* Tell the other daemons feeding local sink l that it needs a dense
 * version, with the record a sink uses for a failed apply.  Returns the
 * number of daemons told. */
static uint32_t tell_remote_sources(struct job *j, const struct jlocal *l, uint64_t version,
				    Dtep__ApplyResult result, const char *why)
{
	const char *sent[64];
	uint32_t nsent = 0;
	Dtep__Applied m = DTEP__APPLIED__INIT;
	Dtep__JobRef ref;

	job_fill_ref(j, &ref);
	m.job = &ref;
	m.version = version;
	m.dst = l->info.id;
	m.result = result;
	m.message = (char *)why;
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpinfo *p;
		uint32_t k;

		if (j->pairs[i].dst != l->info.id || job_local(j, j->pairs[i].src))
			continue;
		p = job_part(j, j->pairs[i].src);
		if (!p)
			continue;
		for (k = 0; k < nsent && strcmp(sent[k], p->node); k++)
			;
		if (k < nsent || nsent == 64)
			continue;
		sent[nsent++] = p->node;
		job_send_to_node(j, p->node, DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED, &m.base, NULL, 0);
	}
	return nsent;
}

/* ---------------------------------------------------------------- verify
 * `dtectl verify` sums every local sink's buffers over the boxes of the
 * version it applied last: a whole-model pass, so it runs on a worker
 * (job_task.c) and its answer is deferred, like an apply's.  The task
 * copies each sink's record (maps, slots, expected sums) and references
 * its buffers; the loop, back in verify_done, looks each sink up again:
 * one that went away, or that started an apply meanwhile (its buffers
 * changed under the sum), is reported "skipped", never "mismatch". */
struct vsink {
	uint64_t id;
	uint32_t rank, replica;
	uint64_t version;
	uint64_t gen;             /* the sink's apply_gen when the task started */
	const char *result;       /* set on the loop: not summed (unapplied, skipped) */
	const char *detail;
	size_t nbufs;
	struct dbuf **bufs;       /* referenced until the task ends */
	uint64_t *expect;
	uint8_t *covered;
	struct dte_box_map *maps;
	uint32_t *slots;
	size_t nmaps;
	/* worker results */
	uint32_t buffers, mismatched;
	char first[256];          /* the first mismatching buffer */
};

struct jvtask {
	struct jtask t;
	char job[JOB_NAME_MAX];
	struct jreq rq;           /* answered here */
	double work_ms;           /* the sums, on the worker */
	struct vsink *s;
	size_t n;
};

static void jvtask_free(struct jvtask *v)
{
	for (size_t i = 0; i < v->n; i++) {
		struct vsink *k = &v->s[i];

		for (size_t b = 0; b < k->nbufs; b++)
			if (k->bufs[b])
				dbuf_unref(k->bufs[b]);
		free(k->bufs);
		free(k->expect);
		free(k->covered);
		free(k->maps);
		free(k->slots);
	}
	free(v->s);
	free(v);
}

/* Loop: what the worker needs of sink l, or a result without a sum. */
static int vsink_fill(const struct dte_engine *e, struct vsink *k, const struct jlocal *l)
{
	const struct jverify *v = verify_find(e, l);
	size_t nb = l->nbufs ? l->nbufs : 1;

	k->id = l->info.id;
	k->rank = l->info.rank;
	k->replica = l->info.replica;
	k->gen = jsink_cof(l)->apply_gen;
	if (!v) {
		k->result = "unapplied";
		k->detail = "no version applied since it attached";
		return 0;
	}
	k->version = v->version;
	if (jsink_cof(l)->applying) {
		k->result = "skipped";
		k->detail = "an apply is running; verify again after it";
		return 0;
	}
	for (size_t s = 0; s < v->nbufs && s < l->nbufs; s++) {
		const struct dbuf *b = l->bufs[s];

		if (v->covered[s] && (!b || b->cuda || !b->ptr)) {
			k->result = "skipped";
			k->detail = "GPU buffers are verified at apply only";
			return 0;
		}
	}
	k->nbufs = v->nbufs < l->nbufs ? v->nbufs : l->nbufs;
	k->nmaps = v->nmaps;
	if (!(k->bufs = calloc(nb, sizeof(*k->bufs))) ||
	    !(k->expect = malloc(nb * sizeof(*k->expect))) || !(k->covered = malloc(nb)) ||
	    !(k->maps = malloc((v->nmaps ? v->nmaps : 1) * sizeof(*k->maps))) ||
	    !(k->slots = malloc((v->nmaps ? v->nmaps : 1) * sizeof(*k->slots))))
		return -ENOMEM;
	memcpy(k->expect, v->expect, k->nbufs * sizeof(*k->expect));
	memcpy(k->covered, v->covered, k->nbufs);
	memcpy(k->maps, v->maps, v->nmaps * sizeof(*k->maps));
	memcpy(k->slots, v->slots, v->nmaps * sizeof(*k->slots));
	for (size_t s = 0; s < k->nbufs; s++) {
		k->bufs[s] = l->bufs[s];
		if (k->bufs[s])
			dbuf_ref(k->bufs[s]);
	}
	return 0;
}

/* Worker: the sums. */
static void verify_run(struct jtask *t)
{
	struct jvtask *v = (struct jvtask *)t;
	uint64_t t0 = jio_now(t->eng);

	for (size_t i = 0; i < v->n; i++) {
		struct vsink *k = &v->s[i];

		if (k->result)
			continue;
		for (size_t s = 0; s < k->nbufs; s++) {
			const struct dbuf *b = k->bufs[s];
			uint64_t sum = 0, part = 0;
			int bad = 0;

			if (!k->covered[s])
				continue;
			k->buffers++;
			for (size_t m = 0; m < k->nmaps && !bad; m++) {
				if (k->slots[m] != s)
					continue;
				if (box_sum(&k->maps[m], b->ptr, b->length, &part) < 0)
					bad = 1;
				else
					sum += part;
			}
			if ((bad || sum != k->expect[s]) && !k->mismatched++)
				snprintf(k->first, sizeof(k->first),
					 "buffer %s: checksum %016llx, expected %016llx", b->name,
					 (unsigned long long)sum, (unsigned long long)k->expect[s]);
		}
	}
	v->work_ms = job_ms_since(t->eng, t0);
}

/* Loop: a sink's mismatch counts as a failed apply does. */
static void verify_mismatch(struct job *j, struct jlocal *l, const struct vsink *k)
{
	jsink_of(l)->checksum_failures++;
	jsink_of(l)->vkey = 0;	/* the next apply verifies in full */
	dmetrics_add(DM_CHECKSUM_FAILURES, NULL, 1);
	DLOG_E("job %s: verify: sink %llx version %llu: %u of %u buffers differ (%s); dense repair "
	       "requested", j->name, (unsigned long long)l->info.id, (unsigned long long)k->version,
	       k->mismatched, k->buffers, k->first);
	force_dense_local(j, l->info.id, 0);
	tell_remote_sources(j, l, k->version, DTEP__APPLY_RESULT__APPLY_CHECKSUM_FAILED,
			    "verify: checksum mismatch");
}

static void verify_done(struct jtask *t, int cancelled)
{
	struct jvtask *v = (struct jvtask *)t;
	struct job *j = job_find(t->eng, v->job);
	struct jres res = { .op = JOP_VERIFY };
	struct jverify_res *rep = &res.verify;
	struct jverify_sink *sv = calloc(v->n ? v->n : 1, sizeof(*sv));

	if (!j || !sv || cancelled) {
		job_done(&v->rq, !j ? -ENOENT : cancelled ? -EBUSY : -ENOMEM,
			 !j ? "the job went away during the verify" :
			 cancelled ? "the daemon is shutting down" : "out of memory", NULL);
		free(sv);
		jvtask_free(v);
		return;
	}
	rep->job = j->name;
	for (size_t i = 0; i < v->n; i++) {
		struct vsink *k = &v->s[i];
		struct jlocal *l = job_local(j, k->id);
		struct jverify_sink *o = &sv[i];

		o->participant = k->id;
		o->rank = k->rank;
		o->replica = k->replica;
		o->version = k->version;
		if (!k->result && !l) {
			k->result = "skipped";
			k->detail = "the sink went away during the verify";
		} else if (!k->result && (jsink_of(l)->apply_gen != k->gen || jsink_of(l)->applying)) {
			k->result = "skipped";
			k->detail = "an apply ran during the verify; verify again";
		} else if (!k->result) {
			k->result = k->mismatched ? "mismatch" : "ok";
			o->buffers = k->buffers;
			o->mismatched = k->mismatched;
			if (k->mismatched) {
				k->detail = k->first;
				verify_mismatch(j, l, k);
			}
		}
		o->result = k->result;
		o->detail = k->detail ? k->detail : "";
		rep->n_results++;
		rep->sinks++;
		if (!strcmp(o->result, "ok")) {
			rep->ok++;
			dmetrics_add(DM_VERIFY, "ok", 1);
		} else if (!strcmp(o->result, "mismatch")) {
			rep->mismatch++;
			dmetrics_add(DM_VERIFY, "mismatch", 1);
		}
	}
	rep->results = sv;
	DLOG_I("job %s: verify of %u sinks: %u ok, %u mismatch; summed on a worker in %.1f ms",
	       j->name, rep->sinks, rep->ok, rep->mismatch, v->work_ms);
	job_done(&v->rq, 0, "", &res);
	free(sv);
	jvtask_free(v);
}

int job_verify(struct dte_engine *e, const struct jreq *rq, const char *name,
	       struct jverify_res *rep, int *deferred, char *err, size_t errlen)
{
	struct job *j = job_find(e, name);
	struct jvtask *v;
	size_t n = 0;

	if (!name || !*name)
		return FAIL(-EINVAL, "verify: name a job");
	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", name);
	rep->job = j->name;
	for (struct jlocal *l = j->locals; l; l = l->next)
		n += l->info.role == JROLE_SINK;
	if (!n) {
		snprintf(rep->note, sizeof(rep->note), "job %s has no sink on this daemon; verify "
			 "runs where the sinks are", j->name);
		return 0;
	}
	if (e->stopping)
		return FAIL(-EBUSY, "the daemon is shutting down");
	if (!(v = calloc(1, sizeof(*v))) || !(v->s = calloc(n, sizeof(*v->s)))) {
		free(v);
		return FAIL(-ENOMEM, "out of memory");
	}
	snprintf(v->job, sizeof(v->job), "%s", j->name);
	v->rq = *rq;
	for (struct jlocal *l = j->locals; l; l = l->next) {
		if (l->info.role != JROLE_SINK)
			continue;
		if (vsink_fill(e, &v->s[v->n++], l) < 0) {
			jvtask_free(v);
			return FAIL(-ENOMEM, "out of memory");
		}
	}
	v->t.run = verify_run;
	v->t.done = verify_done;
	*deferred = 1;
	jtask_start(e, &v->t);
	return 0;
}

int job_resync(struct dte_engine *e, const char *job, uint64_t sink, struct jresync_res *rep,
	       char *err, size_t errlen)
{
	struct job *j = job_find(e, job);
	int known = !sink;

	if (!job || !*job)
		return FAIL(-EINVAL, "resync: name a job");
	if (!j)
		return FAIL(-ENOENT, "unknown job \"%s\"", job);
	if (sink) {
		const struct jpinfo *p = job_part(j, sink);

		known = p && p->role == JROLE_SINK;
		if (!known)
			return FAIL(-ENOENT,
				    "job %s has no sink participant %llu (see `dtectl job %s`)",
				    j->name, (unsigned long long)sink, j->name);
	}
	rep->job = j->name;
	rep->pairs = force_dense_local(j, sink, 1);
	for (struct jlocal *l = j->locals; l; l = l->next) {
		if (l->info.role != JROLE_SINK || (sink && l->info.id != sink))
			continue;
		if (tell_remote_sources(j, l, jsink_of(l)->applied, DTEP__APPLY_RESULT__APPLY_REFUSED,
					"resync requested by an operator"))
			rep->remote++;
	}
	dmetrics_add(DM_RESYNCS, NULL, rep->pairs);
	DLOG_N("job %s: resync of %s: %u local pairs dense at the next version, %u sinks' remote "
	       "sources told", j->name, sink ? "one sink" : "every sink", rep->pairs, rep->remote);
	return 0;
}
