/* daemon/job_sink_aoa.c — apply on arrival (docs/SYNC.md): a parked
 * sink's version swapped into its buffers part by part on a worker as it
 * arrives, its sums, and its undo (failed) or retreat (undone, then
 * staged as usual).
 *
 * Calls: job_sink_stage.c (staged as usual, STAGED), job_sink_apply.c
 * (the sums), job_sink_version.c, job_task.c, job_state.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_cuda.h"
#include "daemon/job_ext.h"
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_task.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

/* A part of the version on arrival (struct jarrive, job_sink_int.h). */
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
		/* Worded as the staging path's (job_sink_stage.c): an operator
		 * or a test matches one phrase whichever path saw it. */
		snprintf(err, errlen, "source %llx: payload corrupt (header, framing or checksum) "
			 "in part %u", (unsigned long long)w->src, w->part);
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

			r = jdev_dense_swap_payload(&w->e[i].map, data + off,
						   (size_t)len, b->ptr, b->length, &sn);
			if (r == DTC_OK)
				a->dsum[w->slot[i]] += sn;
		} else {
			/* Swapped in, then read back: the sums get what the
			 * memory holds, not what the swap meant to write. */
			r = jdev_sparse_swap_payload(&w->e[i].map, data + off,
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
		if (!w->dense && (r = jdev_sparse_readback_payload(&w->e[i].map,
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
				(void)jdev_dense_swap_payload(&w->e[i].map,
							     data + w->eoff[m], (size_t)w->elen[m],
							     b->ptr, b->length, &d);
			} else {
				(void)jdev_sparse_swap_payload(&w->e[i].map,
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

/* The version went back (the table wrote a->state), from state `from`:
 * to undoing (failed: report reason once undone, unless reported) or to
 * retreating (staged as usual once undone).  The undo starts when no task
 * of it is on a worker. */
static void arrive_back(struct job *j, struct jlocal *l, struct jarrive *a, enum sink_vstate from,
			Dtep__ApplyResult result, const char *why)
{
	if (a->state == SINK_V_UNDOING && from != SINK_V_UNDOING) {
		struct jpend *p = pend_find(l, a->version);

		a->result = result;
		snprintf(a->why, sizeof(a->why), "%s", why ? why : "");
		/* Its pending entry is refused: later records of it are
		 * dropped, its data goes; the APPLIED refused waits for the
		 * undo (undoing × worker done: send_failed). */
		if (p && sink_decide(l, p->version, &p->state, SINK_EV_CONTRADICTS).act ==
				 SINK_A_REFUSE)
			for (size_t i = 0; i < p->n; i++)
				jsink_pend_src_clear(&p->s[i]);
		DLOG_W("job %s: sink %llx: version %llu applied on arrival fails (%s): undone",
		       j->name, (unsigned long long)l->info.id, (unsigned long long)a->version,
		       a->why);
	} else if (a->state == SINK_V_RETREATING) {
		DLOG_I("job %s: sink %llx: version %llu leaves apply on arrival (%s): undone, then "
		       "staged", j->name, (unsigned long long)l->info.id,
		       (unsigned long long)a->version, why);
	}
	arrive_kick(j, l);
}

/* One event for the sink's arriving version: the table decides, this
 * executes.  Returns the action. */
enum sink_vaction jsink_arrive_event(struct job *j, struct jlocal *l, enum sink_vevent ev,
				     Dtep__ApplyResult result, const char *why)
{
	struct jarrive *a = jsink_of(l)->arrive;
	uint64_t v = a->version;
	enum sink_vstate from = a->state;
	struct sink_step d = sink_decide(l, v, &a->state, ev);

	switch (d.act) {
	case SINK_A_UNDO:
		if (d.next == SINK_V_GONE) {
			jsink_of(l)->arrive = NULL;
			jsink_of(l)->arrival_undos++;
			dmetrics_add(DM_APPLY_ON_ARRIVAL, "undo", 1);
			jsink_arrive_orphan(a);
		} else {
			arrive_back(j, l, a, from, result, why);
		}
		break;
	case SINK_A_RETREAT:
		arrive_back(j, l, a, from, 0, why);
		break;
	case SINK_A_REFUSE: {
		/* retreating × contradicts: refused now, undone as it goes */
		struct jpend *p = pend_find(l, v);

		if (p && sink_decide(l, v, &p->state, SINK_EV_CONTRADICTS).act == SINK_A_REFUSE)
			jsink_pend_refuse_exec(j, l, p, why);
		a->reported = 1;
		break;
	}
	case SINK_A_CONTINUE:
	case SINK_A_DRAIN:
		if (d.next == SINK_V_GONE) {
			jsink_of(l)->arrive = NULL;
			jsink_arrive_orphan(a);
		} else if (d.next == SINK_V_UNDOING && from != SINK_V_UNDOING && why) {
			snprintf(a->why, sizeof(a->why), "%s", why);
		}
		break;
	default:
		return d.act;
	}
	/* Shutdown: the sink is being freed (jsink_free), nothing to check. */
	if (!j->eng->stopping)
		jsink_step_check(j, l, v, d);
	return d.act;
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
	if (sink_decide(l, a->version, &a->state, SINK_EV_COMPLETE).act != SINK_A_VERIFY)
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
	struct sink_step d;

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
		d = sink_decide(l, a->version, &a->state, SINK_EV_WORKER_OK);
		if (d.act == SINK_A_SEND_STAGED) {
			struct jstaged *st = a->st, **pp = &k->staged;
			struct jpend *p = pend_find(l, a->version);

			a->st = NULL;
			memcpy(st->isum, a->sum, l->nbufs * sizeof(*st->isum));
			st->ikey = a->key;
			st->state = a->state;	/* staged, in place */
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
			jsink_step_check(j, l, st->version, d);
			jsink_try_stage(j, l);
			sink_staged_tell(j, l);
			jwait_check(j->eng);
		}
		return;
	case JA_UNDO:
		d = sink_decide(l, a->version, &a->state, SINK_EV_WORKER_OK);
		switch (d.act) {
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
		if (d.act != SINK_A_NONE)
			jsink_step_check(j, l, a->version, d);
		arrive_free(a);
		jsink_try_stage(j, l);
		sink_staged_tell(j, l);
		jwait_check(j->eng);
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
	    k->held != k->applied || j->eng->stopping || !jio_workers(j->eng) ||
	    p->state != SINK_V_COLLECTING || k->w || p->version <= k->held)
		return 0;
	for (size_t b = 0; b < l->nbufs; b++)
		if (!jsink_keep_encoded(j, l, l->bufs[b]))
			return 0;
	for (size_t i = 0; i < p->n; i++)
		if (p->s[i].counts && !arrive_fits(j, l, &p->s[i]))
			return 0;
	return 1;
}

/* The version of p goes on arrival in state s (the table's: arriving). */
static struct jarrive *arrive_new(struct job *j, struct jlocal *l, const struct jpend *p,
				  enum sink_vstate s)
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
	a->state = s;
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

	if (p->state == SINK_V_REFUSED)
		return;
	if (a && a->version != p->version) {
		/* A newer version coming: the arriving one must not hold it
		 * up (nothing else stages while it is in the buffers). */
		if (p->version > a->version && a->state == SINK_V_ARRIVING)
			jsink_arrive_event(j, l, SINK_EV_UNPARK, 0, "a newer version arrives");
		return;
	}
	if (!a) {
		/* Started by COUNTS, or by a part that describes itself.  The
		 * version's state moves to its jarrive; its pending entry stays
		 * collecting (its parts not yet taken, its records kept). */
		enum sink_vstate vs = p->state;
		struct sink_step d;

		if ((!counts && !(s->nparts && arrive_part_fits(j, l, s, &s->parts[s->nparts - 1]))) ||
		    !arrive_can_start(j, l, p))
			return;
		d = sink_decide(l, p->version, &vs, SINK_EV_PARKED);
		if (d.act != SINK_A_ARRIVE || !(a = arrive_new(j, l, p, vs)))
			return;
		k->arrive = a;
		jsink_step_check(j, l, p->version, d);
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
	if (sink_decide(l, p->version, &a->state, SINK_EV_RECORD).act != SINK_A_SWAP)
		return;
	arrive_kick(j, l);
}