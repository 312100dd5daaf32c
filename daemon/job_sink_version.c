/* daemon/job_sink_version.c — a version at a sink, under every other
 * sink file: its pending and staged forms freed, each transition decided
 * by the table for its stored state and the next state stored
 * (sink_decide, sink_sm.c), then checked against where the action put it
 * (jsink_step_check), its state wherever it is (jsink_vstate), what the
 * sources are told (APPLIED, held back for the storage writer's sink; a
 * refusal), and the receive arena of the sink's next version.
 *
 * Calls: job_state.c, sink_sm.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_sink_engine.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"

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

void jsink_staged_hand(struct jlocal *l, struct jstaged *st)
{
	struct jstaged **pp = &jsink_of(l)->staged;

	while (*pp)
		pp = &(*pp)->next;
	st->state = SINK_V_STAGED;	/* the reader's table decided (reader_sm: hand) */
	st->next = NULL;
	*pp = st;
	jsink_of(l)->held = st->version;
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
 * "A version at a sink") decides from the version's stored state *s and
 * writes the state it goes to there; the caller only executes the
 * action (and moves the state with the version when it moves to another
 * object).  A cell the table marks "—" (the event cannot reach that
 * state) is logged as a daemon bug, the state is kept and the caller
 * does nothing. */
struct sink_step sink_decide(const struct jlocal *l, uint64_t v, enum sink_vstate *s,
			     enum sink_vevent ev)
{
	struct sink_step d = sink_sm_step(*s, ev);

	if (d.act == SINK_A_NONE)
		DLOG_E("sink %llx version %llu: event %d in state %s has no transition (bug)",
		       (unsigned long long)l->info.id, (unsigned long long)v, (int)ev,
		       sink_sm_state_name(*s));
	else
		DLOG_D("sink %llx version %llu: %s -> %s (%s)", (unsigned long long)l->info.id,
		       (unsigned long long)v, sink_sm_state_name(*s), sink_sm_state_name(d.next),
		       sink_sm_action_name(d.act));
	*s = d.next;
	return d;
}

static const struct jstaged *staged_find(const struct jsink *k, uint64_t v)
{
	for (const struct jstaged *st = k->staged; st; st = st->next)
		if (st->version == v)
			return st;
	return NULL;
}

static const struct jpend *pend_find(const struct jsink *k, uint64_t v)
{
	for (const struct jpend *p = k->pend; p; p = p->next)
		if (p->version == v)
			return p;
	return NULL;
}

/* Where version v is at sink l, read from the sink's fields (which
 * object holds it: sink_sm_state), not from the state stored there. */
static enum sink_vstate vstate_fields(const struct jsink *k, uint64_t v)
{
	struct sink_view w = { .held = k->held, .staging = k->staging, .applying = k->applying,
			       .applied = k->applied, .failed = k->failed };
	const struct jpend *p = pend_find(k, v);

	w.chained = staged_find(k, v) != NULL;
	if (p)
		w.pending = p->state == SINK_V_REFUSED ? 2 : 1;
	if (k->arrive) {
		w.arrive = k->arrive->version;
		w.arrive_state = k->arrive->state;
	}
	return sink_sm_state(&w, v);
}

/* Version v's state at sink l: the one stored where it lives (its
 * jarrive, the versions on a worker, its jstaged, its jpend); none,
 * applied, failed and gone belong to no object and are computed from
 * the version numbers the sink holds (sink_sm_state). */
enum sink_vstate jsink_vstate(struct jlocal *l, uint64_t v)
{
	const struct jsink *k = jsink_of(l);
	enum sink_vstate s = vstate_fields(k, v);

	switch (s) {
	case SINK_V_STAGING:
		return k->staging_state;
	case SINK_V_APPLYING:
		return k->applying_state;
	case SINK_V_STAGED:
		return staged_find(k, v)->state;
	case SINK_V_COLLECTING:
	case SINK_V_REFUSED:
		return pend_find(k, v)->state;
	default:
		return s;	/* the jarrive's, or computed */
	}
}

/* After the action of step d for version v is executed: the version is
 * where the table said (its fields, sink_sm_state), with the state it
 * said stored there; otherwise a daemon bug, logged and counted
 * (dte_engine.sink_sm_bugs; the tests require none).  Gone: no data of
 * it is left (a refused entry may stay so that its later records are
 * dropped, and what the sink holds may be at or past it). */
void jsink_step_check(struct job *j, struct jlocal *l, uint64_t v, struct sink_step d)
{
	enum sink_vstate where = vstate_fields(jsink_of(l), v), stored = jsink_vstate(l, v);
	int ok;

	if (d.next == SINK_V_GONE)
		ok = where == SINK_V_NONE || where == SINK_V_GONE || where == SINK_V_APPLIED ||
		     where == SINK_V_FAILED || where == SINK_V_REFUSED;
	else
		ok = where == d.next && stored == d.next;
	if (ok)
		return;
	j->eng->sink_sm_bugs++;
	DLOG_E("job %s: sink %llx version %llu is %s (stored %s) after %s; the table says %s (bug)",
	       j->name, (unsigned long long)l->info.id, (unsigned long long)v,
	       sink_sm_state_name(where), sink_sm_state_name(stored), sink_sm_action_name(d.act),
	       sink_sm_state_name(d.next));
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

int jsink_make_writer(struct jlocal *l, void (*staged)(struct job *j, struct jlocal *l))
{
	struct jsink *k = jsink_of(l);

	if (!k->w && !(k->w = calloc(1, sizeof(*k->w))))
		return -ENOMEM;
	k->w->staged = staged;
	return 0;
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

/* A version refused while its records still arrive (sink_decide made it
 * refused): what it held goes, the entry stays (no data) so later parts
 * of it are dropped, until a newer version is staged or the pending cap
 * takes it. */
void jsink_pend_refuse_exec(struct job *j, struct jlocal *l, struct jpend *p, const char *why)
{
	jsink_refuse_version(j, l, p, DTEP__APPLY_RESULT__APPLY_REFUSED, why);
	for (size_t i = 0; i < p->n; i++)
		jsink_pend_src_clear(&p->s[i]);
}

int jsink_pend_complete(const struct jpend *p)
{
	if (p->state == SINK_V_REFUSED)
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