/* daemon/job_coord.c — membership and plans.
 *
 * Coordinator side: members JOIN with all their participants; every change
 * re-plans (dte_plan_build per sink layout, cached, mapped onto the
 * attached participants pair by pair, each pair's entries packed once and
 * kept) and sends each member the PLAN part it needs.  Member
 * side: a PLAN is validated against the local buffers before it replaces
 * the previous one; pair state (what a sink holds, dirty bitmaps) survives
 * a re-plan when the pair's entries are unchanged.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <xxhash.h>
#include "daemon/coord_sm.h"
#include "daemon/job_state.h"
#include "daemon/job_coord.h"
#include "daemon/job_src_engine.h"
#include "daemon/job_sink_engine.h"
#include "daemon/layout/plan.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/relay_plan.h"
#include "gpu/compute.h"
#include "gpu/fp8.h"

/* ------------------------------------------------------- member: JOIN */

/* The boot id's fallback entropy only: not the engine's clock. */
static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t job_boot_new(void)
{
	uint64_t b = 0;

	while (!b) {
		if (getrandom(&b, sizeof(b), 0) != (ssize_t)sizeof(b))
			b = mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&b;
		b &= (1ull << PEER_TERM_BOOT_BITS) - 1;
	}
	return b;
}

static void send_join(struct job *j, int retry);

void job_send_join(struct job *j)
{
	send_join(j, 0);
}

void job_send_join_again(struct job *j)
{
	send_join(j, 1);
}

/* Every JOIN is acknowledged by a PLAN echoing its join_seq and retried
 * until then (jctl_retry), one with no participants too: the leave of a
 * node's last participant, lost and not retried, left a ghost at the
 * coordinator (planned, sent versions, its replica refused to everyone
 * else: test_fixture_explore found it).  The coordinator answers that one
 * with a PLAN holding nothing for this node (answer_empty). */
static void send_join(struct job *j, int retry)
{
	Dtep__Join m = DTEP__JOIN__INIT;
	Dtep__JobRef ref;
	Dtep__Participant *pa = NULL, **pp = NULL;
	size_t n = 0, i = 0;
	int rc;

	for (struct jlocal *l = j->locals; l; l = l->next)
		n++;
	if (n) {
		pa = calloc(n, sizeof(*pa));
		pp = calloc(n, sizeof(*pp));
		if (!pa || !pp) {
			DLOG_E("job %s: out of memory building JOIN", j->name);
			goto out;
		}
	}
	for (struct jlocal *l = j->locals; l; l = l->next, i++) {
		dtep__participant__init(&pa[i]);
		pa[i].id = l->info.id;
		pa[i].role = l->info.role == JROLE_SOURCE ? DTEP__ROLE__ROLE_SOURCE : DTEP__ROLE__ROLE_SINK;
		pa[i].layout = l->info.layout;
		pa[i].rank = l->info.rank;
		pa[i].replica = l->info.replica;
		pa[i].node = (char *)jio_self(j->eng);
		pa[i].shards = l->info.role == JROLE_SOURCE && jsource_of(l)->shards ?
				jsource_of(l)->shards : (char *)"";
		pp[i] = &pa[i];
	}
	job_fill_ref(j, &ref);
	m.job = &ref;
	m.spec_hash = j->spec.hash;
	m.peer_proto = PEER_PROTO_VERSION;
	m.node = (char *)jio_self(j->eng);
	m.address = (char *)jio_self_address(j->eng);
	m.n_participants = n;
	m.participants = pp;
	if (!retry || !j->join_seq)
		j->join_seq++;
	m.join_boot = j->boot;
	m.join_seq = j->join_seq;
	if (j->auth) {
		/* The challenge every PLAN to this daemon answers (job_auth.h). */
		m.nonce.data = j->auth_nonce;
		m.nonce.len = sizeof(j->auth_nonce);
	}
	if (!retry)
		j->join_backoff_ms = 0;
	if (j->join_backoff_ms < PEER_RETRY_FIRST_MS)
		j->join_backoff_ms = PEER_RETRY_FIRST_MS;
	else if (retry && j->join_backoff_ms < PEER_RETRY_MAX_MS)
		j->join_backoff_ms *= 2;
	j->join_next_ns = jio_now(j->eng) + (uint64_t)j->join_backoff_ms * 1000000u;
	rc = jio_send(j->eng, j->is_coord ? jio_self(j->eng) : NULL, j->is_coord ? NULL : j->coordinator,
			DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, &m.base, NULL, 0);
	if (!n && (rc < 0 || j->coord_down)) {
		/* A leave the coordinator cannot hear needs no answer: the
		 * link to it broke (or never came back), and a coordinator
		 * that heard this node go down forgot it; retrying would only
		 * log every interval for a job with nothing here. */
		j->join_acked = j->join_seq;
		if (rc < 0)
			DLOG_I("job %s: the coordinator %s is out of reach (%s); this node's "
			       "leave is not sent again", j->name, j->coordinator, strerror(-rc));
	} else if (rc < 0) {
		DLOG_W("job %s: cannot reach the coordinator %s: %s (retried)", j->name,
		       j->coordinator, strerror(-rc));
		for (struct jlocal *l = j->locals; l; l = l->next)
			if (!l->announced && !l->refused[0])
				snprintf(l->refused, sizeof(l->refused),
					 "cannot reach the coordinator %s: %s", j->coordinator,
					 strerror(-rc));
	}
out:
	free(pa);
	free(pp);
	jctl_update(j->eng);
}

/* ------------------------------------------------------------ coordinator */

static void member_free(struct jmember *m)
{
	free(m->rates);
	free(m->seen);
	free(m->sel_p);
	free(m->sel_q);
	free(m->part);
	free(m->plan);
	free(m->p);
	free(m);
}

/* One member node's state (coord_sm.h; docs/SYNC.md, "Coordinator: one
 * member node"), read back from its fields; m NULL: absent. */
static enum coord_mstate member_state(const struct jmember *m)
{
	struct coord_mview w = { 0 };

	if (m) {
		w.member = 1;
		w.has_plan = m->plan != NULL;
		w.plan_term = m->plan_term;
		w.acked_term = m->acked_term;
		w.expired = m->expired;
	}
	return coord_sm_member_state(&w);
}

/* coord_sm decides a member's transition; the caller executes st.act
 * and then member_done() checks it reached st.next. */
static struct coord_step member_step(const struct job *j, const char *node,
				     const struct jmember *m, enum coord_mevent ev)
{
	enum coord_mstate s = member_state(m);
	struct coord_step st = coord_sm_step(s, ev);

	if (st.act != COORD_A_NONE)
		DLOG_D("job %s: member %s: %s on %s: %s -> %s", j->name, node,
		       coord_sm_event_name(ev), coord_sm_state_name(s),
		       coord_sm_action_name(st.act), coord_sm_state_name(st.next));
	return st;
}

static struct jmember *member_find(struct job *j, const char *node);

static void member_done(struct job *j, const char *node, struct coord_step st)
{
	enum coord_mstate now = member_state(member_find(j, node));

	if (now != st.next)
		DLOG_E("job %s: member %s is %s after %s; the table says %s (bug, or out of "
		       "memory)", j->name, node, coord_sm_state_name(now),
		       coord_sm_action_name(st.act), coord_sm_state_name(st.next));
}

static void member_bad_action(const struct job *j, const char *node, enum coord_mevent ev,
			      struct coord_step st)
{
	DLOG_E("job %s: member %s: action %s for %s not executed here (bug)", j->name, node,
	       coord_sm_action_name(st.act), coord_sm_event_name(ev));
}

/* ------------------------------------------------ acknowledgement, retry */

/* (Re)sends the PLAN a member was last given, with the newest join_seq
 * of it this coordinator processed (a JOIN's acknowledgement). */
static int member_send_plan(struct job *j, struct jmember *m)
{
	Dtep__Plan *pl;
	int rc;

	if (!m->plan)
		return -ENOENT;
	pl = dtep__plan__unpack(NULL, m->plan_len, m->plan);
	if (!pl)
		return -ENOMEM;
	pl->join_seq = m->join_seq;
	rc = jio_send(j->eng, m->node, m->address, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN, &pl->base, NULL, 0);
	dtep__plan__free_unpacked(pl, NULL);
	if (rc < 0)
		DLOG_W("job %s: cannot send plan epoch %llx to %s: %s", j->name,
		       (unsigned long long)m->plan_term, m->node, strerror(-rc));
	return rc;
}

static void retry_arm(const struct dte_engine *e, uint64_t *next_ns, uint32_t *backoff_ms,
		      int reset)
{
	if (reset || !*backoff_ms)
		*backoff_ms = PEER_RETRY_FIRST_MS;
	else if (*backoff_ms < PEER_RETRY_MAX_MS)
		*backoff_ms *= 2;
	*next_ns = jio_now(e) + (uint64_t)*backoff_ms * 1000000u;
}

void jcoord_plan_ack(struct job *j, const char *from, const Dtep__PlanAck *m)
{
	struct jmember *mem = member_find(j, from);
	enum coord_mevent ev = mem && m->epoch == mem->plan_term ? COORD_EV_ACK_CURRENT :
			       COORD_EV_ACK_OTHER;
	struct coord_step st = member_step(j, from, mem, ev);

	switch (st.act) {
	case COORD_A_NONE:	/* a duplicate: changes nothing */
		return;
	case COORD_A_IGNORE:
		DLOG_D("job %s: PLAN_ACK %llx from %s ignored (not its current plan)", j->name,
		       (unsigned long long)m->epoch, from);
		return;
	case COORD_A_ACK:
		DLOG_D("job %s: %s acknowledged plan %llx", j->name, from,
		       (unsigned long long)m->epoch);
		mem->acked_term = m->epoch;
		break;
	default:
		member_bad_action(j, from, ev, st);
		return;
	}
	member_done(j, from, st);
}

/* Records of a term newer than the plan held (job_sink_intake.c) wait
 * for its PLAN.  Past the longest retry interval that PLAN is taken as
 * lost (past its deadline the coordinator sends a PLAN only every
 * PEER_PLAN_SLOW_MS), and the member asks again: its JOIN
 * once more, which the coordinator answers with the current plan and
 * nothing else (a duplicate JOIN; proto/peer_protocol.h); at most once a
 * retry interval.  The fixture's explorer found the stall
 * (test_fixture_explore, FX_SILENT).  When that ask is due. */
static uint64_t ahead_ask_ns(const struct job *j)
{
	uint64_t wait = (uint64_t)PEER_RETRY_MAX_MS * 1000000u;
	uint64_t t = jsink_ahead_oldest(j) + wait;

	return j->ahead_asked_ns && j->ahead_asked_ns + wait > t ? j->ahead_asked_ns + wait : t;
}

static int plan_relayed(const struct job *j);

int jcoord_rates_wanted(const struct job *j)
{
	return j->is_coord ? j->eng->relay_measured && j->eng->relay_fanout :
	       j->coord_proto >= PEER_PROTO_RATES && plan_relayed(j);
}

static int job_ctl_pending(const struct job *j, uint64_t *soonest)
{
	int any = 0;

	if (j->is_coord && j->relay_trees && j->eng->relay_lag_ms) {
		uint64_t t = j->lag_next_ns ? j->lag_next_ns : jio_now(j->eng);

		any = 1;
		if (t < *soonest)
			*soonest = t;
	}

	if (j->join_acked < j->join_seq) {
		any = 1;
		if (j->join_next_ns < *soonest)
			*soonest = j->join_next_ns;
	}
	/* Send rates: a sample to report (or sends in flight that will make
	 * one), at most every PEER_RATES_MIN_MS; the coordinator's own go to
	 * the shape check. */
	if ((j->rates_gen != j->rates_sent_gen || jlinks_busy(j)) && jcoord_rates_wanted(j)) {
		uint64_t t = j->rates_sent_ns + (uint64_t)PEER_RATES_MIN_MS * 1000000u;
		uint64_t later = jio_now(j->eng) + (uint64_t)PEER_RATES_MIN_MS * 1000000u;

		/* in flight, no sample yet: look again, not at every tick */
		if (j->rates_gen == j->rates_sent_gen && t < later)
			t = later;
		any = 1;
		if (t < *soonest)
			*soonest = t;
	}
	if (j->shape_due_ns) {
		any = 1;
		if (j->shape_due_ns < *soonest)
			*soonest = j->shape_due_ns;
	}
	if (j->rates_expiry_ns && j->is_coord) {
		any = 1;
		if (j->rates_expiry_ns < *soonest)
			*soonest = j->rates_expiry_ns;
	}
	for (const struct jmember *m = j->members; m; m = m->next) {
		enum coord_mstate st = member_state(m);

		if (st == COORD_M_PLANNED || st == COORD_M_EXPIRED) {
			any = 1;
			if (m->next_ns < *soonest)
				*soonest = m->next_ns;
		}
	}
	if (!j->is_coord && jsink_ahead_oldest(j)) {
		uint64_t t = ahead_ask_ns(j);

		any = 1;
		if (t < *soonest)
			*soonest = t;
	}
	return any;
}

void jctl_update(struct dte_engine *e)
{
	uint64_t soonest = UINT64_MAX, now = jio_now(e), ms;
	int any = 0;

	if (!e->ctl_timer)
		return;
	for (struct job *j = e->jobs; j; j = j->next)
		any |= job_ctl_pending(j, &soonest);
	if (!any) {
		if (e->ctl_timer_on)
			jio_timer_stop(e, e->ctl_timer);
		e->ctl_timer_on = 0;
		return;
	}
	ms = soonest > now ? (soonest - now + 999999) / 1000000 : 0;
	/* Never 0: a timer re-armed from its own callback with 0 would run
	 * again before the loop polls (a stuck entry must not starve it). */
	if (ms < 10)
		ms = 10;
	jio_timer_start(e, e->ctl_timer, ms, 0);
	e->ctl_timer_on = 1;
}

static void relay_lag_check(struct job *j, uint64_t now);
static void rates_tick(struct job *j, uint64_t now);
static void shape_check(struct job *j, uint64_t now);

void jctl_retry(struct dte_engine *e)
{
	uint64_t now = jio_now(e);

	for (struct job *j = e->jobs; j; j = j->next) {
		if (j->rates_gen != j->rates_sent_gen &&
		    now >= j->rates_sent_ns + (uint64_t)PEER_RATES_MIN_MS * 1000000u)
			rates_tick(j, now);
		if (j->rates_expiry_ns && now >= j->rates_expiry_ns) {
			j->rates_expiry_ns = 0;
			if (!j->shape_due_ns)
				j->shape_due_ns = now;	/* a rate expired */
		}
		if (j->shape_due_ns && now >= j->shape_due_ns)
			shape_check(j, now);
		if (j->is_coord && j->relay_trees && e->relay_lag_ms && now >= j->lag_next_ns) {
			j->lag_next_ns = now + (uint64_t)e->relay_lag_ms * 1000000u / 4;
			relay_lag_check(j, now);
		}
		if (j->join_acked < j->join_seq && now >= j->join_next_ns) {
			j->join_retries++;
			DLOG_I("job %s: JOIN %llu not acknowledged; sent again (retry %llu, next in %u ms)",
			       j->name, (unsigned long long)j->join_seq,
			       (unsigned long long)j->join_retries, j->join_backoff_ms * 2 <
			       PEER_RETRY_MAX_MS ? j->join_backoff_ms * 2 : PEER_RETRY_MAX_MS);
			job_send_join_again(j);
		}
		if (!j->is_coord && jsink_ahead_oldest(j) && now >= ahead_ask_ns(j)) {
			j->ahead_asked_ns = now;
			j->ahead_asks++;
			DLOG_N("job %s: records of a newer term have waited %llu ms for its plan; "
			       "asking the coordinator %s again", j->name,
			       (unsigned long long)((now - jsink_ahead_oldest(j)) / 1000000u),
			       j->coordinator);
			job_send_join_again(j);
		}
		for (struct jmember *m = j->members; m; m = m->next) {
			enum coord_mevent ev;
			struct coord_step st;

			if (m->next_ns == UINT64_MAX || now < m->next_ns)
				continue;
			ev = now >= m->deadline_ns ? COORD_EV_DEADLINE : COORD_EV_RETRY_DUE;
			st = member_step(j, m->node, m, ev);
			if (st.act == COORD_A_NONE)
				continue;	/* acknowledged, or no plan */
			if (st.act == COORD_A_EXPIRE || st.act == COORD_A_RETRY_SLOW) {
				if (st.act == COORD_A_EXPIRE) {
					DLOG_W("job %s: %s did not acknowledge plan %llx within %u ms; "
					       "sent again every %u s until it does, leaves or goes down",
					       j->name, m->node, (unsigned long long)m->plan_term,
					       PEER_PLAN_DEADLINE_MS, PEER_PLAN_SLOW_MS / 1000);
					m->expired = 1;
				} else {
					m->plan_retries++;
					DLOG_I("job %s: plan %llx still not acknowledged by %s; sent again "
					       "(retry %llu)", j->name, (unsigned long long)m->plan_term,
					       m->node, (unsigned long long)m->plan_retries);
					member_send_plan(j, m);
				}
				m->next_ns = now + (uint64_t)PEER_PLAN_SLOW_MS * 1000000u;
				member_done(j, m->node, st);
				continue;
			}
			if (st.act != COORD_A_RETRY) {
				member_bad_action(j, m->node, ev, st);
				continue;
			}
			m->plan_retries++;
			DLOG_I("job %s: plan %llx not acknowledged by %s; sent again (retry %llu)",
			       j->name, (unsigned long long)m->plan_term, m->node,
			       (unsigned long long)m->plan_retries);
			member_send_plan(j, m);
			retry_arm(j->eng, &m->next_ns, &m->backoff_ms, 0);
			member_done(j, m->node, st);
		}
	}
	jctl_update(e);
}

static void cache_free(struct jplan_cache *c);

void jcoord_free(struct job *j)
{
	for (uint32_t r = 0; r < j->n_src_shards; r++)
		free(j->src_shards[r]);
	free(j->src_shards);
	j->src_shards = NULL;
	j->n_src_shards = 0;
	cache_free(j->plan_cache);
	j->plan_cache = NULL;
	while (j->members) {
		struct jmember *m = j->members;

		j->members = m->next;
		member_free(m);
	}
}

/* ------------------------------------------------------------ the plan cache */

/* A sink layout's plan against the cached source layout, its entries
 * indexed by (sink rank, source rank): those of sink rank k from source
 * rank r are q_of[off[k * nsrc + r] .. off[k * nsrc + r + 1]), in plan
 * order, so the i-th of them is the pair's entry id i (the ids a walk
 * over the whole plan gives). */
struct jsinkplan {
	char desc[JOB_DESC_MAX];
	struct dte_layout lay;
	struct dte_plan plan;
	int ok;			/* built; else its error was logged when tried */
	char err[512];		/* !ok: why (dtectl job's plan_error) */
	int used;		/* by the re-plan under way */
	uint64_t gen;		/* this build's number: what members' part keys name */
	uint32_t nranks, nsrc;
	size_t *off;		/* [nranks * nsrc + 1] */
	uint32_t *q_of;		/* [plan.n] */
};

/* One (source participant, sink participant) pair's entries, packed as
 * items of the PLAN's field 5 (each with its key).  They are a function
 * of t: the sink plan's build, the sink's and the source's ids, the
 * sink's rank and the source's rank. */
struct jseg {
	uint64_t t[5];
	uint8_t *bytes;		/* NULL: a free slot */
	size_t len;
	int used;		/* by the re-plan under way */
};

/* What a re-plan reuses: the source layout (key: its description and,
 * for a sharded one, src_shards_gen), one plan per sink layout built
 * against it, and every pair's packed entries.  A new key drops all. */
struct jplan_cache {
	char src_desc[JOB_DESC_MAX];
	uint64_t src_gen;
	int src_ok;		/* src built (plain; full once every shard came) */
	int src_full;		/* a sharded source's layout with every rank's shards */
	char src_err[1024];	/* !src_ok: why (dtectl job's plan_error) */
	struct dte_layout src;
	struct jsinkplan **sp;	/* each its own allocation: a plan borrows its layout */
	size_t nsp, capsp;
	uint64_t next_gen;	/* never reused, cache_drop included */
	struct jseg *seg;	/* open addressing by t; capseg a power of two */
	size_t nseg, capseg;
};

static void sinkplan_free(struct jsinkplan *s)
{
	if (s->ok) {
		dte_plan_fini(&s->plan);
		dte_layout_fini(&s->lay);
	}
	free(s->off);
	free(s->q_of);
	free(s);
}

static void cache_drop(struct jplan_cache *c)
{
	for (size_t g = 0; g < c->capseg; g++)
		free(c->seg[g].bytes);
	free(c->seg);
	c->seg = NULL;
	c->nseg = c->capseg = 0;
	for (size_t s = 0; s < c->nsp; s++)
		sinkplan_free(c->sp[s]);
	c->nsp = 0;
	if (c->src_ok)
		dte_layout_fini(&c->src);
	c->src_ok = 0;
	c->src_full = 0;
	c->src_desc[0] = '\0';
}

static void cache_free(struct jplan_cache *c)
{
	if (!c)
		return;
	cache_drop(c);
	free(c->sp);
	free(c);
}

/* Entries by (sink rank, source rank), once per plan (a counting sort:
 * stable, so plan order within each). */
static int sinkplan_index(struct jsinkplan *s, uint32_t nsrc)
{
	struct dte_plan_entry ent;
	size_t *at, nb;

	s->nranks = s->lay.nranks;
	s->nsrc = nsrc;
	nb = (size_t)s->nranks * nsrc;
	if (s->plan.n >= UINT32_MAX || (nsrc && nb / nsrc != s->nranks))
		return -EOVERFLOW;
	s->off = calloc(nb + 1, sizeof(*s->off));
	s->q_of = malloc((s->plan.n ? s->plan.n : 1) * sizeof(*s->q_of));
	at = calloc(nb + 1, sizeof(*at));
	if (!s->off || !s->q_of || !at) {
		free(at);
		return -ENOMEM;
	}
	for (size_t q = 0; q < s->plan.n; q++) {
		dte_plan_entry(&s->plan, q, &ent);
		if (ent.sink_rank < s->nranks && ent.src_rank < nsrc)
			s->off[(size_t)ent.sink_rank * nsrc + ent.src_rank + 1]++;
	}
	for (size_t k = 0; k < nb; k++)
		s->off[k + 1] += s->off[k];
	memcpy(at, s->off, (nb + 1) * sizeof(*at));
	for (size_t q = 0; q < s->plan.n; q++) {
		dte_plan_entry(&s->plan, q, &ent);
		if (ent.sink_rank < s->nranks && ent.src_rank < nsrc)
			s->q_of[at[(size_t)ent.sink_rank * nsrc + ent.src_rank]++] = (uint32_t)q;
	}
	free(at);
	return 0;
}

/* Every entry of a sink plan into an FP8 buffer must split into whole
 * blocks' codes and scales (dte_plan_fp8_split): checked once a build, so
 * a layout pair where no source holds a block whole is refused as a plan
 * (dtectl job's plan_error) rather than per pair. */
static int sinkplan_fp8_check(const struct jsinkplan *s, const struct dte_spec *spec, char *err,
			      size_t errlen)
{
	struct dte_plan_entry pe;
	struct dte_fp8_split sp;

	for (size_t q = 0; s->lay.nfp8 && q < s->plan.n; q++) {
		const struct dte_layout_fp8 *f;

		dte_plan_entry(&s->plan, q, &pe);
		f = dte_layout_fp8_find(&s->lay, pe.sink_rank, pe.sink_buf);
		if (f && dte_plan_fp8_split(f, &pe, spec->t[pe.tensor].name, &sp, err, errlen) < 0)
			return -EINVAL;
	}
	return 0;
}

/* The cached plan of sink layout desc (built, and indexed, when not
 * cached); NULL when out of memory.  ->ok 0: it cannot be built (logged). */
static struct jsinkplan *cache_sink(struct job *j, struct jplan_cache *c, const char *desc,
				    uint32_t rank)
{
	struct dte_plan_opts opts = { 1, 0 };
	struct jsinkplan *s;
	char err[512];

	for (size_t i = 0; i < c->nsp; i++)
		if (!strcmp(c->sp[i]->desc, desc))
			return c->sp[i];
	if (c->nsp == c->capsp) {
		size_t nc = c->capsp ? c->capsp * 2 : 4;
		struct jsinkplan **n = realloc(c->sp, nc * sizeof(*n));

		if (!n)
			return NULL;
		c->sp = n;
		c->capsp = nc;
	}
	if (!(s = calloc(1, sizeof(*s))))
		return NULL;
	c->sp[c->nsp++] = s;
	snprintf(s->desc, sizeof(s->desc), "%s", desc);
	if (jlayout_build(j, JROLE_SINK, desc, rank, NULL, &s->lay, s->err, sizeof(s->err)) < 0)
		return s;
	if (dte_plan_build(&s->plan, &j->spec, &c->src, &s->lay, &opts, err, sizeof(err)) < 0) {
		DLOG_E("job %s: plan %s -> %s: %s", j->name, c->src_desc, desc, err);
		snprintf(s->err, sizeof(s->err), "%s", err);
		dte_layout_fini(&s->lay);
		return s;
	}
	if (sinkplan_fp8_check(s, &j->spec, err, sizeof(err)) < 0) {
		DLOG_E("job %s: plan %s -> %s: %s", j->name, c->src_desc, desc, err);
		snprintf(s->err, sizeof(s->err), "%s", err);
		dte_plan_fini(&s->plan);
		dte_layout_fini(&s->lay);
		return s;
	}
	s->ok = 1;
	s->gen = ++c->next_gen;
	if (sinkplan_index(s, c->src.nranks) < 0) {
		c->nsp--;
		sinkplan_free(s);
		return NULL;
	}
	return s;
}

/* Sink plans no re-plan used this time go: a layout nobody holds any
 * more is built again if it comes back. */
static void cache_sweep(struct jplan_cache *c)
{
	size_t k = 0;

	for (size_t s = 0; s < c->nsp; s++) {
		if (!c->sp[s]->used) {
			sinkplan_free(c->sp[s]);
			continue;
		}
		c->sp[s]->used = 0;
		c->sp[k++] = c->sp[s];
	}
	c->nsp = k;
}

/* ------------------------------------------------------------ pairs' entries */

static size_t seg_home(const uint64_t t[5], size_t cap)
{
	return (size_t)XXH64(t, 5 * sizeof(*t), 0) & (cap - 1);
}

/* The slot of t: where it is, or the free one where it goes. */
static size_t seg_slot(const struct jplan_cache *c, const uint64_t t[5])
{
	size_t g = seg_home(t, c->capseg);

	while (c->seg[g].bytes && memcmp(c->seg[g].t, t, 5 * sizeof(*t)))
		g = (g + 1) & (c->capseg - 1);
	return g;
}

/* Rehashed into a table for at least want segments, keeping those used
 * (keep_unused 0: the others are freed, and used is cleared for the
 * next re-plan).  0 or -ENOMEM (then unchanged). */
static int seg_rehash(struct jplan_cache *c, size_t want, int keep_unused)
{
	size_t cap = 64, n = 0;
	struct jseg *ns, *old = c->seg;

	while (cap < 2 * want)
		cap *= 2;
	if (!(ns = calloc(cap, sizeof(*ns))))
		return -ENOMEM;
	for (size_t g = 0; g < c->capseg; g++) {
		size_t h;

		if (!old[g].bytes)
			continue;
		if (!old[g].used && !keep_unused) {
			free(old[g].bytes);
			continue;
		}
		for (h = seg_home(old[g].t, cap); ns[h].bytes; h = (h + 1) & (cap - 1))
			;
		ns[h] = old[g];
		ns[h].used = keep_unused ? old[g].used : 0;
		n++;
	}
	free(old);
	c->seg = ns;
	c->capseg = cap;
	c->nseg = n;
	return 0;
}

/* A plan entry as the PLAN's Entry; its arrays point into pe. */
static void entry_fill(Dtep__Entry *e, struct dte_plan_entry *pe, uint32_t id, uint64_t src,
		       uint64_t dst)
{
	dtep__entry__init(e);
	e->id = id;
	e->src = src;
	e->dst = dst;
	e->tensor = pe->tensor;
	e->group = pe->group;
	e->dst_buffer = pe->sink_buf;
	e->src_buffer = pe->src_buf;
	e->src_buffer_m = pe->src_buf_m;
	e->src_buffer_v = pe->src_buf_v;
	e->n_extent = pe->map.ndim;
	e->extent = pe->map.extent;
	e->src_offset = pe->map.src_offset;
	e->n_src_stride = pe->map.ndim;
	e->src_stride = pe->map.src_stride;
	e->dst_offset = pe->map.dst_offset;
	e->n_dst_stride = pe->map.ndim;
	e->dst_stride = pe->map.dst_stride;
}

/* The Plan's `entries` field (5, length-delimited): its key is one byte. */
#define PLAN_ENTRIES_KEY ((5u << 3) | PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)

static size_t varint_put(uint8_t *out, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}

static size_t varint_size(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/* Grows *buf to hold need bytes (at least doubling).  0 or -ENOMEM. */
static int buf_reserve(uint8_t **buf, size_t *cap, size_t need)
{
	size_t nc = need > 2 * *cap ? need : 2 * *cap;
	uint8_t *nb;

	if (need <= *cap)
		return 0;
	if (!(nb = realloc(*buf, nc)))
		return -ENOMEM;
	*buf = nb;
	*cap = nc;
	return 0;
}

/* Pair t's entries, q_of[k0 .. k1) of plan s (entry ids from 0), packed
 * into the free slot g (an FP8 entry as its codes and its scales).  0,
 * -ENOMEM, or -EINVAL for an FP8 entry sinkplan_fp8_check let through. */
static int seg_build(struct jseg *g, const uint64_t t[5], const struct jsinkplan *s, size_t k0,
		     size_t k1)
{
	uint8_t *buf = NULL;
	size_t cap = 0, len = 0;
	uint32_t id = 0;		/* entry ids: an FP8 entry takes two */

	for (size_t k = k0; k < k1; k++) {
		struct dte_plan_entry pe;
		struct dte_fp8_split sp;
		const struct dte_layout_fp8 *f;
		Dtep__Entry e;
		size_t sz;
		int n = 1;

		dte_plan_entry(&s->plan, s->q_of[k], &pe);
		/* An FP8 sink's entry goes as its codes, then its scales
		 * (checked when the plan was built: sinkplan_fp8_check). */
		f = dte_layout_fp8_find(&s->lay, pe.sink_rank, pe.sink_buf);
		if (f && dte_plan_fp8_split(f, &pe, "", &sp, NULL, 0) < 0) {
			free(buf);	/* cannot be: sinkplan_fp8_check passed */
			return -EINVAL;
		}
		if (f)
			n = 2;
		for (int h = 0; h < n; h++) {
			entry_fill(&e, &pe, id++, t[2], t[1]);
			if (f) {
				struct dte_box_map *m = h ? &sp.scales : &sp.codes;

				e.fp8 = h ? JFP8_SCALES : JFP8_CODES;
				e.fp8_flags = f->flags;
				e.n_src_extent = 2;
				e.src_extent = sp.src_extent;
				e.dst_buffer = h ? f->scale_buf : pe.sink_buf;
				e.n_extent = e.n_src_stride = e.n_dst_stride = m->ndim;
				e.extent = m->extent;
				e.src_offset = m->src_offset;
				e.src_stride = m->src_stride;
				e.dst_offset = m->dst_offset;
				e.dst_stride = m->dst_stride;
			}
			sz = protobuf_c_message_get_packed_size(&e.base);
			if (buf_reserve(&buf, &cap, len + 1 + 10 + sz) < 0) {
				free(buf);
				return -ENOMEM;
			}
			buf[len++] = PLAN_ENTRIES_KEY;
			len += varint_put(buf + len, sz);
			len += protobuf_c_message_pack(&e.base, buf + len);
		}
	}
	if (!buf && !(buf = malloc(1)))
		return -ENOMEM;
	memcpy(g->t, t, sizeof(g->t));
	g->bytes = buf;
	g->len = len;
	g->used = 1;
	return 0;
}

/* A re-plan: the participants, and what each member gets. */
struct built {
	struct jpinfo **parts;
	uint32_t *pmem;			/* parts[i]'s member (its index in j->members) */
	size_t nparts, nmem;
	/* Every (source, sink) pair with entries, as indices into parts,
	 * its key and its packed entries (a slot of the cache's table). */
	uint32_t *ps, *pd;
	uint64_t (*pt)[5];
	size_t *pslot;
	size_t npairs, cappairs;
	struct jplan_cache *c;
	/* Per member: what its part is made of (its pairs in order), and
	 * whether that differs from the part it holds. */
	uint64_t *mkey;
	uint8_t *changed;
	int complete;
	/* Per part: its relay parent's index in parts (relay_assign), for
	 * parts whose relay_parent is set. */
	uint32_t *par_of;
};

static int pair_add(struct built *b, uint32_t src, uint32_t dst, const uint64_t t[5])
{
	if (b->npairs == b->cappairs) {
		size_t nc = b->cappairs ? b->cappairs * 2 : 256;
		uint32_t *ns = realloc(b->ps, nc * sizeof(*ns)), *nd;
		uint64_t (*nt)[5];

		if (!ns)
			return -ENOMEM;
		b->ps = ns;
		if (!(nd = realloc(b->pd, nc * sizeof(*nd))))
			return -ENOMEM;
		b->pd = nd;
		if (!(nt = realloc(b->pt, nc * sizeof(*nt))))
			return -ENOMEM;
		b->pt = nt;
		b->cappairs = nc;
	}
	b->ps[b->npairs] = src;
	b->pd[b->npairs] = dst;
	memcpy(b->pt[b->npairs], t, sizeof(b->pt[0]));
	b->npairs++;
	return 0;
}

/* The pairs grouped by member: pair i goes to the member of its source
 * and to that of its sink, in pair order: idx[off[k] .. off[k + 1]) for
 * member k.  One pass over the pairs, not one per member. */
static int pairs_by_member(const struct built *b, size_t **offp, uint32_t **idxp)
{
	size_t *off = calloc(b->nmem + 1, sizeof(*off)), *at = calloc(b->nmem + 1, sizeof(*at));
	uint32_t *idx = NULL;
	size_t i;

	if (!off || !at)
		goto oom;
	for (i = 0; i < b->npairs; i++) {
		uint32_t ms = b->pmem[b->ps[i]], md = b->pmem[b->pd[i]];

		off[ms + 1]++;
		if (md != ms)
			off[md + 1]++;
	}
	for (i = 0; i < b->nmem; i++)
		off[i + 1] += off[i];
	if (!(idx = malloc((off[b->nmem] ? off[b->nmem] : 1) * sizeof(*idx))))
		goto oom;
	memcpy(at, off, (b->nmem + 1) * sizeof(*at));
	for (i = 0; i < b->npairs; i++) {
		uint32_t ms = b->pmem[b->ps[i]], md = b->pmem[b->pd[i]];

		idx[at[ms]++] = (uint32_t)i;
		if (md != ms)
			idx[at[md]++] = (uint32_t)i;
	}
	free(at);
	*offp = off;
	*idxp = idx;
	return 0;
oom:
	free(off);
	free(at);
	return -ENOMEM;
}

/* ------------------------------------------------ a member's part, packed */

/* The member's entries: its pairs' packed entries one after the other
 * (pairs idx[0 .. n)), as the PLAN's field 5 packs them, kept with the
 * key of what they were made of.  0 or -ENOMEM (then none is kept). */
static int member_part(struct jmember *m, const struct built *b, const uint32_t *idx, size_t n,
		       uint64_t key)
{
	size_t len = 0;
	uint8_t *p = NULL;

	free(m->part);
	m->part = NULL;
	m->part_len = 0;
	m->part_ok = 0;
	for (size_t i = 0; i < n; i++)
		len += b->c->seg[b->pslot[idx[i]]].len;
	if (len && !(p = malloc(len)))
		return -ENOMEM;
	len = 0;
	for (size_t i = 0; i < n; i++) {
		const struct jseg *g = &b->c->seg[b->pslot[idx[i]]];

		memcpy(p + len, g->bytes, g->len);
		len += g->len;
	}
	m->part = p;
	m->part_len = len;
	m->part_hash = key;
	m->part_ok = 1;
	return 0;
}

/* n messages (each the first member of a struct of stride bytes) packed
 * once each as items of a repeated field: key, length, bytes.  Item i is
 * buf[at[i] .. at[i + 1]).  0 or -ENOMEM. */
struct pieces {
	uint8_t *buf;
	size_t *at;
};

static int pieces_pack(struct pieces *pc, uint32_t field, const void *base, size_t stride,
		       size_t n)
{
	size_t len = 0;

	pc->buf = NULL;
	if (!(pc->at = calloc(n + 1, sizeof(*pc->at))))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const ProtobufCMessage *msg = (const void *)((const char *)base + i * stride);
		size_t sz = protobuf_c_message_get_packed_size(msg);

		len += varint_size((uint64_t)field << 3 | PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) +
		       varint_size(sz) + sz;
		pc->at[i + 1] = len;
	}
	if (!(pc->buf = malloc(len ? len : 1)))
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const ProtobufCMessage *msg = (const void *)((const char *)base + i * stride);
		size_t at = pc->at[i];

		at += varint_put(pc->buf + at, ((uint64_t)field << 3) |
				 PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
		at += varint_put(pc->buf + at, protobuf_c_message_get_packed_size(msg));
		protobuf_c_message_pack(msg, pc->buf + at);
	}
	return 0;
}

static void pieces_free(struct pieces *pc)
{
	free(pc->buf);
	free(pc->at);
}

/* Packed fields (len > 0 bytes, each with its key) as one unknown field:
 * packing it writes the first key back and copies the rest. */
static void unknown_from(ProtobufCMessageUnknownField *u, uint8_t *bytes, size_t len)
{
	uint64_t key = 0;
	size_t k = 0;

	do {
		key |= (uint64_t)(bytes[k] & 0x7f) << (7 * k);
	} while (bytes[k++] & 0x80 && k < len);
	u->tag = (uint32_t)(key >> 3);
	u->wire_type = (ProtobufCWireType)(key & 7);
	u->len = len - k;
	u->data = bytes + k;
}

/* ------------------------------------- what changed since its last PLAN */

/* A member's selection in a re-plan (peer protocol 8, struct jmember):
 * its participants (index into the PLAN's, id, hash of the packed bytes)
 * and its pairs (index among its pairs, ids, key), each sorted by id. */
static int cmp_snp(const void *a, const void *b)
{
	const struct jsel_part *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

static int cmp_snq(const void *a, const void *b)
{
	const struct jsel_pair *x = a, *y = b;

	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

static int in_sorted(const uint64_t *v, size_t n, uint64_t x)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid] == x)
			return 1;
		if (v[mid] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* Whether m, holding the plan its selection describes, can be sent only
 * the difference to (np, nq): every pair it loses ends at a participant
 * it loses.  Then up[] marks the participants to send (new or changed),
 * add[] the pairs (new, or their entries changed), and drop[0..*ndrop)
 * the participants gone, ascending.  1 yes, 0 no (a whole PLAN). */
static int sel_delta(const struct jmember *m, const struct jsel_part *np, size_t nnp,
		     const struct jsel_pair *nq, size_t nnq, uint8_t *up, uint8_t *add,
		     uint64_t *drop, size_t *ndrop)
{
	size_t a = 0, b = 0, nd = 0;

	while (a < m->nsel_p || b < nnp) {
		if (b == nnp || (a < m->nsel_p && m->sel_p[a].id < np[b].id)) {
			drop[nd++] = m->sel_p[a++].id;
		} else if (a == m->nsel_p || np[b].id < m->sel_p[a].id) {
			up[np[b++].i] = 1;
		} else {
			if (m->sel_p[a].h != np[b].h)
				up[np[b].i] = 1;
			a++;
			b++;
		}
	}
	for (a = 0, b = 0; a < m->nsel_q || b < nnq;) {
		const struct jsel_pair *o = a < m->nsel_q ? &m->sel_q[a] : NULL;
		const struct jsel_pair *n = b < nnq ? &nq[b] : NULL;
		int c = !o ? 1 : !n ? -1 : cmp_snq(o, n);

		if (c < 0) {
			if (!in_sorted(drop, nd, o->src) && !in_sorted(drop, nd, o->dst))
				return 0;
			a++;
		} else if (c > 0) {
			add[n->k] = 1;
			b++;
		} else {
			if (o->key != n->key)
				add[n->k] = 1;
			a++;
			b++;
		}
	}
	*ndrop = nd;
	return 1;
}

/* m's selection becomes (np, nq), which it takes: what its PLAN of this
 * term gives it. */
static void sel_keep(struct jmember *m, struct jsel_part *np, size_t nnp,
		     struct jsel_pair *nq, size_t nnq)
{
	free(m->sel_p);
	free(m->sel_q);
	m->sel_p = np;
	m->sel_q = nq;
	m->nsel_p = nnp;
	m->nsel_q = nnq;
	m->sel_ok = 1;
}

/* A member's PLAN names the participants it deals with and the addresses
 * of their nodes, not the whole job's: its own participants (announced
 * by their presence) and the other end of each of its entries.  That is
 * what jplan_recv and the pairs read (job_part, job_addr); a job's whole
 * membership is the coordinator's (dtectl job there).
 *
 * Each participant and each address is packed once per re-plan, each
 * pair's entries once while the pair lasts (seg_build), a member's part
 * assembled from them when its pairs change (member_part); a PLAN is
 * fields 1-3, then 4, 5 and 6-9 as unknown fields holding those bytes in
 * field order: exactly what packing the whole message gives, so packing
 * it (kept copy, seal, transport) copies bytes instead of walking
 * messages, and a receiver's MAC check repacks the same bytes. */
static void send_plans(struct job *j, struct built *b)
{
	size_t i, k, mi, np, na, *poff = NULL;
	Dtep__Participant *pa = calloc(b->nparts ? b->nparts : 1, sizeof(*pa));
	uint32_t *pidx = NULL;
	Dtep__Plan__AddressesEntry *ae = calloc(b->nmem ? b->nmem : 1, sizeof(*ae));
	uint32_t *pmark = calloc(b->nparts ? b->nparts : 1, sizeof(*pmark));
	uint32_t *mmark = calloc(b->nmem ? b->nmem : 1, sizeof(*mmark));
	uint32_t *psel = calloc(b->nparts ? b->nparts : 1, sizeof(*psel));
	uint32_t *asel = calloc(b->nmem ? b->nmem : 1, sizeof(*asel));
	struct pieces ppc = { 0 }, apc = { 0 };
	uint8_t *pbody = NULL, *tbody = NULL, *ebody = NULL, *up = NULL, *add = NULL;
	size_t pcap = 0, tcap = 0, ecap = 0, ndelta = 0;
	struct jsel_part *snp = NULL;
	struct jsel_pair *snq = NULL;
	uint64_t *drop = NULL;
	struct jmember *m;
	Dtep__JobRef ref;

	if (!pa || !ae || !pmark || !mmark || !psel || !asel)
		goto oom;
	for (i = 0; i < b->nparts; i++) {
		const struct jpinfo *p = b->parts[i];

		dtep__participant__init(&pa[i]);
		pa[i].id = p->id;
		pa[i].role = p->role == JROLE_SOURCE ? DTEP__ROLE__ROLE_SOURCE : DTEP__ROLE__ROLE_SINK;
		pa[i].layout = (char *)p->layout;
		pa[i].rank = p->rank;
		pa[i].replica = p->replica;
		pa[i].node = (char *)p->node;
		pa[i].relay_parent = p->relay_parent;
		pa[i].relay_root = p->relay_root;
	}
	for (m = j->members, i = 0; m; m = m->next, i++) {
		dtep__plan__addresses_entry__init(&ae[i]);
		ae[i].key = m->node;
		ae[i].value = m->address;
	}
	if (pairs_by_member(b, &poff, &pidx) < 0 ||
	    pieces_pack(&ppc, 4, pa, sizeof(*pa), b->nparts) < 0 ||
	    pieces_pack(&apc, 6, ae, sizeof(*ae), b->nmem) < 0)
		goto oom;
	job_fill_ref(j, &ref);
	for (m = j->members, mi = 0; m; m = m->next, mi++) {
		Dtep__Plan plan = DTEP__PLAN__INIT, tail = DTEP__PLAN__INIT;
		ProtobufCMessageUnknownField uf[3];
		struct coord_step st = member_step(j, m->node, m, COORD_EV_PLAN_SENT);
		uint32_t stamp = (uint32_t)mi + 1;
		size_t plen = 0, tlen = 0, nu = 0, elen = 0, nq, nd = 0;
		int delta;

		if (st.act != COORD_A_SEND) {
			member_bad_action(j, m->node, COORD_EV_PLAN_SENT, st);
			continue;
		}
		/* Its participants and its peers, in the job's order. */
		for (i = 0; i < b->nparts; i++)
			if (b->pmem[i] == mi)
				pmark[i] = stamp;
		for (k = poff[mi]; k < poff[mi + 1]; k++) {
			pmark[b->ps[pidx[k]]] = stamp;
			pmark[b->pd[pidx[k]]] = stamp;
		}
		/* A relay's children: it forwards to them (their nodes'
		 * addresses come with them). */
		for (i = 0; i < b->nparts; i++)
			if (b->parts[i]->relay_parent && b->pmem[b->par_of[i]] == mi)
				pmark[i] = stamp;
		for (i = 0, np = 0; i < b->nparts; i++)
			if (pmark[i] == stamp) {
				psel[np++] = (uint32_t)i;
				mmark[b->pmem[i]] = stamp;
			}
		for (i = 0, na = 0; i < b->nmem; i++)
			if (mmark[i] == stamp) {
				asel[na++] = (uint32_t)i;
				tlen += apc.at[i + 1] - apc.at[i];
			}
		plan.job = &ref;
		plan.epoch = j->coord_epoch;
		plan.complete = b->complete;
		tail.peer_proto = PEER_PROTO_VERSION;
		tail.join_seq = m->join_seq;
		tail.join_nonce.data = j->auth ? m->nonce : NULL;
		tail.join_nonce.len = j->auth ? sizeof(m->nonce) : 0;
		/* What it gets now, against what its last PLAN gave it: only the
		 * difference when it acknowledged that one and lost no pair
		 * but with a participant it lost (peer protocol 8). */
		nq = poff[mi + 1] - poff[mi];
		snp = malloc((np ? np : 1) * sizeof(*snp));
		snq = malloc((nq ? nq : 1) * sizeof(*snq));
		up = calloc(np ? np : 1, 1);
		add = calloc(nq ? nq : 1, 1);
		drop = malloc((m->nsel_p ? m->nsel_p : 1) * sizeof(*drop));
		if (!snp || !snq || !up || !add || !drop)
			goto oom;
		for (i = 0; i < np; i++) {
			snp[i].id = b->parts[psel[i]]->id;
			snp[i].h = XXH64(ppc.buf + ppc.at[psel[i]], ppc.at[psel[i] + 1] - ppc.at[psel[i]],
					 0);
			snp[i].i = (uint32_t)i;
		}
		for (k = 0; k < nq; k++) {
			uint32_t x = pidx[poff[mi] + k];

			snq[k].src = b->parts[b->ps[x]]->id;
			snq[k].dst = b->parts[b->pd[x]]->id;
			snq[k].key = XXH64(b->pt[x], sizeof(b->pt[x]), 0);
			snq[k].k = (uint32_t)k;
		}
		qsort(snp, np, sizeof(*snp), cmp_snp);
		qsort(snq, nq, sizeof(*snq), cmp_snq);
		delta = m->sel_ok && !m->need_full && m->plan_term && m->acked_term == m->plan_term &&
			sel_delta(m, snp, np, snq, nq, up, add, drop, &nd);
		for (i = 0; i < np; i++)
			if (!delta || up[i])
				plen += ppc.at[psel[i] + 1] - ppc.at[psel[i]];
		if (delta) {
			tail.base_epoch = m->plan_term;
			tail.n_drop = nd;
			tail.drop = drop;
			for (k = 0; k < nq; k++)
				if (add[k])
					elen += b->c->seg[b->pslot[pidx[poff[mi] + k]]].len;
		} else if (b->changed[mi] &&
			   member_part(m, b, pidx + poff[mi], poff[mi + 1] - poff[mi], b->mkey[mi]) < 0) {
			goto oom;
		}
		tlen += protobuf_c_message_get_packed_size(&tail.base);
		if (buf_reserve(&pbody, &pcap, plen) < 0 || buf_reserve(&tbody, &tcap, tlen) < 0 ||
		    buf_reserve(&ebody, &ecap, elen) < 0)
			goto oom;
		{
			uint8_t *at = pbody;

			for (i = 0; i < np; i++) {
				size_t a0 = ppc.at[psel[i]], a1 = ppc.at[psel[i] + 1];

				if (delta && !up[i])
					continue;
				memcpy(at, ppc.buf + a0, a1 - a0);
				at += a1 - a0;
			}
			at = ebody;
			for (k = 0; delta && k < nq; k++) {
				const struct jseg *g = &b->c->seg[b->pslot[pidx[poff[mi] + k]]];

				if (!add[k])
					continue;
				memcpy(at, g->bytes, g->len);
				at += g->len;
			}
			at = tbody;
			for (i = 0; i < na; i++) {
				size_t a0 = apc.at[asel[i]], a1 = apc.at[asel[i] + 1];

				memcpy(at, apc.buf + a0, a1 - a0);
				at += a1 - a0;
			}
			protobuf_c_message_pack(&tail.base, at);
			if (plen)
				unknown_from(&uf[nu++], pbody, plen);
			if (delta && elen)
				unknown_from(&uf[nu++], ebody, elen);
			else if (!delta && m->part_len)
				unknown_from(&uf[nu++], m->part, m->part_len);
			/* peer_proto (7) is never 0: the tail is never empty. */
			unknown_from(&uf[nu++], tbody, tlen);
			plan.base.n_unknown_fields = (unsigned)nu;
			plan.base.unknown_fields = uf;
		}
		sel_keep(m, snp, np, snq, nq);
		snp = NULL;
		snq = NULL;
		m->need_full = 0;
		if (delta) {
			m->plans_delta++;
			ndelta++;
		} else {
			m->plans_full++;
		}
		dmetrics_add(DM_PLANS, delta ? "sent_changes" : "sent_whole", 1);
		/* Kept until acknowledged: retries and duplicate JOINs resend it. */
		free(m->plan);
		m->plan_len = protobuf_c_message_get_packed_size(&plan.base);
		m->plan = malloc(m->plan_len ? m->plan_len : 1);
		m->plan_term = j->coord_epoch;
		m->deadline_ns = jio_now(j->eng) + (uint64_t)PEER_PLAN_DEADLINE_MS * 1000000u;
		m->expired = 0;
		retry_arm(j->eng, &m->next_ns, &m->backoff_ms, 1);
		if (m->plan)
			protobuf_c_message_pack(&plan.base, m->plan);
		else
			m->plan_len = 0;
		if (jio_send(j->eng, m->node, m->address, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN, &plan.base,
			       NULL, 0) < 0)
			DLOG_W("job %s: cannot send plan epoch %llx to %s (retried)", j->name,
			       (unsigned long long)j->coord_epoch, m->node);
		member_done(j, m->node, st);
		free(up);
		free(add);
		free(drop);
		up = add = NULL;
		drop = NULL;
	}
	DLOG_I("job %s: plan epoch %llx: %zu of %zu members sent only what changed", j->name,
	       (unsigned long long)j->coord_epoch, ndelta, b->nmem);
	jctl_update(j->eng);
	goto out;
oom:
	DLOG_E("job %s: out of memory sending plans", j->name);
out:
	free(snp);
	free(snq);
	free(up);
	free(add);
	free(drop);
	free(ebody);
	free(pa);
	free(poff);
	free(pidx);
	free(ae);
	free(pmark);
	free(mmark);
	free(psel);
	free(asel);
	pieces_free(&ppc);
	pieces_free(&apc);
	free(pbody);
	free(tbody);
}

/* A source that registers shards: the layout is every rank's table, and
 * only once every rank attached (a missing rank's elements have no source
 * yet, so no plan covers them).  Replaces *src; -1 with the reason (then
 * *src is finalised). */
static int sharded_sources(struct job *j, const char *desc, const struct jpinfo **srcby,
			   struct dte_layout *src, int *complete, char *err, size_t errlen)
{
	uint32_t r, nranks = src->nranks;
	size_t len = 1;
	char *all, *at;
	int rc;

	*complete = 1;
	for (r = 0; r < nranks; r++) {
		if (!srcby[r])
			*complete = 0;
		else if (r < j->n_src_shards && j->src_shards[r])
			len += strlen(j->src_shards[r]) + 1;
	}
	dte_layout_fini(src);
	if (!*complete)
		return jlayout_build(j, JROLE_SOURCE, desc, 0, NULL, src, err, errlen);
	if (!(all = malloc(len)))
		return derr_fail(err, errlen, -ENOMEM, "out of memory");
	at = all;
	for (r = 0; r < nranks; r++) {
		if (r < j->n_src_shards && j->src_shards[r]) {
			size_t n = strlen(j->src_shards[r]);

			memcpy(at, j->src_shards[r], n);
			at += n;
			*at++ = '\n';
		}
	}
	*at = 0;
	rc = jlayout_build(j, JROLE_SOURCE, desc, 0, all, src, err, errlen);
	free(all);
	return rc;
}

/* Coordinator: keeps a source rank's shard table from its JOIN. */
static int keep_shards(struct job *j, uint32_t rank, const char *shards)
{
	char *copy;

	if (rank >= j->n_src_shards) {
		char **n = realloc(j->src_shards, ((size_t)rank + 1) * sizeof(*n));

		if (!n)
			return -ENOMEM;
		memset(n + j->n_src_shards, 0, (rank + 1 - j->n_src_shards) * sizeof(*n));
		j->src_shards = n;
		j->n_src_shards = rank + 1;
	}
	if (!(copy = strdup(shards ? shards : "")))
		return -ENOMEM;
	free(j->src_shards[rank]);
	j->src_shards[rank] = copy;
	j->src_shards_gen++;
	return 0;
}

/* The source layout to plan against, from the cache (built when its key
 * changed); 0 when there is one, with *complete set, else a negative
 * errno and nothing is planned: -EINVAL a layout that does not build (or
 * shard tables that do not fit it, logged), -EAGAIN a sharded source not
 * every rank of which sent its shards yet. */
static int cache_source(struct job *j, struct jplan_cache *c, const char *srcdesc,
			const struct jpinfo **srcby, int *complete)
{
	int sharded = dte_layout_desc_sharded(srcdesc);
	uint64_t gen = sharded ? j->src_shards_gen : 0;
	char err[512];

	if (strcmp(c->src_desc, srcdesc) || c->src_gen != gen) {
		cache_drop(c);
		snprintf(c->src_desc, sizeof(c->src_desc), "%s", srcdesc);
		c->src_gen = gen;
		c->src_ok = jlayout_build(j, JROLE_SOURCE, srcdesc, 0, NULL, &c->src, err,
					  sizeof(err)) == 0;
		if (!c->src_ok)
			snprintf(c->src_err, sizeof(c->src_err), "source %s: %s", srcdesc, err);
	}
	if (!c->src_ok) {
		snprintf(j->coord_plan_err, sizeof(j->coord_plan_err), "%s", c->src_err);
		return -EINVAL;
	}
	*complete = 1;
	if (!sharded) {
		for (size_t i = 0; i < c->src.npieces; i++)
			if (!srcby[c->src.pieces[i].rank])
				*complete = 0;
		return 0;
	}
	for (uint32_t r = 0; r < c->src.nranks; r++)
		if (!srcby[r])
			*complete = 0;
	if (!*complete)
		return -EAGAIN;	/* not every rank's shards are known: nothing to plan yet */
	if (!c->src_full) {
		if (sharded_sources(j, srcdesc, srcby, &c->src, complete, err, sizeof(err)) < 0) {
			DLOG_E("job %s: source %s: %s", j->name, srcdesc, err);
			snprintf(c->src_err, sizeof(c->src_err),
				 "the sources' shard tables do not make a layout of %s: %s", srcdesc, err);
			snprintf(j->coord_plan_err, sizeof(j->coord_plan_err), "%s", c->src_err);
			c->src_ok = 0;
			return -EINVAL;
		}
		c->src_full = 1;
	}
	return 0;
}

/* Relay (docs/SYNC.md, "Relay between sink daemons"): the replicas of
 * one sink layout hold, rank for rank, the same entries, so the sources
 * need send rank r's records to a few of them (the roots) and every
 * other replica's rank r gets them from a replica that has them: a tree
 * per (layout, rank), its shape relay_plan_shape's (replica i >= roots
 * fed by replica (i - roots) / fanout, in replica order).  Sets each
 * sink's relay_parent and relay_root (0 for sinks not relayed) and, for
 * each relayed part, par_of[i], its parent's index in parts; -ENOMEM. */
static int cmp_sink(const void *a, const void *b, void *parts)
{
	const struct jpinfo *x = ((struct jpinfo **)parts)[*(const uint32_t *)a];
	const struct jpinfo *y = ((struct jpinfo **)parts)[*(const uint32_t *)b];
	int c = strcmp(x->layout, y->layout);

	if (c)
		return c;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->lagging != y->lagging)
		return x->lagging - y->lagging;	/* a lagging relay: a leaf */
	if (x->slow != y->slow)
		return x->slow - y->slow;	/* a slow link: a leaf */
	if (x->replica != y->replica)
		return x->replica < y->replica ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* A rate measured at sample_ns is used until [peer]
 * relay_rate_max_age_ms after it. */
static int rate_fresh(const struct dte_engine *e, uint64_t sample_ns, uint64_t now)
{
	return now <= sample_ns + (uint64_t)e->relay_rate_age_ms * 1000000u;
}

/* Measured send rates by node (relay_shape = measured): up, the fastest
 * a node sent toward any other (RATES, and this daemon's own jlinks), and
 * down, the fastest any node sent toward it.  A relay forwards at its
 * up; a sink that never sent is judged by its down. */
struct node_rate {
	const char *node;
	double up, down;
};

static int cmp_node_rate(const void *a, const void *b)
{
	return strcmp(((const struct node_rate *)a)->node, ((const struct node_rate *)b)->node);
}

static struct node_rate *rate_find(struct node_rate *v, size_t n, const char *node)
{
	struct node_rate k = { .node = node };

	return n ? bsearch(&k, v, n, sizeof(*v), cmp_node_rate) : NULL;
}

static void rate_link(struct node_rate *v, size_t n, const char *from, const char *to, double Bps)
{
	struct node_rate *a = rate_find(v, n, from), *b = rate_find(v, n, to);

	if (Bps <= 0)
		return;
	if (a && Bps > a->up)
		a->up = Bps;
	if (b && Bps > b->down)
		b->down = Bps;
}

/* The nodes of the job's members with what was measured of them; NULL
 * (n 0) when nothing was, or out of memory.  pair_bytes: the largest a
 * member reported (a version's bytes per pair, recent versions). */
static struct node_rate *node_rates(const struct job *j, size_t *n, double *pair_bytes)
{
	const char *self = jio_self(j->eng);
	uint64_t now = jio_now(j->eng);
	struct node_rate *v;
	size_t k = 0, any = j->nlinks;

	*n = 0;
	*pair_bytes = j->pair_bytes;
	for (const struct jmember *m = j->members; m; m = m->next) {
		k++;
		any += m->nrates;
		if (m->pair_bytes > *pair_bytes)
			*pair_bytes = m->pair_bytes;
	}
	if (!any || !(v = calloc(k + 1, sizeof(*v))))
		return NULL;
	k = 0;
	for (const struct jmember *m = j->members; m; m = m->next)
		v[k++].node = m->node;
	v[k++].node = self;
	qsort(v, k, sizeof(*v), cmp_node_rate);
	*n = 0;
	for (size_t i = 0; i < k; i++)	/* this daemon is a member too, mostly */
		if (!*n || strcmp(v[*n - 1].node, v[i].node))
			v[(*n)++] = v[i];
	for (size_t i = 0; i < j->nlinks; i++)
		if (rate_fresh(j->eng, j->links[i].m.sample_ns, now))
			rate_link(v, *n, self, j->links[i].node, j->links[i].m.Bps);
	for (const struct jmember *m = j->members; m; m = m->next)
		if (strcmp(m->node, self))	/* its own: the jlinks above */
			for (size_t i = 0; i < m->nrates; i++)
				if (rate_fresh(j->eng, m->rates[i].sample_ns, now))
					rate_link(v, *n, m->node, m->rates[i].to, m->rates[i].Bps);
	return v;
}

static double node_rate_of(struct node_rate *v, size_t n, const char *node)
{
	const struct node_rate *r = rate_find(v, n, node);

	return !r ? 0 : r->up > 0 ? r->up : r->down;
}

/* One signature step (FNV-1a over 64-bit words). */
static uint64_t sig_mix(uint64_t h, uint64_t x)
{
	for (int i = 0; i < 8; i++, x >>= 8)
		h = (h ^ (x & 0xff)) * 0x100000001b3ull;
	return h;
}

/* The measured shape of one group's replicas (parts[s[0..k)], one
 * layout and rank): each one's slow flag, and its roots and fanout.
 * Logged when it is not the configured shape. */
static void group_measured(struct job *j, struct jpinfo **parts, const uint32_t *s, uint32_t k,
			   struct node_rate *nr, size_t nnr, double pair_bytes, uint32_t *roots,
			   uint32_t *fanout, int quiet)
{
	struct relay_measured in = {
		.replicas = k, .roots = *roots, .fanout = *fanout, .max_fanout = *fanout,
		.part_bytes = (double)j->eng->part_bytes,
		/* a relay's check of a part before it forwards it: about
		 * 3 GB/s (bench_peer_auth's Poly1305) */
		.verify_s = (double)j->eng->part_bytes / 3e9, .latency = 50e-6,
	};
	struct relay_choice ch;
	double *rate = calloc(k, sizeof(*rate)), src = 0;
	uint8_t *slow = calloc(k, 1);
	uint32_t nsrc = 0;

	if (!rate || !slow)
		goto out;
	for (uint32_t i = 0; i < k; i++)
		rate[i] = node_rate_of(nr, nnr, parts[s[i]]->node);
	/* The sources' send rate: the slowest source node's, measured. */
	for (const struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->n; i++)
			if (m->p[i].role == JROLE_SOURCE) {
				double r = node_rate_of(nr, nnr, m->p[i].node);

				nsrc++;
				if (r > 0 && (!src || r < src))
					src = r;
			}
	in.rate = rate;
	in.src_rate = src;
	/* One replica rank's bytes: a pair-version's from each source rank. */
	in.bytes = pair_bytes * (nsrc ? nsrc : 1);
	if (relay_choose_measured(&in, &ch, slow) < 0)
		goto out;
	for (uint32_t i = 0; i < k; i++)
		parts[s[i]]->slow = slow[i];
	if (!quiet && (ch.nslow || ch.modelled))
		DLOG_N("job %s: relay shape of %s rank %u from measured rates: %u roots, fanout %u%s"
		       " (model %.3g s, configured %.3g s), %u slow of %u (median %.3g MB/s)",
		       j->name, parts[s[0]]->layout, parts[s[0]]->rank, ch.roots, ch.fanout,
		       ch.modelled ? "" : " as configured", ch.model_s, ch.fixed_s, ch.nslow, k,
		       ch.median / 1e6);
	*roots = ch.roots;
	*fanout = ch.fanout;
out:
	free(rate);
	free(slow);
}

/* The end of the group (one layout and rank) starting at s[g0]. */
static size_t group_end(struct jpinfo **parts, const uint32_t *s, size_t g0, size_t n)
{
	size_t g1 = g0 + 1;

	while (g1 < n && parts[s[g1]]->rank == parts[s[g0]]->rank &&
	       !strcmp(parts[s[g1]]->layout, parts[s[g0]]->layout))
		g1++;
	return g1;
}

/* Relay trees of parts (s: the sinks' indices, sorted by cmp_sink).
 * dry: only the shape's signature (and the slow flags), no parents. */
static int relay_assign_do(struct job *j, struct jpinfo **parts, size_t nparts, uint32_t *par_of,
			   size_t *trees, uint64_t *sig, int dry)
{
	uint32_t fanout0 = j->eng->relay_fanout;
	uint32_t roots0 = j->eng->relay_roots ? j->eng->relay_roots : 1;
	uint32_t *s, *shape = NULL;
	size_t n = 0, g0, g1, g, nnr = 0;
	struct node_rate *nr = NULL;
	double pair_bytes = 0;
	uint64_t h = 0xcbf29ce484222325ull;

	*trees = 0;
	if (fanout0 && j->eng->relay_measured)
		nr = node_rates(j, &nnr, &pair_bytes);
	for (size_t i = 0; i < nparts; i++) {
		if (!dry) {
			parts[i]->relay_parent = 0;
			parts[i]->relay_root = 0;
		}
		if (!nr)
			parts[i]->slow = 0;	/* nothing measured, or relay_shape fixed */
		n += parts[i]->role == JROLE_SINK;
	}
	if (!fanout0 || n < 2) {
		free(nr);
		*sig = h;
		return 0;
	}
	if (!(s = malloc(n * sizeof(*s)))) {
		free(nr);
		return -ENOMEM;
	}
	n = 0;
	for (size_t i = 0; i < nparts; i++)
		if (parts[i]->role == JROLE_SINK)
			s[n++] = (uint32_t)i;
	/* Groups first (layout, rank), each group's slow flags, roots and
	 * fanout from the rates (shape[2g], shape[2g+1]), then the order
	 * within each group (cmp_sink reads the flags; the groups stay). */
	qsort_r(s, n, sizeof(*s), cmp_sink, parts);
	if (nr && !(shape = malloc(2 * n * sizeof(*shape)))) {
		free(nr);
		free(s);
		return -ENOMEM;
	}
	for (g0 = 0, g = 0; g0 < n && nr; g0 = g1, g++) {
		g1 = group_end(parts, s, g0, n);
		shape[2 * g] = roots0;
		shape[2 * g + 1] = fanout0;
		group_measured(j, parts, s + g0, (uint32_t)(g1 - g0), nr, nnr, pair_bytes,
			       &shape[2 * g], &shape[2 * g + 1], dry != 2);
	}
	if (nr)
		qsort_r(s, n, sizeof(*s), cmp_sink, parts);
	for (g0 = 0, g = 0; g0 < n; g0 = g1, g++) {
		struct relay_in in = { .bytes = 1, .part_bytes = 1, .src_rate = 1, .sink_rate = 1 };
		struct relay_plan rp;
		uint32_t roots = shape ? shape[2 * g] : roots0;
		uint32_t fanout = shape ? shape[2 * g + 1] : fanout0;

		g1 = group_end(parts, s, g0, n);
		in.replicas = (uint32_t)(g1 - g0);
		/* The signature: each group's members in tree order, roots,
		 * fanout. */
		h = sig_mix(h, roots);
		h = sig_mix(h, fanout);
		for (size_t k = g0; k < g1; k++)
			h = sig_mix(h, parts[s[k]]->id);
		if (dry || in.replicas < 2 || roots >= in.replicas)
			continue;
		if (relay_plan_shape(&in, roots, fanout, &rp) < 0) {
			free(shape);
			free(nr);
			free(s);
			return -ENOMEM;
		}
		/* A parent precedes its children (relay_plan.h): its root is
		 * known when theirs is set. */
		for (uint32_t k = 0; k < in.replicas; k++) {
			struct jpinfo *x = parts[s[g0 + k]];
			int32_t up = rp.parent[k];

			if (up < 0) {
				x->relay_root = x->id;
				continue;
			}
			par_of[s[g0 + k]] = s[g0 + (size_t)up];
			x->relay_parent = parts[par_of[s[g0 + k]]]->id;
			x->relay_root = parts[par_of[s[g0 + k]]]->relay_root;
		}
		*trees += roots;
		relay_plan_fini(&rp);
	}
	free(shape);
	free(nr);
	free(s);
	*sig = h;
	return 0;
}

static int relay_assign(struct job *j, struct jpinfo **parts, size_t nparts, uint32_t *par_of,
			size_t *trees)
{
	return relay_assign_do(j, parts, nparts, par_of, trees, &j->shape_sig, 0);
}

/* A relay that lags but lives (docs/SYNC.md, "Relay between sink
 * daemons"): a relay (a sink with children in the plan, not a root) that
 * has not staged a version its parent holds and the sources sent it under
 * the current plan, while its parent holds a version two newer than its
 * own, for [peer] relay_lag_ms, is planned as a leaf of its
 * tree (cmp_sink), so its children get another parent from the next
 * version on; once it holds what its tree's root holds it takes its place
 * again, at a moment no version is on its way (a re-plan re-parents
 * replicas, who would miss one in flight).  What a sink holds and was
 * sent is what the sources know (their pairs' pair_sm: staged, last_sent
 * and the term it went out under): the coordinator's own, and the
 * members' as their RATES report it (peer protocol 10, RATES.seen, under
 * the member's term: its sent counts only when that is the newest plan's,
 * coord_epoch).  A root
 * is not judged (nothing above it to compare with: a lagging root's
 * children keep the pairs' own rules, dense and direct once
 * unacknowledged).  A replica that missed a version because the relay
 * above it lagged was not sent it under the plan that re-parented it, so
 * it is not judged for that version. */

static void replan(struct job *j);

/* No version on its way from this daemon's sources: none capturing, and
 * every pair's sink staged what was sent to it under the current term.
 * A re-plan re-parents replicas, who would miss a version in flight. */
static int versions_quiet(const struct job *j)
{
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];

		if (job_local((struct job *)j, p->src) && p->sm.sent_epoch == j->epoch &&
		    p->sm.last_sent > p->sm.staged)
			return 0;
	}
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (l->info.role == JROLE_SOURCE && jsource_of(l)->busy)
			return 0;
	/* ...nor from the members' sources, as they last reported */
	for (const struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->nseen && m->seen_epoch == j->coord_epoch; i++)
			if (m->seen[i].sent > m->seen[i].staged)
				return 0;
	return 1;
}

/* --------------------------------------------- relay shape from measured links */

/* What this daemon's sources know of each sink they feed: per sink, the
 * newest version it staged and the newest sent to it under the current
 * term (0: none), one entry a sink, sorted by id.  *n 0 when none. */
struct lag_sink {
	uint64_t id, staged;
	uint64_t sent;             /* newest sent to it under the current term */
	int kids;                  /* it has children in the plan */
};

static int cmp_lag(const void *a, const void *b)
{
	const struct lag_sink *x = a, *y = b;

	return x->id < y->id ? -1 : x->id > y->id;
}

static struct lag_sink *lag_find(struct lag_sink *v, size_t n, uint64_t id)
{
	struct lag_sink k = { .id = id };

	return id ? bsearch(&k, v, n, sizeof(*v), cmp_lag) : NULL;
}

/* Merged by sink: the newest any entry saw or sent. */
static size_t lag_merge(struct lag_sink *v, size_t k)
{
	size_t n = 0;

	qsort(v, k, sizeof(*v), cmp_lag);
	for (size_t i = 0; i < k; i++) {
		if (n && v[n - 1].id == v[i].id) {
			if (v[i].staged > v[n - 1].staged)
				v[n - 1].staged = v[i].staged;
			if (v[i].sent > v[n - 1].sent)
				v[n - 1].sent = v[i].sent;
		} else {
			v[n++] = v[i];
		}
	}
	return n;
}

static struct lag_sink *local_seen(const struct job *j, size_t extra, size_t *n)
{
	struct lag_sink *v;
	size_t k = 0;

	*n = 0;
	for (size_t i = 0; i < j->npairs; i++)
		k += job_local((struct job *)j, j->pairs[i].src) != NULL;
	if (!(k + extra) || !(v = malloc((k + extra) * sizeof(*v))))
		return NULL;
	k = 0;
	for (size_t i = 0; i < j->npairs; i++) {
		const struct jpair *p = &j->pairs[i];

		if (job_local((struct job *)j, p->src))
			v[k++] = (struct lag_sink){ p->dst, p->sm.staged,
						    p->sm.sent_epoch == j->epoch ? p->sm.last_sent : 0,
						    0 };
	}
	*n = lag_merge(v, k);
	return v;
}

/* The plan this member holds has relay trees (RATES are for them). */
static int plan_relayed(const struct job *j)
{
	for (size_t i = 0; i < j->nparts; i++)
		if (j->parts[i].relay_root)
			return 1;
	return 0;
}


/* The coordinator: when the next rate it uses expires (0: none); the
 * shape is looked at again then (a slow leaf sends nothing, so its rate
 * is never measured again: once expired it takes its place again). */
static void rates_expiry(struct job *j, uint64_t now)
{
	uint64_t age = (uint64_t)j->eng->relay_rate_age_ms * 1000000u, t = 0;

	for (size_t i = 0; i < j->nlinks; i++)
		if (j->links[i].m.Bps > 0 && rate_fresh(j->eng, j->links[i].m.sample_ns, now) &&
		    (!t || j->links[i].m.sample_ns + age < t))
			t = j->links[i].m.sample_ns + age;
	for (const struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->nrates; i++)
			if (rate_fresh(j->eng, m->rates[i].sample_ns, now) &&
			    (!t || m->rates[i].sample_ns + age < t))
				t = m->rates[i].sample_ns + age;
	j->rates_expiry_ns = t ? t + 1 : 0;
}

/* The shape is looked at this long after the newest rates came (each
 * new RATES or own sample pushes it on): one look once every member's
 * report of a version is in, not one per report, which would re-plan
 * on part of the picture (a replica whose own report is not in yet is
 * judged by what it was sent). */
#define SHAPE_SETTLE_NS (2ull * PEER_RATES_MIN_MS * 1000000u)

/* A member's send rates, and what its sources know of the sinks they
 * feed, go to the coordinator (peer protocol 10, RATES); the
 * coordinator's own wait for the shape check. */
static void rates_tick(struct job *j, uint64_t now)
{
	Dtep__Rates r = DTEP__RATES__INIT;
	Dtep__JobRef ref;
	Dtep__LinkRate *lr = NULL, **lp = NULL;
	Dtep__SinkSeen *ss = NULL, **sp = NULL;
	struct lag_sink *seen = NULL;
	size_t n = 0, nseen = 0;
	int rc;

	j->rates_sent_gen = j->rates_gen;
	j->rates_sent_ns = now;
	if (j->is_coord) {
		if (j->eng->relay_measured && j->eng->relay_fanout)
			j->shape_due_ns = now + SHAPE_SETTLE_NS;
		return;
	}
	if (j->coord_proto < PEER_PROTO_RATES || !j->coord_node[0] || j->coord_down ||
	    !plan_relayed(j))
		return;
	seen = local_seen(j, 0, &nseen);
	if ((j->nlinks && (!(lr = calloc(j->nlinks, sizeof(*lr))) ||
			   !(lp = calloc(j->nlinks, sizeof(*lp))))) ||
	    (nseen && (!(ss = calloc(nseen, sizeof(*ss))) ||
		       !(sp = calloc(nseen, sizeof(*sp)))))) {
		free(lr);
		free(lp);
		free(ss);
		free(seen);
		return;
	}
	for (size_t i = 0; i < nseen; i++) {
		dtep__sink_seen__init(&ss[i]);
		ss[i].sink = seen[i].id;
		ss[i].staged = seen[i].staged;
		ss[i].sent = seen[i].sent;
		sp[i] = &ss[i];
	}
	r.epoch = j->epoch;
	r.seen = sp;
	r.n_seen = nseen;
	for (size_t i = 0; i < j->nlinks; i++) {
		if (j->links[i].m.Bps <= 0 || !rate_fresh(j->eng, j->links[i].m.sample_ns, now))
			continue;
		dtep__link_rate__init(&lr[n]);
		lr[n].to = j->links[i].node;
		lr[n].bytes_per_s = j->links[i].m.Bps;
		lr[n].age_ms = (now - j->links[i].m.sample_ns) / 1000000u;
		lp[n] = &lr[n];
		n++;
	}
	job_fill_ref(j, &ref);
	r.job = &ref;
	r.node = (char *)jio_self(j->eng);
	r.links = lp;
	r.n_links = n;
	r.pair_bytes = j->pair_bytes;
	rc = jio_send(j->eng, j->coord_node, NULL, DTEP__PEER_MSG_TYPE__PEER_MSG_RATES, &r.base,
		      NULL, 0);
	if (rc < 0)
		DLOG_I("job %s: cannot send RATES to %s: %s", j->name, j->coord_node, strerror(-rc));
	free(lr);
	free(lp);
	free(ss);
	free(sp);
	free(seen);
}


/* Members' links and sinks seen the coordinator keeps, at most. */
#define RATES_MAX_LINKS 4096
#define RATES_MAX_SEEN  (1u << 20)

void jcoord_rates(struct job *j, const char *from, const Dtep__Rates *m)
{
	struct jmember *mem = member_find(j, from);
	struct jlinkrate *v = NULL;
	struct jseen *sv = NULL;
	uint64_t now = jio_now(j->eng);
	size_t n = 0;

	if (!mem)
		return;	/* not (yet) a member: its next RATES counts */
	if (m->n_links > RATES_MAX_LINKS || m->n_seen > RATES_MAX_SEEN ||
	    !isfinite(m->pair_bytes) || m->pair_bytes < 0) {
		j->refused++;
		DLOG_W("job %s: RATES from %s refused: %zu links, %zu sinks seen, pair bytes %g",
		       j->name, from, m->n_links, m->n_seen, m->pair_bytes);
		return;
	}
	if ((m->n_links && !(v = calloc(m->n_links, sizeof(*v)))) ||
	    (m->n_seen && !(sv = calloc(m->n_seen, sizeof(*sv))))) {
		free(v);
		return;
	}
	for (size_t i = 0; i < m->n_seen; i++)
		sv[i] = (struct jseen){ m->seen[i]->sink, m->seen[i]->staged, m->seen[i]->sent };
	free(mem->seen);
	mem->seen = sv;
	mem->nseen = m->n_seen;
	mem->seen_epoch = m->epoch;
	DLOG_D("job %s: RATES from %s: %zu links, %zu sinks seen under %llx", j->name, from,
	       m->n_links, m->n_seen, (unsigned long long)m->epoch);
	for (size_t i = 0; i < m->n_links; i++) {
		const Dtep__LinkRate *l = m->links[i];
		uint64_t age = l ? l->age_ms * 1000000u : 0;

		if (!l || !l->to || !l->to[0] || !isfinite(l->bytes_per_s) || l->bytes_per_s <= 0 ||
		    l->age_ms > (uint64_t)j->eng->relay_rate_age_ms)
			continue;
		snprintf(v[n].to, sizeof(v[n].to), "%s", l->to);
		v[n].sample_ns = now > age ? now - age : 0;
		v[n++].Bps = l->bytes_per_s;
	}
	free(mem->rates);
	mem->rates = v;
	mem->nrates = n;
	mem->pair_bytes = m->pair_bytes;
	if (j->eng->relay_measured && j->eng->relay_fanout) {
		j->shape_due_ns = now + SHAPE_SETTLE_NS;
		jctl_update(j->eng);
	}
}

static int relay_assign_do(struct job *j, struct jpinfo **parts, size_t nparts, uint32_t *par_of,
			   size_t *trees, uint64_t *sig, int dry);

/* New rates: re-planned when they choose another shape than the plan's
 * (relay_assign_do's signature), between versions. */
static void shape_check(struct job *j, uint64_t now)
{
	struct jpinfo **parts;
	size_t n = 0, trees;
	uint64_t sig;

	j->shape_due_ns = 0;
	if (!j->is_coord || !j->eng->relay_measured || !j->eng->relay_fanout)
		return;
	rates_expiry(j, now);
	if (!versions_quiet(j)) {
		j->shape_due_ns = now + (uint64_t)PEER_RATES_MIN_MS * 1000000u;
		return;
	}
	for (struct jmember *m = j->members; m; m = m->next)
		n += m->n;
	if (!n || !(parts = malloc(n * sizeof(*parts))))
		return;
	n = 0;
	for (struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->n; i++)
			parts[n++] = &m->p[i];
	if (relay_assign_do(j, parts, n, NULL, &trees, &sig, 1) == 0 && sig != j->shape_sig) {
		j->reshapes++;
		dmetrics_add(DM_RELAY_RESHAPES, "measured", 1);
		relay_assign_do(j, parts, n, NULL, &trees, &sig, 2);	/* says why */
		DLOG_N("job %s: the measured send rates choose another relay shape: re-planned",
		       j->name);
		free(parts);
		replan(j);
		return;
	}
	free(parts);
}

static void relay_lag_check(struct job *j, uint64_t now)
{
	uint64_t lag_ns = (uint64_t)j->eng->relay_lag_ms * 1000000u;
	struct lag_sink *v;
	size_t n = 0, k, extra = 0, changed = 0;
	int quiet;

	/* One entry a sink: the newest this daemon's sources and the
	 * members' (RATES.seen) saw or sent. */
	for (struct jmember *m = j->members; m; m = m->next)
		extra += m->nseen;
	if (!(v = local_seen(j, extra, &k)))
		return;
	for (struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->nseen; i++)
			v[k++] = (struct lag_sink){ m->seen[i].sink, m->seen[i].staged,
						    m->seen_epoch == j->coord_epoch ? m->seen[i].sent : 0,
						    0 };
	n = lag_merge(v, k);
	quiet = versions_quiet(j);
	for (struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->n; i++) {
			struct lag_sink *up = lag_find(v, n, m->p[i].relay_parent);

			if (up)
				up->kids = 1;
		}
	for (struct jmember *m = j->members; m; m = m->next)
		for (size_t i = 0; i < m->n; i++) {
			struct jpinfo *x = &m->p[i];
			const struct lag_sink *me = lag_find(v, n, x->id);
			const struct lag_sink *up = me ? lag_find(v, n, x->relay_parent) : NULL;
			const struct lag_sink *root = me ? lag_find(v, n, x->relay_root) : NULL;

			if (x->role != JROLE_SINK || !me)
				continue;
			if (x->lagging) {
				/* A leaf now, maybe under a parent that lags too:
				 * caught up once it holds what the root holds. */
				uint64_t top = root && root->staged > me->staged ? root->staged : 0;

				if (up && up->staged > top)
					top = up->staged;
				/* And it moves back between versions: a re-plan
				 * while one is on its way costs the replicas it
				 * re-parents that version. */
				if (top > me->staged || !quiet)
					continue;
				x->lagging = 0;
				x->lag_since_ns = 0;
				changed++;
				dmetrics_add(DM_RELAY_LAG, "caught_up", 1);
				DLOG_N("job %s: relay %llx on %s caught up (v%llu): planned in its place "
				       "again", j->name, (unsigned long long)x->id, x->node,
				       (unsigned long long)me->staged);
				continue;
			}
			/* A whole version behind its parent: a relay that is
			 * slow within a version (its parent holds it, it will
			 * soon) is not judged, since a re-plan in the middle
			 * of a version costs that version to the replicas it
			 * re-parents (bench_fanout's chain of 16 on 2 shared
			 * cores lost one to a relay 1 s behind in a dense one). */
			if (!me->kids || !up || me->sent <= me->staged || up->staged < me->sent ||
			    up->staged < me->staged + 2) {
				x->lag_since_ns = 0;
				continue;
			}
			if (!x->lag_since_ns)
				x->lag_since_ns = now;
			if (now - x->lag_since_ns < lag_ns)
				continue;
			x->lagging = 1;
			changed++;
			dmetrics_add(DM_RELAY_LAG, "lagging", 1);
			DLOG_N("job %s: relay %llx on %s lags (holds v%llu; v%llu sent, its parent holds "
			       "it, for %llu ms): planned as a leaf, its children under another parent",
			       j->name, (unsigned long long)x->id, x->node,
			       (unsigned long long)me->staged, (unsigned long long)me->sent,
			       (unsigned long long)((now - x->lag_since_ns) / 1000000u));
		}
	/* A replica's ranks move together: each rank of a replica that has
	 * one lagging is planned as a leaf in the same re-plan, so no
	 * version reaches some of its ranks by a new parent and the others
	 * not (judged apart, from reports that came at different moments,
	 * the ranks of one stopped relay were re-planned two versions
	 * apart).  Each takes its place again once it caught up. */
	for (struct jmember *m = j->members; m && changed; m = m->next)
		for (size_t i = 0; i < m->n; i++) {
			const struct jpinfo *x = &m->p[i];

			if (x->role != JROLE_SINK || !x->lagging)
				continue;
			for (size_t q = 0; q < m->n; q++) {
				struct jpinfo *y = &m->p[q];

				if (y->role != JROLE_SINK || y->lagging || y->replica != x->replica ||
				    strcmp(y->layout, x->layout))
					continue;
				y->lagging = 1;
				y->lag_since_ns = x->lag_since_ns;
				changed++;
				dmetrics_add(DM_RELAY_LAG, "lagging", 1);
				DLOG_N("job %s: sink %llx on %s planned as a leaf with rank %u of its "
				       "replica, which lags", j->name, (unsigned long long)y->id, y->node,
				       x->rank);
			}
		}
	free(v);
	if (changed)
		replan(j);
}

/* Every join and leave: the next term, and each member its part of the
 * plan of everyone attached.  What depends only on layouts is cached
 * (struct jplan_cache); what is rebuilt is the mapping of the cached
 * entries onto the participants attached now, by sink rank. */
static void replan(struct job *j)
{
	struct built b;
	struct jplan_cache *c = j->plan_cache;
	size_t n = 0, i, total = 0, packed = 0;
	const struct jpinfo **srcby = NULL;
	uint32_t *srcidx = NULL, nranks = 0;
	const char *srcdesc = NULL;
	int have_src = 0;
	size_t relay_trees = 0;

	memset(&b, 0, sizeof(b));
	j->coord_plan_err[0] = 0;	/* this re-plan's reason, if it finds one */
	if (!c && !(c = j->plan_cache = calloc(1, sizeof(*c))))
		goto oom;
	for (struct jmember *m = j->members; m; m = m->next)
		n += m->n;
	b.parts = calloc(n ? n : 1, sizeof(*b.parts));
	b.pmem = calloc(n ? n : 1, sizeof(*b.pmem));
	if (!b.parts || !b.pmem)
		goto oom;
	for (struct jmember *m = j->members; m; m = m->next, b.nmem++)
		for (i = 0; i < m->n; i++) {
			b.pmem[b.nparts] = (uint32_t)b.nmem;
			b.parts[b.nparts++] = &m->p[i];
			if (m->p[i].role == JROLE_SOURCE && !srcdesc)
				srcdesc = m->p[i].layout;
		}
	/* The next term (proto/peer_protocol.h): this boot's next counter; a
	 * counter at its end starts a new boot, which supersedes as a
	 * restarted coordinator does. */
	if (peer_term_boot(j->coord_epoch) != j->boot ||
	    peer_term_counter(j->coord_epoch) + 1 >= (1ull << PEER_TERM_COUNTER_BITS)) {
		if (peer_term_boot(j->coord_epoch) == j->boot)
			j->boot = job_boot_new();
		j->coord_epoch = peer_term(j->boot, 1);
	} else {
		j->coord_epoch++;
	}
	if (srcdesc) {
		char err[512];
		struct dte_layout probe;

		/* The rank count, before the cache is asked (it may hold the
		 * sharded source's full layout, with the same ranks). */
		if (!strcmp(c->src_desc, srcdesc) && c->src_ok) {
			nranks = c->src.nranks;
		} else if (jlayout_build(j, JROLE_SOURCE, srcdesc, 0, NULL, &probe, err,
					 sizeof(err)) == 0) {
			nranks = probe.nranks;
			dte_layout_fini(&probe);
		}
		srcby = calloc(nranks ? nranks : 1, sizeof(*srcby));
		srcidx = calloc(nranks ? nranks : 1, sizeof(*srcidx));
		if (!srcby || !srcidx)
			goto oom;
		for (i = 0; i < b.nparts; i++)
			if (b.parts[i]->role == JROLE_SOURCE && b.parts[i]->rank < nranks &&
			    !srcby[b.parts[i]->rank]) {
				srcby[b.parts[i]->rank] = b.parts[i];
				srcidx[b.parts[i]->rank] = (uint32_t)i;
			}
		have_src = nranks && cache_source(j, c, srcdesc, srcby, &b.complete) == 0;
	}
	if (!(b.par_of = calloc(b.nparts ? b.nparts : 1, sizeof(*b.par_of))) ||
	    relay_assign(j, b.parts, b.nparts, b.par_of, &relay_trees) < 0)
		goto oom;
	j->relay_trees = relay_trees;
	if (!(b.mkey = calloc(b.nmem ? b.nmem : 1, sizeof(*b.mkey))) ||
	    !(b.changed = calloc(b.nmem ? b.nmem : 1, sizeof(*b.changed))))
		goto oom;
	b.c = c;
	/* The pairs: one plan per distinct sink layout (cached), replicas
	 * reuse it, each sink rank takes the entries of each attached source
	 * rank from the index (pass 0).  A pair's entries are a function of
	 * its key (struct jseg), a member's part of its pairs' keys in order:
	 * the member's key.  Pass 1 finds each pair's packed entries in the
	 * cache or packs them. */
	for (int pass = 0; pass < 2 && have_src; pass++) {
		size_t p = 0;

		if (pass == 1) {
			if (c->nseg + b.npairs > c->capseg / 2 &&
			    seg_rehash(c, c->nseg + b.npairs, 1) < 0)
				goto oom;
			if (!(b.pslot = calloc(b.npairs ? b.npairs : 1, sizeof(*b.pslot))))
				goto oom;
		}
		for (i = 0; i < b.nparts; i++) {
			const struct jpinfo *dst = b.parts[i];
			uint32_t md = b.pmem[i], top;
			struct jsinkplan *s;

			if (dst->role != JROLE_SINK)
				continue;
			if (!(s = cache_sink(j, c, dst->layout, dst->rank)))
				goto oom;
			s->used = 1;
			if (!s->ok && s->err[0])
				snprintf(j->coord_plan_err, sizeof(j->coord_plan_err), "plan %s -> %s: %s",
					 c->src_desc, s->desc, s->err);
			if (!s->ok || dst->rank >= s->nranks)
				continue;
			top = s->nsrc < nranks ? s->nsrc : nranks;
			for (uint32_t r = 0; r < top; r++) {
				size_t k0 = s->off[(size_t)dst->rank * s->nsrc + r];
				size_t k1 = s->off[(size_t)dst->rank * s->nsrc + r + 1];
				uint64_t t[5] = { s->gen, dst->id, 0, dst->rank, r };
				uint32_t ms;
				size_t g;

				if (k0 == k1 || !srcby[r])
					continue;
				t[2] = srcby[r]->id;
				ms = b.pmem[srcidx[r]];
				if (pass == 0) {
					if (pair_add(&b, srcidx[r], (uint32_t)i, t) < 0)
						goto oom;
					b.mkey[md] = XXH64(t, sizeof(t), b.mkey[md]);
					if (ms != md)
						b.mkey[ms] = XXH64(t, sizeof(t), b.mkey[ms]);
					total += k1 - k0;
					continue;
				}
				g = seg_slot(c, t);
				if (c->seg[g].bytes) {
					c->seg[g].used = 1;
				} else {
					if (seg_build(&c->seg[g], t, s, k0, k1) < 0)
						goto oom;
					c->nseg++;
					packed += k1 - k0;
				}
				b.pslot[p++] = g;
			}
		}
	}
	{
		size_t mi = 0;

		for (struct jmember *m = j->members; m; m = m->next, mi++)
			b.changed[mi] = !m->part_ok || m->part_hash != b.mkey[mi];
	}
	if (have_src)
		cache_sweep(c);
	j->coord_complete = b.complete;
	DLOG_N("job %s: plan epoch %llx (boot %llx, %llu): %zu participants, %zu entries in %zu "
	       "pairs (%zu packed anew)%s; relay trees %zu", j->name,
	       (unsigned long long)j->coord_epoch,
	       (unsigned long long)peer_term_boot(j->coord_epoch),
	       (unsigned long long)peer_term_counter(j->coord_epoch), b.nparts, total, b.npairs,
	       packed, b.complete ? "" : " (incomplete)", relay_trees);
	send_plans(j, &b);
	/* Pairs no member has any more go. */
	if (seg_rehash(c, c->nseg, 0) < 0)
		DLOG_W("job %s: out of memory dropping old pairs' entries (kept)", j->name);
	goto out;
oom:
	DLOG_E("job %s: out of memory planning", j->name);
out:
	free(srcby);
	free(srcidx);
	free(b.parts);
	free(b.pmem);
	free(b.ps);
	free(b.pd);
	free(b.pt);
	free(b.pslot);
	free(b.mkey);
	free(b.changed);
	free(b.par_of);
}

static void refuse_join(struct job *j, const char *from, const char *why)
{
	Dtep__Refused m = DTEP__REFUSED__INIT;

	j->refused++;
	DLOG_W("job %s: JOIN from %s refused: %s", j->name, from, why);
	m.job = j->name;
	m.type = DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN;
	m.reason = (char *)why;
	jio_send(j->eng, from, NULL, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &m.base, NULL, 0);
}

static struct jmember *member_find(struct job *j, const char *node)
{
	for (struct jmember *m = j->members; m; m = m->next)
		if (!strcmp(m->node, node))
			return m;
	return NULL;
}

static void member_remove(struct job *j, const char *node)
{
	for (struct jmember **pp = &j->members; *pp; pp = &(*pp)->next) {
		if (!strcmp((*pp)->node, node)) {
			struct jmember *m = *pp;

			*pp = m->next;
			member_free(m);
			return;
		}
	}
}

/* A JOIN that fails validation: coord_sm says REFUSED, membership unchanged. */
static void join_refused(struct job *j, const char *node, const char *from, const char *why)
{
	struct jmember *mem = member_find(j, node);
	struct coord_step st = member_step(j, node, mem, COORD_EV_JOIN_REFUSED);

	if (st.act != COORD_A_REFUSE) {
		member_bad_action(j, node, COORD_EV_JOIN_REFUSED, st);
		return;
	}
	refuse_join(j, from, why);
	member_done(j, node, st);
}

/* Answers a JOIN with no participants, from a member that left or from
 * a node no longer one (a retry, or a duplicate): a PLAN of the current
 * term holding nothing for that node, echoing its join_seq (and its
 * nonce), which acknowledges the JOIN.  Not kept and not retried: the
 * node's JOIN retry asks again.  Its PLAN_ACK comes from no member and
 * is ignored. */
static void answer_empty(struct job *j, const char *node, const Dtep__Join *m)
{
	Dtep__Plan plan = DTEP__PLAN__INIT;
	Dtep__JobRef ref;
	int rc;

	if (!j->coord_epoch)
		replan(j);	/* no term yet (no member ever): draw one */
	job_fill_ref(j, &ref);
	plan.job = &ref;
	plan.epoch = j->coord_epoch;
	plan.peer_proto = PEER_PROTO_VERSION;
	plan.join_seq = m->join_seq;
	if (j->auth && m->nonce.len == sizeof(((struct jmember *)0)->nonce))
		plan.join_nonce = m->nonce;
	rc = jio_send(j->eng, node, m->address, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN, &plan.base,
		      NULL, 0);
	if (rc < 0)
		DLOG_W("job %s: cannot answer the leave of %s (JOIN %llu): %s; its retry asks "
		       "again", j->name, node, (unsigned long long)m->join_seq, strerror(-rc));
	else
		DLOG_I("job %s: %s holds no participant (JOIN %llu): answered with plan %llx",
		       j->name, node, (unsigned long long)m->join_seq,
		       (unsigned long long)j->coord_epoch);
}

/* A JOIN names each participant's layout: validated by building it,
 * unless the plan cache holds that layout built already (a plain
 * source's, or a sink layout's plan): then only the rank is checked.
 * At Qwen3-235B, building sglang:tp=8 for every sink that joins was most
 * of a join's re-plan (bench_replan).  1 with *nranks set, or 0. */
static int cache_ranks(const struct job *j, int role, const char *desc, const char *shards,
		       uint32_t *nranks)
{
	const struct jplan_cache *c = j->plan_cache;

	if (!c)
		return 0;
	if (role == JROLE_SOURCE) {
		if ((shards && *shards) || dte_layout_desc_sharded(desc) || !c->src_ok ||
		    strcmp(c->src_desc, desc))
			return 0;
		*nranks = c->src.nranks;
		return 1;
	}
	for (size_t i = 0; i < c->nsp; i++)
		if (c->sp[i]->ok && !strcmp(c->sp[i]->desc, desc)) {
			*nranks = c->sp[i]->nranks;
			return 1;
		}
	return 0;
}

void jcoord_join(struct job *j, const char *from, const Dtep__Join *m)
{
	const char *node = m->node && *m->node ? m->node : from;
	struct jpinfo *np = NULL;
	struct jmember *mem;
	struct coord_step st;
	char why[512], err[384];
	size_t i;

	if (!peer_proto_supported(m->peer_proto)) {
		snprintf(why, sizeof(why), "peer protocol %u%s; this coordinator speaks %u..%u "
			 "(run the same dted release on every node of a job)", m->peer_proto,
			 m->peer_proto ? "" : " (a dted from before versions were exchanged)",
			 PEER_PROTO_MIN_VERSION, PEER_PROTO_VERSION);
		join_refused(j, node, from, why);
		return;
	}
	mem = member_find(j, node);
	if (mem && m->join_seq && m->join_boot == mem->join_boot && m->join_seq <= mem->join_seq) {
		/* A retry or a duplicate: answered with the current plan, which
		 * acknowledges it; membership is unchanged. */
		st = member_step(j, node, mem, COORD_EV_JOIN_SEEN);
		if (st.act != COORD_A_RESEND) {
			member_bad_action(j, node, COORD_EV_JOIN_SEEN, st);
			return;
		}
		DLOG_I("job %s: JOIN %llu from %s again (have %llu): plan %llx sent again", j->name,
		       (unsigned long long)m->join_seq, node, (unsigned long long)mem->join_seq,
		       (unsigned long long)mem->plan_term);
		member_send_plan(j, mem);
		member_done(j, node, st);
		return;
	}
	if (m->spec_hash != j->spec.hash) {
		snprintf(why, sizeof(why), "model spec %016llx differs from the job's %016llx",
			 (unsigned long long)m->spec_hash, (unsigned long long)j->spec.hash);
		join_refused(j, node, from, why);
		return;
	}
	if (strlen(node) >= JOB_NODE_MAX || (m->address && strlen(m->address) >= JOB_ADDR_MAX)) {
		join_refused(j, node, from, "node name or address too long");
		return;
	}
	if (m->n_participants > 65536) {
		join_refused(j, node, from, "too many participants");
		return;
	}
	np = calloc(m->n_participants ? m->n_participants : 1, sizeof(*np));
	if (!np) {
		join_refused(j, node, from, "coordinator out of memory");
		return;
	}
	for (i = 0; i < m->n_participants; i++) {
		const Dtep__Participant *p = m->participants[i];
		struct dte_layout l;
		int role = p->role == DTEP__ROLE__ROLE_SOURCE ? JROLE_SOURCE : JROLE_SINK;
		uint32_t nranks = 0;

		if (!p->layout || strlen(p->layout) >= JOB_DESC_MAX) {
			snprintf(why, sizeof(why), "participant %llx: bad layout",
				 (unsigned long long)p->id);
			goto refused;
		}
		if (cache_ranks(j, role, p->layout, role == JROLE_SOURCE ? p->shards : NULL,
				&nranks)) {
			/* Built for a plan already (so valid): its ranks suffice. */
			if (p->rank >= nranks) {
				snprintf(why, sizeof(why), "participant %llx: %s has ranks 0..%u; rank %u "
					 "does not exist", (unsigned long long)p->id, p->layout,
					 nranks ? nranks - 1 : 0, p->rank);
				goto refused;
			}
		} else if (jlayout_build(j, role, p->layout, p->rank,
					 role == JROLE_SOURCE ? p->shards : NULL, &l, err,
					 sizeof(err)) < 0) {
			snprintf(why, sizeof(why), "participant %llx: %s", (unsigned long long)p->id, err);
			goto refused;
		} else {
			dte_layout_fini(&l);
		}
		/* Sources must all describe one trainer; ranks and sink slots are unique. */
		for (struct jmember *o = j->members; o; o = o->next) {
			if (!strcmp(o->node, node))
				continue;
			for (size_t q = 0; q < o->n; q++) {
				const struct jpinfo *x = &o->p[q];

				if (x->role != role)
					continue;
				if (role == JROLE_SOURCE && strcmp(x->layout, p->layout)) {
					snprintf(why, sizeof(why), "source layout %s differs from the job's %s",
						 p->layout, x->layout);
					goto refused;
				}
				if (x->rank == p->rank && x->replica == p->replica &&
				    !strcmp(x->layout, p->layout)) {
					snprintf(why, sizeof(why), "%s %s rank %u replica %u is already "
						 "attached on %s", role == JROLE_SOURCE ? "source" : "sink",
						 p->layout, p->rank, p->replica, o->node);
					goto refused;
				}
			}
		}
		np[i].id = p->id;
		np[i].role = role;
		snprintf(np[i].layout, sizeof(np[i].layout), "%s", p->layout);
		np[i].rank = p->rank;
		np[i].replica = p->replica;
		snprintf(np[i].node, sizeof(np[i].node), "%s", node);
	}
	for (i = 0; i < m->n_participants; i++) {
		const Dtep__Participant *p = m->participants[i];

		if (p->role == DTEP__ROLE__ROLE_SOURCE && dte_layout_desc_sharded(p->layout) &&
		    keep_shards(j, p->rank, p->shards) < 0) {
			snprintf(why, sizeof(why), "coordinator out of memory");
			goto refused;
		}
	}
	mem = member_find(j, node);
	if (!m->n_participants) {
		free(np);
		st = member_step(j, node, mem, COORD_EV_JOIN_EMPTY);
		if (st.act == COORD_A_DEPART) {
			member_remove(j, node);
			replan(j);
		} else if (st.act != COORD_A_ANSWER) {	/* not a member (any more) */
			member_bad_action(j, node, COORD_EV_JOIN_EMPTY, st);
			return;
		}
		answer_empty(j, node, m);
		member_done(j, node, st);
		return;
	}
	st = member_step(j, node, mem, COORD_EV_JOIN_NEW);
	if (st.act != COORD_A_REPLAN) {
		member_bad_action(j, node, COORD_EV_JOIN_NEW, st);
		free(np);
		return;
	}
	if (!mem) {
		mem = calloc(1, sizeof(*mem));
		if (!mem) {
			snprintf(why, sizeof(why), "coordinator out of memory");
			goto refused;
		}
		snprintf(mem->node, sizeof(mem->node), "%s", node);
		mem->next = j->members;
		j->members = mem;
	}
	snprintf(mem->address, sizeof(mem->address), "%s", m->address ? m->address : "");
	mem->join_boot = m->join_boot;
	mem->join_seq = m->join_seq;
	memset(mem->nonce, 0, sizeof(mem->nonce));
	if (m->nonce.len == sizeof(mem->nonce))
		memcpy(mem->nonce, m->nonce.data, sizeof(mem->nonce));
	free(mem->p);
	mem->p = np;
	mem->n = m->n_participants;
	/* A new JOIN is answered with a whole plan: the member may not hold
	 * the one it was sent last (it restarted, rejected that plan, or
	 * did not take a PLAN carrying only what changed). */
	mem->need_full = 1;
	replan(j);
	member_done(j, node, st);
	return;
refused:
	free(np);
	join_refused(j, node, from, why);
}

void jcoord_leave(struct job *j, const char *from, const Dtep__Leave *m)
{
	const char *node = m->node && *m->node ? m->node : from;
	struct jmember *mem = member_find(j, node);
	enum coord_mevent ev = COORD_EV_LEAVE_LAST;
	struct coord_step st;
	size_t i, k;

	for (i = 0; mem && i < mem->n; i++) {
		int gone = 0;

		for (size_t q = 0; q < m->n_participants; q++)
			gone |= m->participants[q] == mem->p[i].id;
		if (!gone)
			ev = COORD_EV_LEAVE;	/* one stays */
	}
	st = member_step(j, node, mem, ev);
	if (st.act == COORD_A_NONE)
		return;	/* not a member */
	if (st.act != (ev == COORD_EV_LEAVE ? COORD_A_REPLAN : COORD_A_REMOVE)) {
		member_bad_action(j, node, ev, st);
		return;
	}
	for (i = 0, k = 0; i < mem->n; i++) {
		int gone = 0;

		for (size_t q = 0; q < m->n_participants; q++)
			gone |= m->participants[q] == mem->p[i].id;
		if (!gone)
			mem->p[k++] = mem->p[i];
	}
	mem->n = k;
	if (!k)
		member_remove(j, node);
	replan(j);
	member_done(j, node, st);
}

void jcoord_node_down(struct job *j, const char *node)
{
	struct coord_step st = member_step(j, node, member_find(j, node), COORD_EV_NODE_DOWN);

	if (st.act == COORD_A_NONE)
		return;	/* not a member */
	if (st.act != COORD_A_REMOVE) {
		member_bad_action(j, node, COORD_EV_NODE_DOWN, st);
		return;
	}
	DLOG_W("job %s: member %s went down; re-planning without it", j->name, node);
	member_remove(j, node);
	replan(j);
	member_done(j, node, st);
}

/* ---------------------------------------------------------------- member */

void jmember_coord_down(struct job *j, const char *node)
{
	if (j->is_coord || !j->coord_node[0] || strcmp(node, j->coord_node) || j->coord_down)
		return;
	j->coord_down = 1;
	if (!j->locals) {
		/* A leave not answered yet needs no answer now: a coordinator
		 * that went down, or heard this node go down, forgot it. */
		j->join_acked = j->join_seq;
		return;
	}
	j->rejoins++;
	DLOG_W("job %s: the coordinator %s (%s) went down; rejoining when it answers", j->name,
	       node, j->coordinator);
	/* A new JOIN (its ack is the coordinator's next PLAN), retried with
	 * backoff until then; the plan held stays in use meanwhile. */
	job_send_join(j);
}

void jplan_free(struct job *j)
{
	for (size_t i = 0; i < j->npairs; i++) {
		j->eng->pair_sm_bugs += j->pairs[i].sm.state_bugs;
		jpair_free_state(&j->pairs[i]);
		free(j->pairs[i].e);
	}
	free(j->pairs);
	j->pairs = NULL;
	j->npairs = 0;
	free(j->parts);
	j->parts = NULL;
	j->nparts = 0;
	free(j->addr_node);
	free(j->addr_addr);
	j->addr_node = NULL;
	j->addr_addr = NULL;
	j->naddr = 0;
}

/* An FP8 sink's entry (proto field fp8): its units must be exactly the
 * codes or the block scales of its element box (layout/plan.h,
 * dte_fp8_split), so the source computes what the sink was told to
 * expect; a peer's PLAN that says otherwise is refused. */
static int entry_fp8_from_msg(const Dtep__Entry *m, struct jentry *e, char *err, size_t errlen)
{
	const int64_t B = DTE_FP8_BLOCK;
	int64_t R, C;

	if (!m->fp8 && !m->n_src_extent)
		return 0;
	if (m->fp8 != JFP8_CODES && m->fp8 != JFP8_SCALES) {
		snprintf(err, errlen, "entry %u: fp8 %u is neither codes (1) nor scales (2)", m->id,
			 m->fp8);
		return -EINVAL;
	}
	if (m->n_src_extent != 2 || m->src_extent[0] <= 0 || m->src_extent[1] <= 0 ||
	    m->src_extent[1] % 2 || (m->fp8_flags & ~(uint32_t)DTC_FP8_FLAGS_ALL) ||
	    ((m->fp8_flags & DTC_FP8_UE8M0) && (m->fp8_flags & DTC_FP8_UE8M0_LOG2)) || e->raw) {
		snprintf(err, errlen, "entry %u: FP8 box or quantizer flags invalid", m->id);
		return -EINVAL;
	}
	R = m->src_extent[0];
	C = m->src_extent[1];
	if (m->fp8 == JFP8_CODES ? e->map.ndim != 2 || e->map.extent[0] != R ||
				   e->map.extent[1] != C / 2 :
	    e->map.ndim != 3 || e->map.extent[0] != (R + B - 1) / B ||
	    e->map.extent[1] != (C + B - 1) / B || e->map.extent[2] != 2) {
		snprintf(err, errlen, "entry %u: FP8 %s units do not match its %lld x %lld box",
			 m->id, m->fp8 == JFP8_CODES ? "code" : "scale", (long long)R, (long long)C);
		return -EINVAL;
	}
	e->fp8 = (uint8_t)m->fp8;
	e->fp8_flags = m->fp8_flags;
	e->fbox[0] = R;
	e->fbox[1] = C;
	return 0;
}

static int entry_from_msg(struct job *j, const Dtep__Entry *m, struct jentry *e, char *err,
			  size_t errlen)
{
	struct jlocal *sl = job_local(j, m->src), *dl = job_local(j, m->dst);
	uint32_t nd = (uint32_t)m->n_extent;
	struct dte_box_map em, dm;	/* an FP8 entry's element box; its units alone */
	struct dbuf *p, *mm, *v, *d;
	uint64_t slen;
	int rc;

	memset(e, 0, sizeof(*e));
	memset(&em, 0, sizeof(em));
	memset(&dm, 0, sizeof(dm));
	if (nd < 1 || nd > DTE_MAX_DIMS || m->n_src_stride != nd || m->n_dst_stride != nd) {
		snprintf(err, errlen, "entry %u: %u dims with %zu/%zu strides", m->id, nd,
			 m->n_src_stride, m->n_dst_stride);
		return -EINVAL;
	}
	if (m->tensor >= j->spec.n) {
		snprintf(err, errlen, "entry %u: tensor %u not in the model spec", m->id, m->tensor);
		return -EINVAL;
	}
	e->tensor = m->tensor;
	e->raw = (uint8_t)dte_spec_is_halves(&j->spec, m->tensor);
	e->group = m->group;
	e->src_buf = m->src_buffer;
	e->src_buf_m = m->src_buffer_m;
	e->src_buf_v = m->src_buffer_v;
	e->dst_buf = m->dst_buffer;
	e->map.ndim = nd;
	e->map.src_offset = m->src_offset;
	e->map.dst_offset = m->dst_offset;
	for (uint32_t d0 = 0; d0 < nd; d0++) {
		e->map.extent[d0] = m->extent[d0];
		e->map.src_stride[d0] = m->src_stride[d0];
		e->map.dst_stride[d0] = m->dst_stride[d0];
	}
	e->box = dtc_box_size(&e->map);
	if (!e->box) {
		snprintf(err, errlen, "entry %u: empty or bad box", m->id);
		return -EINVAL;
	}
	if ((rc = entry_fp8_from_msg(m, e, err, errlen)) < 0)
		return rc;
	if (e->group >= JOB_MAX_GROUPS) {
		snprintf(err, errlen, "entry %u: optimizer group %u out of range", m->id, e->group);
		return -EINVAL;
	}
	if (e->fp8) {
		em.ndim = 2;
		em.extent[0] = e->fbox[0];
		em.extent[1] = e->fbox[1];
		em.src_offset = e->map.src_offset;
		em.src_stride[0] = e->map.src_stride[0];
		em.src_stride[1] = e->map.src_stride[1];
		dm = e->map;
		dm.src_offset = 0;
		memset(dm.src_stride, 0, sizeof(dm.src_stride));
	}
	/* Every index must land inside the buffers registered here. */
	if (sl) {
		p = jlocal_buf(sl, e->src_buf, NULL);
		mm = jlocal_buf(sl, e->src_buf_m, NULL);
		v = jlocal_buf(sl, e->src_buf_v, NULL);
		if (!p || !mm || !v) {
			snprintf(err, errlen, "entry %u: source buffers %u/%u/%u not attached", m->id,
				 e->src_buf, e->src_buf_m, e->src_buf_v);
			return -EINVAL;
		}
		slen = p->length < mm->length ? p->length : mm->length;
		slen = slen < v->length ? slen : v->length;
		if (e->raw && slen > UINT64_MAX / 2) {
			snprintf(err, errlen, "entry %u: source buffer too long", m->id);
			return -EINVAL;
		}
		if ((rc = dtc_entry_check(e->fp8 ? &em : &e->map, e->raw ? 2 * slen : slen,
					  UINT64_MAX)) != DTC_OK) {
			snprintf(err, errlen, "entry %u: source side: %s", m->id, dtc_strerror(rc));
			return -EINVAL;
		}
	}
	if (dl) {
		d = jlocal_buf(dl, e->dst_buf, NULL);
		if (!d) {
			snprintf(err, errlen, "entry %u: sink buffer %u not attached", m->id, e->dst_buf);
			return -EINVAL;
		}
		if ((rc = dtc_entry_check(e->fp8 ? &dm : &e->map, UINT64_MAX, d->length)) != DTC_OK) {
			snprintf(err, errlen, "entry %u: sink side: %s", m->id, dtc_strerror(rc));
			return -EINVAL;
		}
	}
	return 0;
}

static uint64_t pair_hash(const struct jpair *p)
{
	XXH64_state_t *st = XXH64_createState();
	uint64_t h;

	if (!st)
		return 0;
	XXH64_reset(st, 0);
	for (size_t i = 0; i < p->n; i++)
		XXH64_update(st, &p->e[i], sizeof(p->e[i]));
	h = XXH64_digest(st);
	XXH64_freeState(st);
	return h;
}

static void send_plan_ack(struct job *j, const char *from, uint64_t term)
{
	Dtep__PlanAck a = DTEP__PLAN_ACK__INIT;
	Dtep__JobRef ref;

	job_fill_ref(j, &ref);
	a.job = &ref;
	a.epoch = term;
	a.node = (char *)jio_self(j->eng);
	jio_send(j->eng, from, NULL, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK, &a.base, NULL, 0);
}

/* The PLAN came from this job's coordinator (proto/peer_protocol.h):
 * the coordinator daemon itself, or the daemon this one connected to at
 * the job's coordinator address. */
static int from_coordinator(const struct job *j, const char *from)
{
	if (j->is_coord)
		return !strcmp(from, jio_self(j->eng));
	return j->eng->io.node_is_at(j->eng->io.ctx, from, j->coordinator);
}

/* Member side of a PLAN: -1 with a reason in why (then REFUSED goes back
 * to the sender), else 0 (applied, a duplicate, stale or rejected after
 * validation: logged). */
/* The plan just taken names a participant of this node that this node
 * does not hold: the coordinator keeps a ghost.  A JOIN of an earlier
 * membership can reach it after a later one was answered (a retry or a
 * copy, reordered: the coordinator keeps nothing of a node that left),
 * and bring back participants that are gone.  Told again, with a new
 * JOIN, unless one is on its way (its answer corrects it). */
static void plan_ghost_check(struct job *j)
{
	if (j->join_acked < j->join_seq)
		return;
	for (size_t i = 0; i < j->nparts; i++) {
		const struct jpinfo *p = &j->parts[i];

		if (strcmp(p->node, jio_self(j->eng)) || job_local(j, p->id))
			continue;
		j->ghosts_told++;
		DLOG_N("job %s: plan %llx names participant %llx of this node, which it does not "
		       "hold; telling the coordinator again", j->name, (unsigned long long)j->epoch,
		       (unsigned long long)p->id);
		job_send_join(j);
		return;
	}
}

/* Whether a PLAN of what changed drops participant id, or names it. */
static int plan_drops(const Dtep__Plan *m, uint64_t id)
{
	for (size_t i = 0; i < m->n_drop; i++)
		if (m->drop[i] == id)
			return 1;
	return 0;
}

static int plan_names(const Dtep__Plan *m, uint64_t id)
{
	for (size_t i = 0; i < m->n_participants; i++)
		if (m->participants[i]->id == id)
			return 1;
	return 0;
}

int jplan_recv(struct job *j, const char *from, const Dtep__Plan *m, char *why, size_t whylen)
{
	struct jpinfo *parts = NULL;
	struct jpair *pairs = NULL;
	char (*an)[JOB_NODE_MAX] = NULL;
	char (*aa)[JOB_ADDR_MAX] = NULL;
	size_t npairs = 0, i, k, nkeep = 0, nan = 0;
	uint64_t cur = j->epoch, nb = peer_term_boot(m->epoch);
	struct coord_plan_in in = {
		.proto_ok = peer_proto_supported(m->peer_proto),
		.from_coord = from_coordinator(j, from),
		.term = m->epoch,
		.held = cur,
		.retired = j->retired,
		.nretired = j->nretired,
	};
	struct coord_plan_out d = coord_sm_plan(&in);
	char err[200];

	/* coord_sm decides (docs/SYNC.md, "Member: whether a PLAN is
	 * taken"); this executes. */
	switch (d.v) {
	case COORD_P_REJECT_PROTO:
	case COORD_P_REFUSE_PROTO:
		snprintf(err, sizeof(err), "the coordinator speaks peer protocol %u%s, this daemon "
			 "%u..%u (run the same dted release on every node of a job)", m->peer_proto,
			 m->peer_proto ? "" : " (a dted from before versions were exchanged)",
			 PEER_PROTO_MIN_VERSION, PEER_PROTO_VERSION);
		if (d.v == COORD_P_REJECT_PROTO)
			goto bad;
		DLOG_E("job %s: plan epoch %llu from %s rejected: %s", j->name,
		       (unsigned long long)m->epoch, from, err);
		snprintf(why, whylen, "%s", err);
		return -EPROTONOSUPPORT;
	case COORD_P_REFUSE_NOT_COORD:
		/* Only the job's coordinator plans; anyone else holding the
		 * token cannot replace this member's plan or block it. */
		j->plans_refused++;
		dmetrics_add(DM_REFUSED, "plan_not_from_coordinator", 1);
		DLOG_W("job %s: PLAN epoch %llx from %s refused: not the job's coordinator (%s); "
		       "plan %llx kept", j->name, (unsigned long long)m->epoch, from, j->coordinator,
		       (unsigned long long)cur);
		snprintf(why, whylen, "plans come from the job's coordinator %s alone", j->coordinator);
		return -EPERM;
	default:
		break;
	}
	if (j->auth && strcmp(from, jio_self(j->eng)) &&
	    (m->join_nonce.len != sizeof(j->auth_nonce) ||
	     memcmp(m->join_nonce.data, j->auth_nonce, sizeof(j->auth_nonce)))) {
		/* Under the key, but not an answer to this daemon's JOIN: a
		 * replay from another life of the job (job_auth.h). */
		j->auth_refused++;
		dmetrics_add(DM_REFUSED, "auth", 1);
		snprintf(why, whylen, "plan epoch %llx does not answer this daemon's JOIN (its "
			 "join_nonce is not ours)", (unsigned long long)m->epoch);
		DLOG_W("job %s: PLAN from %s refused: %s", j->name, from, why);
		return -EACCES;
	}
	snprintf(j->coord_node, sizeof(j->coord_node), "%s", from);
	j->coord_proto = m->peer_proto;
	if (d.v == COORD_P_REFUSE_NOT_TERM) {
		snprintf(why, whylen, "plan epoch %llx is not a term", (unsigned long long)m->epoch);
		DLOG_W("job %s: PLAN from %s refused: %s", j->name, from, why);
		return -EPROTO;
	}
	/* coord_sm_plan_heard(d.v): the coordinator answers. */
	if (m->join_seq > j->join_acked && m->join_seq <= j->join_seq)
		j->join_acked = m->join_seq;
	if (j->coord_down) {
		DLOG_N("job %s: the coordinator %s answers again (plan %llx)", j->name, from,
		       (unsigned long long)m->epoch);
		j->coord_down = 0;
	}
	switch (d.v) {
	case COORD_P_IGNORE_RETIRED:
		DLOG_W("job %s: plan epoch %llx from %s ignored: its coordinator boot %llx was "
		       "superseded", j->name, (unsigned long long)m->epoch, from, (unsigned long long)nb);
		return 0;
	case COORD_P_ACK_AGAIN:
		/* A retry or duplicate of the plan held: acknowledged again. */
		send_plan_ack(j, from, m->epoch);
		jctl_update(j->eng);
		return 0;
	case COORD_P_IGNORE_STALE:
		DLOG_I("job %s: stale plan epoch %llx (have %llx) ignored", j->name,
		       (unsigned long long)m->epoch, (unsigned long long)cur);
		return 0;
	case COORD_P_ADOPT_NEW_BOOT:
		DLOG_N("job %s: coordinator %s plans under a new boot %llx (was %llx): the old "
		       "term is retired, versions in flight under it are refused", j->name, from,
		       (unsigned long long)nb, (unsigned long long)peer_term_boot(cur));
		j->retired[j->nretired++ % PEER_TERM_RETIRED] = peer_term_boot(cur);
		if (j->nretired >= 2 * PEER_TERM_RETIRED)
			j->nretired -= PEER_TERM_RETIRED;
		break;
	case COORD_P_ADOPT:
		break;
	default:
		DLOG_E("job %s: PLAN %llx from %s: verdict %s not executed here (bug)", j->name,
		       (unsigned long long)m->epoch, from, coord_sm_verdict_name(d.v));
		return 0;
	}
	if (m->base_epoch && m->base_epoch != cur) {
		/* Only what changed since a plan this member does not hold
		 * (it rejected it, or restarted): nothing taken, nothing
		 * acknowledged; a new JOIN, which the coordinator answers with
		 * a whole plan. */
		j->plans_delta_refused++;
		dmetrics_add(DM_PLANS, "changes_refused", 1);
		DLOG_N("job %s: plan %llx from %s changes plan %llx, this node holds %llx: "
		       "asking for the whole plan", j->name, (unsigned long long)m->epoch, from,
		       (unsigned long long)m->base_epoch, (unsigned long long)cur);
		job_send_join(j);
		return 0;
	}
	send_plan_ack(j, from, m->epoch);
	jctl_update(j->eng);
	if (m->n_participants > 65536 || m->n_entries > (1u << 24) || m->n_addresses > 65536 ||
	    m->n_drop > 65536) {
		snprintf(err, sizeof(err), "plan too large");
		goto bad;
	}
	/* A plan of only what changed (peer protocol 8) keeps, of the plan
	 * held, every participant not dropped nor sent again, and (below)
	 * every pair with neither end dropped nor sent again. */
	if (m->base_epoch)
		for (i = 0; i < j->nparts; i++)
			nkeep += !plan_drops(m, j->parts[i].id) && !plan_names(m, j->parts[i].id);
	parts = calloc(nkeep + m->n_participants ? nkeep + m->n_participants : 1, sizeof(*parts));
	pairs = calloc(m->n_entries + (m->base_epoch ? j->npairs : 0) ?
		       m->n_entries + (m->base_epoch ? j->npairs : 0) : 1, sizeof(*pairs));
	if (!parts || !pairs) {
		snprintf(err, sizeof(err), "out of memory");
		goto bad;
	}
	for (i = 0, k = 0; m->base_epoch && i < j->nparts; i++)
		if (!plan_drops(m, j->parts[i].id) && !plan_names(m, j->parts[i].id))
			parts[m->n_participants + k++] = j->parts[i];
	for (i = 0; i < m->n_participants; i++) {
		const Dtep__Participant *p = m->participants[i];

		if (!p->layout || !p->node || strlen(p->layout) >= JOB_DESC_MAX ||
		    strlen(p->node) >= JOB_NODE_MAX) {
			snprintf(err, sizeof(err), "participant %zu malformed", i);
			goto bad;
		}
		parts[i].id = p->id;
		parts[i].role = p->role == DTEP__ROLE__ROLE_SOURCE ? JROLE_SOURCE : JROLE_SINK;
		snprintf(parts[i].layout, sizeof(parts[i].layout), "%s", p->layout);
		parts[i].rank = p->rank;
		parts[i].replica = p->replica;
		snprintf(parts[i].node, sizeof(parts[i].node), "%s", p->node);
		parts[i].relay_parent = p->relay_parent;
		parts[i].relay_root = p->relay_root;
		if ((p->relay_parent || p->relay_root) &&
		    (parts[i].role != JROLE_SINK || !p->relay_root || p->relay_parent == p->id ||
		     (p->relay_root == p->id) != !p->relay_parent)) {
			snprintf(err, sizeof(err), "participant %llx: relay parent %llx and root %llx "
				 "malformed", (unsigned long long)p->id,
				 (unsigned long long)p->relay_parent, (unsigned long long)p->relay_root);
			goto bad;
		}
	}
	/* Group entries into (src, dst) pairs, entries in id order. */
	for (i = 0; i < m->n_entries; i++) {
		const Dtep__Entry *me = m->entries[i];
		struct jpair *p = NULL;

		if (!job_local(j, me->src) && !job_local(j, me->dst))
			continue;
		for (k = 0; k < npairs; k++)
			if (pairs[k].src == me->src && pairs[k].dst == me->dst)
				p = &pairs[k];
		if (!p) {
			p = &pairs[npairs++];
			p->src = me->src;
			p->dst = me->dst;
		}
		if (me->id != p->n) {
			snprintf(err, sizeof(err), "entry ids of pair %llx->%llx not in order",
				 (unsigned long long)me->src, (unsigned long long)me->dst);
			goto bad;
		}
		if (!(p->n & (p->n + 1))) {	/* grow at 0, 1, 3, 7, ... */
			void *ne = realloc(p->e, (2 * p->n + 1) * sizeof(*p->e));

			if (!ne) {
				snprintf(err, sizeof(err), "out of memory");
				goto bad;
			}
			p->e = ne;
		}
		if (entry_from_msg(j, me, &p->e[p->n], err, sizeof(err)) < 0)
			goto bad;
		p->n++;
	}
	for (size_t q = 0, n0 = npairs; m->base_epoch && q < j->npairs; q++) {
		const struct jpair *o = &j->pairs[q];
		int sent = plan_drops(m, o->src) || plan_drops(m, o->dst);

		for (k = 0; k < n0 && !sent; k++)
			sent = pairs[k].src == o->src && pairs[k].dst == o->dst;
		if (sent)
			continue;
		/* Kept: its entries copied (the state moves below, by hash). */
		pairs[npairs].src = o->src;
		pairs[npairs].dst = o->dst;
		if (o->n && !(pairs[npairs].e = malloc(o->n * sizeof(*o->e)))) {
			snprintf(err, sizeof(err), "out of memory");
			goto bad;
		}
		if (o->n)
			memcpy(pairs[npairs].e, o->e, o->n * sizeof(*o->e));
		pairs[npairs++].n = o->n;
	}
	for (k = 0; k < npairs; k++) {
		struct jpair *old;

		pairs[k].hash = pair_hash(&pairs[k]);
		old = job_pair(j, pairs[k].src, pairs[k].dst);
		if (old && old->hash == pairs[k].hash) {
			pairs[k].dirty = old->dirty;
			old->dirty = NULL;
			pair_sm_replanned(&pairs[k].sm, &old->sm);
		} else {
			pair_sm_replanned(&pairs[k].sm, NULL);	/* entries changed: dense */
		}
	}
	/* Addresses: the message's, and (a plan of what changed) the held
	 * ones of nodes it does not name. */
	{
		size_t na = m->n_addresses + (m->base_epoch ? j->naddr : 0);

		an = calloc(na ? na : 1, sizeof(*an));
		aa = calloc(na ? na : 1, sizeof(*aa));
		if (!an || !aa) {
			snprintf(err, sizeof(err), "out of memory");
			goto bad;
		}
		for (i = 0; i < m->n_addresses; i++, nan++) {
			snprintf(an[nan], JOB_NODE_MAX, "%s", m->addresses[i]->key ? m->addresses[i]->key : "");
			snprintf(aa[nan], JOB_ADDR_MAX, "%s", m->addresses[i]->value ? m->addresses[i]->value : "");
		}
		for (i = 0; m->base_epoch && i < j->naddr; i++) {
			int named = 0;

			for (k = 0; k < m->n_addresses && !named; k++)
				named = !strcmp(an[k], j->addr_node[i]);
			if (named)
				continue;
			memcpy(an[nan], j->addr_node[i], JOB_NODE_MAX);
			memcpy(aa[nan++], j->addr_addr[i], JOB_ADDR_MAX);
		}
	}
	jplan_free(j);
	j->epoch = m->epoch;
	j->complete = m->complete;
	j->parts = parts;
	j->nparts = m->n_participants + nkeep;
	j->pairs = pairs;
	j->npairs = npairs;
	j->plan_error[0] = '\0';
	j->addr_node = an;
	j->addr_addr = aa;
	j->naddr = nan;
	j->plans_delta += m->base_epoch != 0;
	if (m->base_epoch)
		dmetrics_add(DM_PLANS, "taken_changes", 1);
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (job_part(j, l->info.id))
			l->announced = 1;
	jsink_replanned(j);
	jsrc_replanned(j);
	jsink_ahead_replay(j);	/* records of this term that came before it */
	DLOG_I("job %s: plan epoch %llx from %s: %zu participants, %zu local pairs%s", j->name,
	       (unsigned long long)j->epoch, from, j->nparts, j->npairs,
	       j->complete ? "" : " (incomplete)");
	plan_ghost_check(j);
	return 0;
bad:
	DLOG_E("job %s: plan epoch %llu from %s rejected: %s", j->name, (unsigned long long)m->epoch,
	       from, err);
	snprintf(j->plan_error, sizeof(j->plan_error), "%s", err);
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (!l->announced && !l->refused[0])
			snprintf(l->refused, sizeof(l->refused), "plan rejected: %s", err);
	for (k = 0; k < npairs; k++)
		free(pairs[k].e);
	free(pairs);
	free(parts);
	free(an);
	free(aa);
	return 0;
}
