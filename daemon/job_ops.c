/* daemon/job_ops.c — `dtectl verify` and `dtectl resync` on the sync
 * engine, and the bookkeeping they need (job_ops.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/dispatch.h"
#include "daemon/job_int.h"
#include "daemon/job_ops.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "gpu/elem.h"

#define FAIL(code, ...) jfail(err, errlen, code, __VA_ARGS__)

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

static struct jverify *verifies;

static void jverify_free(struct jverify *v)
{
	free(v->expect);
	free(v->covered);
	free(v->maps);
	free(v->slots);
	free(v);
}

void jops_fini(void)
{
	while (verifies) {
		struct jverify *v = verifies;

		verifies = v->next;
		jverify_free(v);
	}
}

void jops_sink_free(struct jlocal *l)
{
	for (struct jverify **pp = &verifies; *pp; pp = &(*pp)->next) {
		if ((*pp)->l == l) {
			struct jverify *v = *pp;

			*pp = v->next;
			jverify_free(v);
			return;
		}
	}
}

void jops_applied(struct jlocal *l, const struct jstaged *st)
{
	struct jverify *v = calloc(1, sizeof(*v));
	size_t nb = l->nbufs ? l->nbufs : 1;

	jops_sink_free(l);
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
	v->next = verifies;
	verifies = v;
}

static const struct jverify *verify_find(const struct jlocal *l)
{
	for (const struct jverify *v = verifies; v; v = v->next)
		if (v->l == l)
			return v;
	return NULL;
}

/* Σ mix(index, bits) over the box's destination elements, as the sink
 * checks after apply (job_sink.c): an odometer over all but the last dim.
 * Every index is checked against the buffer: a map is only trusted as
 * far as the memory it names. */
static int box_sum(const struct dte_box_map *m, const uint16_t *dst, uint64_t len,
		   uint64_t *out)
{
	int64_t idx[DTE_MAX_DIMS] = { 0 };
	int last = (int)m->ndim - 1, d;
	uint64_t sum = 0;

	if (m->ndim < 1 || m->ndim > DTE_MAX_DIMS)
		return -1;
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
				return -1;
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

static void verify_one(struct job *j, struct jlocal *l, Dte__SinkVerify *out, struct dreply *r)
{
	const struct jverify *v = verify_find(l);
	char detail[256] = "";

	out->participant = l->info.id;
	out->rank = l->info.rank;
	out->replica = l->info.replica;
	if (!v) {
		out->result = "unapplied";
		out->detail = "no version applied since it attached";
		return;
	}
	out->version = v->version;
	for (size_t s = 0; s < v->nbufs && s < l->nbufs; s++) {
		const struct dbuf *b = l->bufs[s];
		uint64_t sum = 0, part = 0;
		int bad = 0;

		if (!v->covered[s])
			continue;
		if (!b || b->cuda || !b->ptr) {
			out->result = "skipped";
			out->detail = "GPU buffers are verified at apply only";
			return;
		}
		out->buffers++;
		for (size_t i = 0; i < v->nmaps && !bad; i++) {
			if (v->slots[i] != s)
				continue;
			if (box_sum(&v->maps[i], b->ptr, b->length, &part) < 0)
				bad = 1;
			else
				sum += part;
		}
		if (bad || sum != v->expect[s]) {
			if (!out->mismatched++)
				snprintf(detail, sizeof(detail), "buffer %s: checksum %016llx, expected %016llx",
					 b->name, (unsigned long long)sum, (unsigned long long)v->expect[s]);
		}
	}
	out->result = out->mismatched ? "mismatch" : "ok";
	if (detail[0])
		out->detail = dreply_strdup(r, detail);
	if (!out->mismatched)
		return;
	l->checksum_failures++;
	l->vkey = 0;	/* the next apply verifies in full */
	dmetrics_add(DM_CHECKSUM_FAILURES, NULL, 1);
	DLOG_E("job %s: verify: sink %llx version %llu: %u of %u buffers differ (%s); dense repair "
	       "requested", j->name, (unsigned long long)l->info.id, (unsigned long long)v->version,
	       out->mismatched, out->buffers, detail);
	force_dense_local(j, l->info.id, 0);
	tell_remote_sources(j, l, v->version, DTEP__APPLY_RESULT__APPLY_CHECKSUM_FAILED,
			    "verify: checksum mismatch");
}

Dte__Status job_verify(const char *name, Dte__VerifyReply *rep, struct dreply *r, char *err,
		       size_t errlen)
{
	struct job *j = job_find(name);
	size_t n = 0;

	if (!name || !*name)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID, "verify: name a job");
	if (!j)
		return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND, "unknown job \"%s\"", name);
	rep->job = j->name;
	for (struct jlocal *l = j->locals; l; l = l->next)
		n += l->info.role == JROLE_SINK;
	if (n) {
		rep->results = dreply_alloc(r, n * sizeof(*rep->results));
		if (!rep->results)
			return FAIL(DTE__STATUS__STATUS_ERR_INTERNAL, "out of memory");
	}
	for (struct jlocal *l = j->locals; l; l = l->next) {
		Dte__SinkVerify *sv;

		if (l->info.role != JROLE_SINK)
			continue;
		sv = dreply_alloc(r, sizeof(*sv));
		if (!sv)
			return FAIL(DTE__STATUS__STATUS_ERR_INTERNAL, "out of memory");
		dte__sink_verify__init(sv);
		verify_one(j, l, sv, r);
		rep->results[rep->n_results++] = sv;
		rep->sinks++;
		if (!strcmp(sv->result, "ok")) {
			rep->ok++;
			dmetrics_add(DM_VERIFY, "ok", 1);
		} else if (!strcmp(sv->result, "mismatch")) {
			rep->mismatch++;
			dmetrics_add(DM_VERIFY, "mismatch", 1);
		}
	}
	if (!n)
		dreply_msg(r, "job %s has no sink on this daemon; verify runs where the sinks are",
			   j->name);
	return DTE__STATUS__STATUS_OK;
}

Dte__Status job_resync(const Dte__ResyncRequest *rq, Dte__ResyncReply *rep, char *err,
		       size_t errlen)
{
	struct job *j = job_find(rq->job);
	int known = !rq->sink;

	if (!rq->job || !*rq->job)
		return FAIL(DTE__STATUS__STATUS_ERR_INVALID, "resync: name a job");
	if (!j)
		return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND, "unknown job \"%s\"", rq->job);
	if (rq->sink) {
		const struct jpinfo *p = job_part(j, rq->sink);

		known = p && p->role == JROLE_SINK;
		if (!known)
			return FAIL(DTE__STATUS__STATUS_ERR_NOT_FOUND,
				    "job %s has no sink participant %llu (see `dtectl job %s`)",
				    j->name, (unsigned long long)rq->sink, j->name);
	}
	rep->job = j->name;
	rep->pairs = force_dense_local(j, rq->sink, 1);
	for (struct jlocal *l = j->locals; l; l = l->next) {
		if (l->info.role != JROLE_SINK || (rq->sink && l->info.id != rq->sink))
			continue;
		if (tell_remote_sources(j, l, l->applied, DTEP__APPLY_RESULT__APPLY_REFUSED,
					"resync requested by an operator"))
			rep->remote++;
	}
	dmetrics_add(DM_RESYNCS, NULL, rep->pairs);
	DLOG_N("job %s: resync of %s: %u local pairs dense at the next version, %u sinks' remote "
	       "sources told", j->name, rq->sink ? "one sink" : "every sink", rep->pairs, rep->remote);
	return DTE__STATUS__STATUS_OK;
}
