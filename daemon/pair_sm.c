/* daemon/pair_sm.c — the source side of a (source, sink) pair (pair_sm.h;
 * docs/SYNC.md, "The pair's state machine": its state × event and state ×
 * decision tables, which tests/unit/test_pair_sm.c holds to this code). */
#include <stdio.h>
#include <string.h>
#include "daemon/pair_sm.h"

void pair_sm_init(struct pair_sm *s)
{
	memset(s, 0, sizeof(*s));
}

static void need_dense(struct pair_sm *s, enum pair_why why)
{
	/* An operator's resync stays the reason until a version goes out. */
	if (!s->need_dense || s->why != PAIR_WHY_RESYNC)
		s->why = why;
	s->need_dense = 1;
}

#define S(n, a) { PAIR_S_##n, PAIR_A_##a }

/* Rows: states; columns: enum pair_event in order (RESET, REPLANNED, SENT,
 * SEND_FAILED, CAPTURE_FAILED, STAGED, APPLIED, APPLY_FAILED, RESYNC,
 * REPAIR).  Every event reaches every state: acknowledgements of versions
 * sent before a reset still come, and are counted. */
static const struct pair_step table[PAIR_S_COUNT][PAIR_EV_COUNT] = {
	/* A failure before anything went out: the first version is dense
	 * anyway (initial). */
	[PAIR_S_FRESH] = { S(FRESH, RESET), S(FRESH, CARRY), S(CLEAN, SENT),
			   S(FRESH, NEED_DENSE), S(FRESH, NEED_DENSE), S(FRESH, STAGED),
			   S(FRESH, APPLIED), S(FRESH, FAILED), S(RESYNC, RESYNC),
			   S(FRESH, NEED_DENSE) },
	[PAIR_S_CLEAN] = { S(FRESH, RESET), S(CLEAN, CARRY), S(CLEAN, SENT),
			   S(REPAIR, NEED_DENSE), S(REPAIR, NEED_DENSE), S(CLEAN, STAGED),
			   S(CLEAN, APPLIED), S(REPAIR, FAILED), S(RESYNC, RESYNC),
			   S(REPAIR, NEED_DENSE) },
	/* A later good acknowledgement does not clear it: only a version sent. */
	[PAIR_S_REPAIR] = { S(FRESH, RESET), S(REPAIR, CARRY), S(CLEAN, SENT),
			    S(REPAIR, NEED_DENSE), S(REPAIR, NEED_DENSE), S(REPAIR, STAGED),
			    S(REPAIR, APPLIED), S(REPAIR, FAILED), S(RESYNC, RESYNC),
			    S(REPAIR, NEED_DENSE) },
	/* The operator's reason stays until a version goes out. */
	[PAIR_S_RESYNC] = { S(FRESH, RESET), S(RESYNC, CARRY), S(CLEAN, SENT),
			    S(RESYNC, NEED_DENSE), S(RESYNC, NEED_DENSE), S(RESYNC, STAGED),
			    S(RESYNC, APPLIED), S(RESYNC, FAILED), S(RESYNC, RESYNC),
			    S(RESYNC, NEED_DENSE) },
};

struct pair_step pair_sm_step(enum pair_state st, enum pair_event ev)
{
	if ((unsigned)st >= PAIR_S_COUNT || (unsigned)ev >= PAIR_EV_COUNT)
		return (struct pair_step){ PAIR_S_FRESH, PAIR_A_NONE };
	return table[st][ev];
}

enum pair_state pair_sm_state(const struct pair_sm *s)
{
	return s->state;
}

enum pair_state pair_sm_fields_state(const struct pair_sm *s)
{
	if (s->need_dense && s->why == PAIR_WHY_RESYNC)
		return PAIR_S_RESYNC;
	if (!s->last_sent)
		return PAIR_S_FRESH;
	return s->need_dense ? PAIR_S_REPAIR : PAIR_S_CLEAN;
}

void pair_sm_event(struct pair_sm *s, enum pair_event ev, uint64_t version, uint64_t epoch)
{
	struct pair_step st = pair_sm_step(s->state, ev);

	switch (st.act) {
	case PAIR_A_NONE:
	case PAIR_A_CARRY:
	case PAIR_A_COUNT:
		break;
	case PAIR_A_RESET: {
		uint32_t bugs = s->state_bugs;

		pair_sm_init(s);
		s->state_bugs = bugs;
		need_dense(s, PAIR_WHY_REPAIR);
		break;
	}
	case PAIR_A_SENT:
		s->prev_sent = s->last_sent;
		s->last_sent = version;
		s->sent_epoch = epoch;
		s->need_dense = 0;
		s->why = PAIR_WHY_NONE;
		break;
	case PAIR_A_NEED_DENSE:
		need_dense(s, PAIR_WHY_REPAIR);
		break;
	case PAIR_A_RESYNC:
		need_dense(s, PAIR_WHY_RESYNC);
		break;
	case PAIR_A_STAGED:
		if (version > s->staged)
			s->staged = version;
		break;
	case PAIR_A_APPLIED:
		if (version > s->applied)
			s->applied = version;
		break;
	case PAIR_A_FAILED:
		/* Whatever the sink holds now, the next version repairs it. */
		need_dense(s, PAIR_WHY_REPAIR);
		if (version > s->failed)
			s->failed = version;
		break;
	}
	/* "—" keeps the state (the table's next is the same). */
	if (st.act != PAIR_A_NONE || (unsigned)s->state >= PAIR_S_COUNT)
		s->state = st.next;
	if (pair_sm_fields_state(s) != s->state)
		s->state_bugs++;
}

void pair_sm_replanned(struct pair_sm *s, const struct pair_sm *old)
{
	if (old) {
		*s = *old;
		s->state_bugs = 0;	/* the old pair's are counted when it goes (jplan_free) */
		pair_sm_event(s, PAIR_EV_REPLANNED, 0, 0);
		return;
	}
	pair_sm_init(s);	/* fields never set before: a defined state to step from */
	pair_sm_event(s, PAIR_EV_RESET, 0, 0);
}

enum pair_why pair_sm_decide(const struct pair_sm *s, uint64_t src_last, uint64_t epoch,
			     int stepped, int marks_lost)
{
	if (s->need_dense && s->why == PAIR_WHY_RESYNC)
		return PAIR_WHY_RESYNC;
	if (!s->last_sent || !src_last)
		return PAIR_WHY_INITIAL;
	if (s->need_dense || marks_lost)
		return PAIR_WHY_REPAIR;
	if (!stepped)
		return PAIR_WHY_STEP_GAP;
	if (s->last_sent != src_last)
		return PAIR_WHY_MISSED_VERSION;
	if (s->staged < s->prev_sent)
		return PAIR_WHY_UNACKED_BASE;
	if (s->sent_epoch != epoch && s->staged < s->last_sent)
		return PAIR_WHY_REPLAN;
	return PAIR_WHY_NONE;
}

const char *pair_sm_why_name(enum pair_why why)
{
	switch (why) {
	case PAIR_WHY_NONE:           return "sparse";
	case PAIR_WHY_INITIAL:        return "initial";
	case PAIR_WHY_RESYNC:         return "resync";
	case PAIR_WHY_REPAIR:         return "repair";
	case PAIR_WHY_STEP_GAP:       return "step_gap";
	case PAIR_WHY_MISSED_VERSION: return "missed_version";
	case PAIR_WHY_UNACKED_BASE:   return "unacked_base";
	case PAIR_WHY_REPLAN:         return "replan";
	case PAIR_WHY_COST:           return "cost";
	}
	return "unknown";
}

const char *pair_sm_state_name(enum pair_state st)
{
	static const char *const n[PAIR_S_COUNT] = { "fresh", "clean", "repair", "resync" };

	return (unsigned)st < PAIR_S_COUNT ? n[st] : "?";
}

const char *pair_sm_event_name(enum pair_event ev)
{
	static const char *const n[PAIR_EV_COUNT] = {
		"reset", "replanned", "sent", "send_failed", "capture_failed", "staged", "applied",
		"apply_failed", "resync", "repair",
	};

	return (unsigned)ev < PAIR_EV_COUNT ? n[ev] : "?";
}

const char *pair_sm_action_name(enum pair_action a)
{
	static const char *const n[PAIR_A_COUNT] = {
		"-", "reset", "carry", "sent", "need_dense", "resync", "staged", "applied", "failed",
	};

	return (unsigned)a < PAIR_A_COUNT ? n[a] : "?";
}

int pair_sm_has(const struct pair_sm *s, uint64_t version)
{
	if (s->applied >= version)
		return 1;
	return s->failed >= version ? -1 : 0;
}

/* ------------------------------------------------------------ the cost */

double pair_cost_ewma(double old, double sample)
{
	/* Recent versions weigh most; one odd sample moves it by a quarter. */
	return old > 0 ? 0.75 * old + 0.25 * sample : sample;
}

static double stages(int local, double a, double b, double c)
{
	if (local)
		return a + b + c;
	return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

void pair_sm_choose(const struct pair_sm *s, uint64_t src_last, uint64_t epoch, int stepped,
		    int marks_lost, const struct pair_cost_in *in, struct pair_choice *out)
{
	const struct pair_rates *r = &s->r;
	double e = (double)in->elements, sb, dread, asp, ad;
	const char *why = NULL;

	memset(out, 0, sizeof(*out));
	out->why = pair_sm_decide(s, src_last, epoch, stepped, marks_lost);
	if (out->why != PAIR_WHY_NONE) {
		snprintf(out->reason, sizeof(out->reason), "mode=dense reason=%s",
			 pair_sm_why_name(out->why));
		return;
	}
	if (in->policy == PAIR_MODE_SPARSE)
		why = "forced";
	else if (in->elements < PAIR_COST_MIN_ELEMENTS)
		why = "small";
	else if (r->dense_run >= PAIR_COST_PROBE)
		why = "probe";	/* measure the changed fraction again */
	else if (in->scan_Bps <= 0 || !r->sparse_seen || !in->elements ||
		 (!in->local && r->link.Bps <= 0) ||
		 (in->local && r->apply_sparse_Bps <= 0 && r->apply_dense_Bps <= 0))
		why = "no_estimate";
	if (why) {
		snprintf(out->reason, sizeof(out->reason), "mode=sparse reason=%s", why);
		return;
	}
	sb = e * r->changed_frac * (r->bytes_per_changed > 0 ? r->bytes_per_changed : 3.0);
	/* θ alone is a third of θ, m, v: the same memory, read the same way */
	dread = in->dense_Bps > 0 ? e * 4.0 / in->dense_Bps : e * 4.0 / in->scan_Bps;
	/* one apply rate stands in for the other until both were measured */
	asp = r->apply_sparse_Bps > 0 ? r->apply_sparse_Bps : r->apply_dense_Bps;
	ad = r->apply_dense_Bps > 0 ? r->apply_dense_Bps : r->apply_sparse_Bps;
	out->sparse_s = stages(in->local, e * 12.0 / in->scan_Bps,
			       in->local ? 0 : sb / r->link.Bps, asp > 0 ? sb / asp : 0);
	out->dense_s = stages(in->local, dread, in->local ? 0 : 2.0 * e / r->link.Bps,
			      ad > 0 ? 2.0 * e / ad : 0);
	if (out->dense_s < PAIR_COST_MARGIN * out->sparse_s)
		out->why = PAIR_WHY_COST;
	snprintf(out->reason, sizeof(out->reason),
		 "mode=%s reason=cost sparse_est_s=%.4g dense_est_s=%.4g changed=%.3g%%",
		 out->why == PAIR_WHY_COST ? "dense" : "sparse", out->sparse_s, out->dense_s,
		 100.0 * r->changed_frac);
}

void pair_cost_sent(struct pair_sm *s, uint64_t version, int dense, enum pair_why why,
		    uint64_t changed, uint64_t elements, uint64_t bytes)
{
	struct pair_rates *r = &s->r;

	r->sent_version = version;
	/* A pair's first version is cold (the sink's daemon maps and first
	 * touches its buffers): its apply rate would make dense look dearer
	 * than it is from then on. */
	r->sent_bytes = why == PAIR_WHY_INITIAL ? 0 : bytes;
	r->sent_dense = dense;
	r->dense_run = why == PAIR_WHY_COST ? r->dense_run + 1 : 0;
	if (dense || !elements)
		return;
	/* the changed fraction follows the learning rate's schedule: half
	 * weight on the newest version */
	r->changed_frac = r->sparse_seen ? 0.5 * r->changed_frac +
					   0.5 * (double)changed / (double)elements :
			  (double)changed / (double)elements;
	r->sparse_seen++;
	if (changed)
		r->bytes_per_changed = pair_cost_ewma(r->bytes_per_changed,
						      (double)bytes / (double)changed);
}

void pair_cost_applied(struct pair_sm *s, uint64_t version, double apply_s)
{
	struct pair_rates *r = &s->r;
	double *rate = r->sent_dense ? &r->apply_dense_Bps : &r->apply_sparse_Bps;

	/* Only the version whose bytes we know, and one that moved some:
	 * an empty sparse version says nothing of the rate. */
	if (version != r->sent_version || apply_s <= 0 || r->sent_bytes < 4096)
		return;
	*rate = pair_cost_ewma(*rate, (double)r->sent_bytes / apply_s);
}

void rate_meter_out(struct rate_meter *m, uint64_t now_ns)
{
	if (!m->inflight++)
		m->busy_t0_ns = now_ns;
}

int rate_meter_done(struct rate_meter *m, uint64_t now_ns, uint64_t bytes)
{
	if (!m->inflight)
		return 0;	/* reset under it (re-plan): nothing to time */
	m->done_bytes += bytes;
	if (--m->inflight)
		return 0;
	m->busy_ns += now_ns > m->busy_t0_ns ? now_ns - m->busy_t0_ns : 0;
	m->busy_bytes += m->done_bytes;
	m->done_bytes = 0;
	if (m->busy_bytes < RATE_SAMPLE_BYTES || !m->busy_ns)
		return 0;
	m->Bps = pair_cost_ewma(m->Bps, (double)m->busy_bytes * 1e9 / (double)m->busy_ns);
	m->samples++;
	m->sample_ns = now_ns;
	m->busy_bytes = 0;
	m->busy_ns = 0;
	return 1;
}

void rate_meter_drop(struct rate_meter *m)
{
	if (m->inflight && !--m->inflight)
		m->done_bytes = 0;
}

void pair_cost_part_out(struct pair_sm *s, uint64_t now_ns)
{
	rate_meter_out(&s->r.link, now_ns);
}

void pair_cost_part_done(struct pair_sm *s, uint64_t now_ns, uint64_t bytes)
{
	rate_meter_done(&s->r.link, now_ns, bytes);
}
