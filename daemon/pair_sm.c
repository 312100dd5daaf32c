/* daemon/pair_sm.c — the source side of a (source, sink) pair (pair_sm.h;
 * the table of state × event is in docs/SYNC.md). */
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

void pair_sm_event(struct pair_sm *s, enum pair_event ev, uint64_t version, uint64_t epoch)
{
	switch (ev) {
	case PAIR_EV_SENT:
		s->prev_sent = s->last_sent;
		s->last_sent = version;
		s->sent_epoch = epoch;
		s->need_dense = 0;
		s->why = PAIR_WHY_NONE;
		break;
	case PAIR_EV_SEND_FAILED:
	case PAIR_EV_CAPTURE_FAILED:
	case PAIR_EV_REPAIR:
		need_dense(s, PAIR_WHY_REPAIR);
		break;
	case PAIR_EV_RESYNC:
		need_dense(s, PAIR_WHY_RESYNC);
		break;
	case PAIR_EV_STAGED:
		if (version > s->staged)
			s->staged = version;
		break;
	case PAIR_EV_APPLIED:
		if (version > s->applied)
			s->applied = version;
		break;
	case PAIR_EV_APPLY_FAILED:
		/* Whatever the sink holds now, the next version repairs it. */
		need_dense(s, PAIR_WHY_REPAIR);
		if (version > s->failed)
			s->failed = version;
		break;
	}
}

void pair_sm_replanned(struct pair_sm *s, const struct pair_sm *old)
{
	if (old) {
		*s = *old;
		return;
	}
	pair_sm_init(s);
	need_dense(s, PAIR_WHY_REPAIR);
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
	}
	return "unknown";
}

int pair_sm_has(const struct pair_sm *s, uint64_t version)
{
	if (s->applied >= version)
		return 1;
	return s->failed >= version ? -1 : 0;
}
