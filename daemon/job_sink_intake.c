/* daemon/job_sink_intake.c — records in at a sink: each COUNTS and
 * PAYLOAD part checked where it enters (the sink, its plan epoch, the
 * pair, its range and counts), kept in its version's pending entry (one
 * per source).  A part delivered twice (the same record again) is
 * dropped; two different parts under one number, a range past the pair or
 * more parts or bytes than COUNTS names refuse the version.  What a kept record does
 * next is the layers' below: apply on arrival takes it, or staging once
 * the version is complete.
 *
 * Calls: job_sink_aoa.c, job_sink_stage.c, job_sink_version.c,
 * job_state.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/coord_sm.h"
#include "daemon/job_auth.h"
#include "daemon/job_capture.h"
#include "proto/peer_auth.h"
#include "daemon/job_sink_int.h"
#include "daemon/job_state.h"
#include "daemon/job_sink_engine.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/recvpool.h"
#include "daemon/sink_sm.h"
#include "gpu/codec.h"

static void pend_refuse(struct job *j, struct jlocal *l, struct jpend *p, const char *why)
{
	struct sink_step d;

	if (jsink_of(l)->arrive && jsink_of(l)->arrive->version == p->version) {
		jsink_arrive_event(j, l, SINK_EV_CONTRADICTS, DTEP__APPLY_RESULT__APPLY_REFUSED,
				   why);
		return;
	}
	d = sink_decide(l, p->version, &p->state, SINK_EV_CONTRADICTS);
	if (d.act == SINK_A_REFUSE) {
		jsink_pend_refuse_exec(j, l, p, why);
		jsink_step_check(j, l, p->version, d);
	}
	/* else refused already: dropped */
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

static struct jpend *pend_get(struct job *j, struct jlocal *l, uint64_t version)
{
	struct jpend *p, *oldest = NULL;
	struct sink_step d;
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
	if (n >= jsink_staged_cap(j->eng) && oldest) {
		uint64_t v = oldest->version;
		d = sink_decide(l, v, &oldest->state, SINK_EV_CAP);
		if (d.act == SINK_A_DROP_COUNTED) {
			DLOG_W("job %s: sink %llx: %zu versions pending, version %llu dropped "
			       "incomplete", j->name, (unsigned long long)l->info.id, n,
			       (unsigned long long)v);
			jsink_of(l)->staging_drops++;
			jsink_pend_drop(l, oldest);
			jsink_step_check(j, l, v, d);
		}
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
	p->state = SINK_V_NONE;
	d = sink_decide(l, version, &p->state, SINK_EV_RECORD);	/* none: → collecting, keep */
	p->next = jsink_of(l)->pend;
	jsink_of(l)->pend = p;
	jsink_step_check(j, l, version, d);
	return p;
}

/* Whether a record (COUNTS or PAYLOAD part) of version v is dropped at
 * sink l (sink_sm.h): a query of the table for v's state (its own where
 * it is on arrival), before its pending version is looked up
 * (record_dropped_pending, after). */
static int record_dropped(struct jlocal *l, uint64_t v)
{
	return sink_sm_step(jsink_vstate(l, v), SINK_EV_RECORD).act == SINK_A_DROP;
}

/* ...and once its pending version p is found (or made). */
static int record_dropped_pending(const struct jpend *p)
{
	return sink_sm_step(p->state, SINK_EV_RECORD).act == SINK_A_DROP;
}

/* A record of another term than the plan held: refused (a COUNTS is
 * answered APPLIED refused, so its source sends the next version dense). */
static void refuse_term(struct job *j, const char *from, uint64_t dst, uint64_t version,
			uint64_t epoch, Dtep__PeerMsgType type)
{
	char why[128];
	Dtep__Applied m = DTEP__APPLIED__INIT;
	Dtep__JobRef ref;

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
		jio_send(j->eng, from, NULL, DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED, &m.base, NULL, 0);
}

/* A COUNTS or PAYLOAD of a term newer than the plan held (the records
 * and the coordinator's PLAN travel on different links, and a source may
 * start a version before this member has the plan it was made under):
 * kept until that PLAN comes (jsink_ahead_replay) instead of refused,
 * which would cost the pair a dense repair.  Bounded in records, bytes
 * and time; past a bound a record is refused as before. */
struct jahead {
	struct jahead *next;
	uint64_t epoch, t_ns;
	Dtep__PeerMsgType type;
	char from[JOB_NODE_MAX];
	uint8_t *hdr, *data;
	size_t hdrlen, len;
	uint64_t to;              /* relayed for this sink (RELAYED.to); 0: direct */
};

#define JAHEAD_MAX_RECORDS 4096
#define JAHEAD_MAX_BYTES   ((size_t)256 << 20)
#define JAHEAD_MAX_NS      (30ull * 1000000000ull)

static void ahead_free_one(struct jahead *a)
{
	free(a->hdr);
	free(a->data);
	free(a);
}

/* Whether a plan of term `epoch` would be taken over the one held
 * (coord_sm's member verdict): a newer counter of the boot held, or a new
 * coordinator's boot that is not retired. */
static int term_ahead(const struct job *j, uint64_t epoch)
{
	struct coord_plan_in in = {
		.proto_ok = 1, .from_coord = 1, .term = epoch, .held = j->epoch,
		.retired = j->retired, .nretired = j->nretired,
	};
	enum coord_plan_verdict v = coord_sm_plan(&in).v;

	return v == COORD_P_ADOPT || v == COORD_P_ADOPT_NEW_BOOT;
}

/* 0 when the record now waits for the plan of its term; -ENOSPC (a bound
 * reached) or -ENOMEM when it cannot: the caller refuses it. */
static int ahead_keep(struct job *j, uint64_t epoch, Dtep__PeerMsgType type, const char *from,
		      const ProtobufCMessage *msg, const void *data, size_t len, uint64_t to)
{
	uint64_t now = jio_now(j->eng);
	struct jahead *a, **pp;
	size_t hl = protobuf_c_message_get_packed_size(msg);

	/* The oldest go first once they have waited too long. */
	while (j->ahead && now - j->ahead->t_ns > JAHEAD_MAX_NS) {
		a = j->ahead;
		j->ahead = a->next;
		j->ahead_n--;
		j->ahead_bytes -= a->hdrlen + a->len;
		j->ahead_dropped++;
		DLOG_W("job %s: a record of term %llx from %s waited %llu s for its plan; refused",
		       j->name, (unsigned long long)a->epoch, a->from,
		       (unsigned long long)(JAHEAD_MAX_NS / 1000000000ull));
		if (a->type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS) {
			Dtep__Counts *m = dtep__counts__unpack(NULL, a->hdrlen, a->hdr);

			if (m) {
				refuse_term(j, a->from, m->dst, m->version, a->epoch, a->type);
				dtep__counts__free_unpacked(m, NULL);
			}
		}
		ahead_free_one(a);
	}
	if (j->ahead_n >= JAHEAD_MAX_RECORDS || j->ahead_bytes + hl + len > JAHEAD_MAX_BYTES)
		return -ENOSPC;
	if (!(a = calloc(1, sizeof(*a))) || !(a->hdr = malloc(hl ? hl : 1)) ||
	    (len && !(a->data = malloc(len)))) {
		if (a)
			ahead_free_one(a);
		return -ENOMEM;
	}
	a->epoch = epoch;
	a->t_ns = now;
	a->type = type;
	a->to = to;
	snprintf(a->from, sizeof(a->from), "%s", from);
	a->hdrlen = protobuf_c_message_pack(msg, a->hdr);
	a->len = len;
	if (len)
		memcpy(a->data, data, len);
	for (pp = &j->ahead; *pp; pp = &(*pp)->next)
		;
	*pp = a;
	j->ahead_n++;
	j->ahead_bytes += a->hdrlen + len;
	j->ahead_held++;
	return 0;
}

void jsink_ahead_replay(struct job *j)
{
	struct jahead *list = j->ahead, *a;

	j->ahead = NULL;
	j->ahead_n = 0;
	j->ahead_bytes = 0;
	while ((a = list)) {
		list = a->next;
		/* As if it came now: its term's plan takes it, an older term
		 * refuses it, a term still ahead keeps it waiting. */
		if (a->type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS) {
			Dtep__Counts *m = dtep__counts__unpack(NULL, a->hdrlen, a->hdr);

			if (m) {
				jsink_counts(j, a->from, m, a->hdr, a->hdrlen, a->to);
				dtep__counts__free_unpacked(m, NULL);
			}
		} else {
			Dtep__Payload *m = dtep__payload__unpack(NULL, a->hdrlen, a->hdr);

			if (m) {
				jsink_payload(j, a->from, m, a->data, a->len, a->to);
				dtep__payload__free_unpacked(m, NULL);
			}
		}
		ahead_free_one(a);
	}
}

uint64_t jsink_ahead_oldest(const struct job *j)
{
	return j->ahead ? j->ahead->t_ns : 0;
}

void jsink_ahead_free(struct job *j)
{
	struct jahead *a;

	while ((a = j->ahead)) {
		j->ahead = a->next;
		ahead_free_one(a);
	}
	j->ahead_n = 0;
	j->ahead_bytes = 0;
}

static struct jlocal *sink_for(struct job *j, uint64_t dst, uint64_t epoch, const char *from,
			       uint64_t version, Dtep__PeerMsgType type,
			       const ProtobufCMessage *msg, const void *data, size_t len, uint64_t to)
{
	struct jlocal *l = job_local(j, dst);

	if (!l || l->info.role != JROLE_SINK) {
		DLOG_I("job %s: record for sink %llx, not attached here (dropped)", j->name,
		       (unsigned long long)dst);
		return NULL;
	}
	if (epoch != j->epoch && term_ahead(j, epoch) &&
	    ahead_keep(j, epoch, type, from, msg, data, len, to) == 0) {
		DLOG_I("job %s: version %llu for sink %llx under term %llx, newer than the plan "
		       "held (%llx): kept until its plan comes", j->name, (unsigned long long)version,
		       (unsigned long long)dst, (unsigned long long)epoch,
		       (unsigned long long)j->epoch);
		return NULL;
	}
	if (epoch != j->epoch) {
		refuse_term(j, from, dst, version, epoch, type);
		return NULL;
	}
	return l;
}

/* ----------------------------------------------------------------- relay */

/* Relay (docs/SYNC.md, "Relay between sink daemons"): sink l took a
 * record addressed to its tree's root (the root itself from a source, a
 * member from its parent): it goes on, unchanged, to each of l's
 * children as a RELAYED, the record after its data.  A part is checked
 * first (its chunk's header, and a raw chunk's bytes against the xxh3 its
 * source sealed): a relay does not pass on what it would refuse.  A record from a source on this node
 * carries no MAC (it never left the process): it is sealed here, so the
 * child can check it as any source's. */
static int part_sound(const void *data, size_t len, uint64_t xxh3)
{
	const uint8_t *raw;
	size_t raw_len;
	uint64_t rl;
	int codec;

	if (len < DTC_CHUNK_HDR || dtc_chunk_info(data, len, &rl, &codec) != DTC_OK ||
	    dtc_chunk_xxh3(data) != xxh3)
		return 0;
	/* Raw, its bytes are hashed here; compressed, the MAC checked where
	 * it came in covers them, and unpacking is the staging's. */
	return codec != DTC_CODEC_RAW || dtc_chunk_view(data, len, &raw, &raw_len) == DTC_OK;
}

/* A relayed record given to the transport: its buffer, and the send
 * timed for the node's send rate (jlink) when it goes to another node.
 * The capture pool holds the engine's place (it outlives the engine
 * while records are out: job_capture.c, jcap_chunk_release). */
struct relay_ticket {
	struct jcap_pool *pool;
	int timed;
	char job[JOB_NAME_MAX];
	char node[JOB_NODE_MAX];
	uint64_t len;
};

static void relay_release(void *data, void *arg)
{
	struct relay_ticket *t = arg;

	free(data);	/* NULL: a receiver on this node took it (route.h) */
	if (t->timed && t->pool->eng)
		jlink_done(t->pool->eng, t->job, t->node, t->len);
	jcap_chunk_release(t->pool, NULL, 0);
	free(t);
}

static void relay_forward(struct job *j, const struct jlocal *l, Dtep__PeerMsgType type,
			  const ProtobufCMessage *msg, const void *data, size_t len)
{
	ProtobufCBinaryData *mf = peer_auth_mac_field((ProtobufCMessage *)msg), keep = { 0 };
	Dtep__Relayed r = DTEP__RELAYED__INIT;
	Dtep__JobRef ref;
	uint8_t mac[PEER_AUTH_MACBYTES], *buf = NULL, *give;
	struct relay_ticket *t;
	size_t rl, n = 0;
	int sealed = 0;

	for (size_t i = 0; i < j->nparts; i++)
		n += j->parts[i].relay_parent == l->info.id;
	if (!n)
		return;
	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD &&
	    !part_sound(data, len, ((const Dtep__Payload *)msg)->xxh3)) {
		j->relay_bad++;
		dmetrics_add(DM_RELAYED_BYTES, "failed", (double)len * (double)n);
		DLOG_W("job %s: sink %llx: a part's data does not match its checksum: not relayed "
		       "to its %zu children", j->name, (unsigned long long)l->info.id, n);
		return;
	}
	/* Sealed into the caller's message for packing, then put back. */
	if (mf && !mf->len && job_auth_seal(j->eng, type, msg, data, len, mac) == 1) {
		keep = *mf;
		mf->data = mac;
		mf->len = sizeof(mac);
		sealed = 1;
	}
	rl = protobuf_c_message_get_packed_size(msg);
	if ((buf = malloc(len + rl)))
		protobuf_c_message_pack(msg, buf + len);
	if (sealed)
		*mf = keep;
	if (!buf) {
		DLOG_E("job %s: out of memory relaying a record", j->name);
		return;
	}
	if (len)
		memcpy(buf, data, len);
	job_fill_ref(j, &ref);
	r.job = &ref;
	r.type = type;
	r.record_len = (uint32_t)rl;
	for (size_t i = 0; i < j->nparts; i++) {
		const struct jpinfo *c = &j->parts[i];
		int rc;

		if (c->relay_parent != l->info.id)
			continue;
		r.to = c->id;
		/* The last child gets the buffer itself (a chain's one child:
		 * no copy); the others a copy each.  Each is given, so its
		 * completion times the link (jlink). */
		if (--n == 0) {
			give = buf;
			buf = NULL;
		} else if ((give = malloc(len + rl))) {
			memcpy(give, buf, len + rl);
		}
		if (!give || !(t = calloc(1, sizeof(*t)))) {
			free(give);
			rc = -ENOMEM;
		} else {
			t->pool = j->eng->cpool;
			t->timed = !jio_is_self(j->eng, c->node, NULL);
			snprintf(t->job, sizeof(t->job), "%s", j->name);
			snprintf(t->node, sizeof(t->node), "%s", c->node);
			t->len = len + rl;
			jcap_chunk_given(t->pool);
			if (t->timed)
				jlink_out(j, c->node);
			rc = job_send_to_node_given(j, c->node,
						    DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED, &r.base, give,
						    len + rl, relay_release, t);
		}
		if (rc < 0) {
			j->relay_bad++;
			dmetrics_add(DM_RELAYED_BYTES, "failed", (double)(len + rl));
			DLOG_W("job %s: relaying to sink %llx on %s failed: it misses this version",
			       j->name, (unsigned long long)c->id, c->node);
		} else {
			j->relayed_records++;
			j->relayed_bytes += len + rl;
			dmetrics_add(DM_RELAYED_BYTES, "sent", (double)(len + rl));
		}
	}
	free(buf);
}

/* Whether local sink l takes a record of its tree (dst: the sink the
 * source addressed; to: 0 when it came from the source, else l, relayed
 * by l's parent), after passing it on to l's children.  A relayed record
 * must name l's root; a member the source sends this version directly
 * (direct) forwards the relayed copy and takes the direct one. */
static int relay_take(struct job *j, const struct jlocal *l, uint64_t dst, uint64_t to,
		      const uint64_t *direct, size_t ndirect, Dtep__PeerMsgType type,
		      const ProtobufCMessage *msg, const void *data, size_t len)
{
	const struct jpinfo *me = job_part(j, l->info.id);

	if (!to) {
		if (me && me->relay_root == l->info.id)
			relay_forward(j, l, type, msg, data, len);
		return 1;
	}
	if (!me || !me->relay_parent || me->relay_root != dst) {
		j->refused++;
		DLOG_W("job %s: a relayed record for sink %llx of tree %llx, which is not its tree "
		       "in this plan (dropped)", j->name, (unsigned long long)l->info.id,
		       (unsigned long long)dst);
		return 0;
	}
	relay_forward(j, l, type, msg, data, len);
	for (size_t i = 0; i < ndirect; i++)
		if (direct[i] == l->info.id)
			return 0;
	return 1;
}

void jsink_counts(struct job *j, const char *from, const Dtep__Counts *m, const uint8_t *hdr,
		  size_t hdrlen, uint64_t to)
{
	struct jlocal *l = sink_for(j, to ? to : m->dst, m->epoch, from, m->version,
				    DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, &m->base, NULL, 0, to);
	const struct jpair *pair;
	struct jpend *p;
	struct jpend_src *s;
	char why[192];

	if (!l || !relay_take(j, l, m->dst, to, m->relay_direct, m->n_relay_direct,
			      DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, &m->base, NULL, 0))
		return;
	pair = job_pair(j, m->src, l->info.id);
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
	sink_staged_tell(j, l);
}

/* A part already held and a record naming the same part number: the
 * same record (range, size, data hash, and what it says of its counts)? */
static int same_part(const struct jpart *pt, const Dtep__Payload *m, size_t len)
{
	if (pt->first != m->first_entry || pt->entries != m->entries || pt->len != len ||
	    pt->xxh3 != m->xxh3 || !pt->cnt != !m->n_counts)
		return 0;
	if (!m->n_counts)
		return 1;
	return pt->base == m->base_version && pt->mode == (int)m->mode &&
	       !memcmp(pt->cnt, m->counts, m->n_counts * sizeof(*pt->cnt));
}

/* One PAYLOAD part: kept until its COUNTS and every other part named
 * there are in (jsink_try_stage).  A part that cannot belong to an acceptable
 * version is dropped, and so is a copy of a part already held (same range,
 * size, data hash and counts: the record delivered twice); one that
 * contradicts the version's other records (another part under the same
 * number, a range past the pair, an index past what COUNTS names) refuses
 * the version. */
void jsink_payload(struct job *j, const char *from, const Dtep__Payload *m, const void *data,
		   size_t len, uint64_t to)
{
	struct jlocal *l = sink_for(j, to ? to : m->dst, m->epoch, from, m->version,
				    DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &m->base, data, len, to);
	const struct jpair *pair;
	struct jpend *p;
	struct jpend_src *s;
	struct jpart *pt;
	char why[192];

	/* Its relay children get it whatever this sink does with it: this
	 * sink may hold the version already (sent to it directly) while they
	 * wait for it (relay_take). */
	if (!l || !relay_take(j, l, m->dst, to, m->relay_direct, m->n_relay_direct,
			      DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &m->base, data, len))
		return;
	if (record_dropped(l, m->version)) {
		DLOG_I("job %s: PAYLOAD part %u for version %llu but sink %llx holds %llu (dropped)",
		       j->name, m->part, (unsigned long long)m->version,
		       (unsigned long long)l->info.id, (unsigned long long)jsink_of(l)->held);
		return;
	}
	pair = job_pair(j, m->src, l->info.id);
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
		if (s->parts[k].part != m->part)
			continue;
		if (same_part(&s->parts[k], m, len)) {
			/* The transport delivered one record twice (a peer's
			 * retry, a duplicating link): the copy adds nothing. */
			j->dup_parts++;
			DLOG_I("job %s: PAYLOAD part %u of v%llu from %llx came twice; the copy "
			       "dropped", j->name, m->part, (unsigned long long)m->version,
			       (unsigned long long)m->src);
			return;
		}
		snprintf(why, sizeof(why), "source %llx: part %u twice, saying different things",
			 (unsigned long long)m->src, m->part);
		pend_refuse(j, l, p, why);
		jsink_try_stage(j, l);
		return;
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
	pt->xxh3 = m->xxh3;
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
	sink_staged_tell(j, l);
}