/* daemon/pair_sm.h — the source side of one (source, sink) pair as a state
 * machine (docs/SYNC.md, "The pair's state machine").
 *
 * One owner: the loop thread of the daemon that holds the source.  Events
 * come from the capture (sent, send failed, capture failed), from the sink's
 * acknowledgements (staged, applied, apply failed), from the coordinator
 * (re-planned) and from the operator (resync); the one decision they feed
 * is whether the pair's next version is sparse, on top of the version the
 * source published last, or dense — and why.  Nothing here reads a clock,
 * a job or the network, so tests/unit/test_pair_sm.c drives it through
 * every state × event directly.
 *
 * The rule for building on an unacknowledged version: version v goes
 * sparse to the sink, on top of v−1 (what this source published last),
 * only when all of these hold:
 *   1. v−1 went to this sink (last_sent) and every optimizer step since it
 *      is in the pair's dirty state (`stepped`, marks for K > 1);
 *   2. nothing failed since: no refusal, checksum failure, send or capture
 *      error, no resync asked for (need_dense clear);
 *   3. the sink acknowledged STAGED for the version sent before v−1, or a
 *      later one: at most one unacknowledged version lies under a sparse
 *      one, so a lost version costs one refusal, never a chain of them;
 *   4. v−1 went out under the current plan epoch, or the sink acknowledged
 *      it: a re-plan makes sinks drop versions of the old epoch in flight.
 * Whatever is sent, the sink applies a sparse version only on exactly the
 * base it names; a refusal sets need_dense, so the next version is dense.
 */
#ifndef DTED_PAIR_SM_H
#define DTED_PAIR_SM_H

#include <stdint.h>

/* Why the next version of a pair is dense (the names are the
 * dted_dense_fallbacks_total{reason} labels). */
enum pair_why {
	PAIR_WHY_NONE = 0,        /* sparse */
	PAIR_WHY_INITIAL,         /* nothing sent to this sink yet, or nothing published */
	PAIR_WHY_RESYNC,          /* the operator asked (dtectl resync) */
	PAIR_WHY_REPAIR,          /* a failure: refusal, checksum, send, capture, entries changed */
	PAIR_WHY_STEP_GAP,        /* a step since v−1 is not in the dirty state */
	PAIR_WHY_MISSED_VERSION,  /* v−1 did not go to this sink */
	PAIR_WHY_UNACKED_BASE,    /* the version under v−1 is not acknowledged STAGED */
	PAIR_WHY_REPLAN,          /* v−1 went out under an older plan, unacknowledged */
	PAIR_WHY_COST,            /* sparse was allowed, but dense is estimated cheaper */
};

/* The pair's state as docs/SYNC.md's tables name it ("The pair's state
 * machine"): what the next decision starts from.  Stored in struct
 * pair_sm (state), changed only by pair_sm_event to the table's next;
 * after every event the fields (last_sent, need_dense, why) must say the
 * same (pair_sm_fields_state), or the event counts a bug. */
enum pair_state {
	PAIR_S_FRESH = 0,         /* nothing sent (a new pair, or its entries changed) */
	PAIR_S_CLEAN,             /* sent, nothing failed since */
	PAIR_S_REPAIR,            /* sent, something failed since: need_dense (repair) */
	PAIR_S_RESYNC,            /* the operator asked: need_dense (resync), until a version is sent */
	PAIR_S_COUNT
};

/* Events other than the decision itself. */
enum pair_event {
	PAIR_EV_RESET = 0,        /* the pair was made, or re-planned with other entries */
	PAIR_EV_REPLANNED,        /* re-planned with the same entries: its state carried over */
	PAIR_EV_SENT,             /* version went out (COUNTS handed to the transport) */
	PAIR_EV_SEND_FAILED,      /* the transport refused it: this sink misses the version */
	PAIR_EV_CAPTURE_FAILED,   /* the capture of the version failed */
	PAIR_EV_STAGED,           /* the sink acknowledged STAGED for a version */
	PAIR_EV_APPLIED,          /* the sink applied a version (checksum verified) */
	PAIR_EV_APPLY_FAILED,     /* the sink refused a version or its checksum failed */
	PAIR_EV_RESYNC,           /* the operator asked for a dense version */
	PAIR_EV_REPAIR,           /* something else this daemon saw went wrong (verify) */
	PAIR_EV_COUNT
};

/* What an event does to the fields (pair_sm_event executes it). */
enum pair_action {
	PAIR_A_NONE = 0,          /* "—": the event does not reach this state; nothing */
	PAIR_A_RESET,             /* all zero, need_dense (repair) */
	PAIR_A_CARRY,             /* the old pair's fields, unchanged */
	PAIR_A_SENT,              /* prev_sent <- last_sent, last_sent <- v, sent_epoch <- e, need_dense cleared */
	PAIR_A_NEED_DENSE,        /* need_dense (repair; a resync asked stays the reason) */
	PAIR_A_RESYNC,            /* need_dense (resync) */
	PAIR_A_STAGED,            /* staged <- max(staged, v) */
	PAIR_A_APPLIED,           /* applied <- max(applied, v) */
	PAIR_A_FAILED,            /* need_dense (repair, a resync stays), failed <- max(failed, v) */
	PAIR_A_COUNT
};

struct pair_step {
	enum pair_state next;
	enum pair_action act;
};

/* A send rate (bytes per second) measured while sends were in flight:
 * rate_meter_out when one starts, rate_meter_done when it completed with
 * its bytes; the time with none in flight does not count, so a link that
 * waits for data (a relay fed slowly, a sparse source) is not taken for a
 * slow one.  A sample is taken once RATE_SAMPLE_BYTES went (small sends
 * measure latency), and Bps follows samples by pair_cost_ewma. */
#define RATE_SAMPLE_BYTES (4u << 20)

struct rate_meter {
	uint32_t inflight;        /* sends in flight now */
	uint64_t busy_t0_ns;      /* since when */
	uint64_t busy_ns, busy_bytes, done_bytes;
	uint32_t samples;         /* samples behind Bps */
	uint64_t sample_ns;       /* when the newest was taken */
	double Bps;               /* 0: not measured yet */
};

void rate_meter_out(struct rate_meter *m, uint64_t now_ns);
/* 1 when this completion made a new sample. */
int  rate_meter_done(struct rate_meter *m, uint64_t now_ns, uint64_t bytes);
/* A send that will not complete (its link went down): no time, no bytes. */
void rate_meter_drop(struct rate_meter *m);

/* Running estimates of what a version of this pair costs (pair_cost_*):
 * measured by the source's daemon, kept with the pair's state (a re-plan
 * that keeps the entries keeps them).  0 means not measured yet. */
struct pair_rates {
	double apply_sparse_Bps;  /* the sink's apply: payload bytes per second */
	double apply_dense_Bps;
	double changed_frac;      /* changed / elements of recent sparse versions */
	uint32_t sparse_seen;     /* sparse versions behind changed_frac (0: none yet) */
	double bytes_per_changed; /* sparse payload bytes per changed element */
	uint32_t dense_run;       /* versions in a row sent dense for cost */
	/* the version last sent, for the apply rate when its APPLIED comes */
	uint64_t sent_version, sent_bytes;
	int sent_dense;
	/* the link: wire bytes per second while parts were in flight */
	struct rate_meter link;
};

struct pair_sm {
	uint64_t last_sent;       /* version last sent (0: none) */
	uint64_t prev_sent;       /* the one sent before it (0: none) */
	uint64_t sent_epoch;      /* plan epoch last_sent went out under */
	uint64_t staged;          /* newest version the sink acknowledged STAGED */
	uint64_t applied;         /* newest version it applied */
	uint64_t failed;          /* newest version it reported not applied */
	int need_dense;           /* rule 2 broken: the next version is dense */
	enum pair_why why;        /* why need_dense (PAIR_WHY_REPAIR or _RESYNC) */
	enum pair_state state;    /* the table's, stored (pair_sm_event) */
	uint32_t state_bugs;      /* events after which the fields said another state (tests: 0) */
	struct pair_rates r;      /* cost estimates (pair_cost_*) */
};

/* A new pair (or one whose entries changed): its first version is dense. */
void pair_sm_init(struct pair_sm *s);

/* The table: state x event -> next state and action (docs/SYNC.md, "The
 * pair's state machine"). */
struct pair_step pair_sm_step(enum pair_state st, enum pair_event ev);

/* The pair's state (stored), and the state its fields give (the check). */
enum pair_state pair_sm_state(const struct pair_sm *s);
enum pair_state pair_sm_fields_state(const struct pair_sm *s);

/* One event, through pair_sm_step: its action on the fields.  `version` is
 * the version concerned (ignored by SEND_FAILED, CAPTURE_FAILED, RESYNC
 * and REPAIR); `epoch` only matters for SENT.  RESET and REPLANNED come
 * through pair_sm_replanned. */
void pair_sm_event(struct pair_sm *s, enum pair_event ev, uint64_t version, uint64_t epoch);

/* A re-plan kept the pair's entries (same hash): its state carries over.
 * A pair whose entries changed starts again from pair_sm_init plus
 * need_dense (PAIR_WHY_REPAIR). */
void pair_sm_replanned(struct pair_sm *s, const struct pair_sm *old);

/* The decision for the source's next version.  `src_last` is the version
 * the source published last (0: none), `epoch` the job's plan epoch now,
 * `stepped` whether every optimizer step since src_last is in the pair's
 * dirty state, `marks_lost` whether marks were scanned since but the pair
 * kept none (its bitmap was dropped).  Returns PAIR_WHY_NONE for sparse. */
enum pair_why pair_sm_decide(const struct pair_sm *s, uint64_t src_last, uint64_t epoch,
			     int stepped, int marks_lost);

/* ---- The cheaper mode (docs/SYNC.md, "Sparse or dense: the cost").
 *
 * Reading θ, m and v costs 12 B per element; a dense version reads 4 B
 * (θ) and sends 2 B.  Where sparse is allowed, the source estimates both
 * from what it measured and sends the cheaper one:
 *   sparse_s = stages(E·12 / scan_Bps,  S / link.Bps,  S / apply_sparse_Bps)
 *   dense_s  = stages(E·4  / dense_Bps, 2E / link.Bps, 2E / apply_dense_Bps)
 * with E the pair's elements, S = E · changed_frac · bytes_per_changed its
 * expected sparse payload.  A remote pair's stages run on two machines
 * and overlap (parts go while the source still reads): stages = max.  A
 * local pair has no link, and its source and sink share one node's cores
 * and memory: stages = the sum of the read and the apply.  A dense version
 * chosen for cost is an ordinary dense version (exact, verified). */
enum pair_mode_policy {
	PAIR_MODE_AUTO = 0,       /* the cheaper one (default) */
	PAIR_MODE_SPARSE,         /* sparse wherever the state machine allows */
};

/* After this many versions in a row dense for cost, one goes sparse again
 * to measure the changed fraction (a dense version cannot see it). */
#define PAIR_COST_PROBE 8
/* A pair below this many elements stays sparse: its versions cost their
 * fixed overheads (records, wake-ups, acknowledgements), which rates in
 * bytes per second do not describe, and either mode is quick. */
#define PAIR_COST_MIN_ELEMENTS ((uint64_t)1 << 20)
/* Dense only when estimated at most this fraction of sparse: estimates
 * are noisy, and a flip costs nothing but a wrong one costs time. */
#define PAIR_COST_MARGIN 0.9

/* What the source knows when it decides; 0 for a rate = not measured. */
struct pair_cost_in {
	uint64_t elements;        /* the pair's elements */
	double scan_Bps;          /* the detect's reads of θ, m, v: bytes (12/element) per second */
	double dense_Bps;         /* a dense capture's reads of θ (4/element) per second;
				   * 0: derived from scan_Bps (the same memory) */
	int local;                /* the sink is on this node: no link */
	enum pair_mode_policy policy;
};

struct pair_choice {
	enum pair_why why;        /* PAIR_WHY_NONE: sparse */
	double sparse_s, dense_s; /* the estimates (0: not estimated) */
	char reason[128];         /* "mode=dense reason=cost sparse_est_s=.. dense_est_s=.." */
};

/* The decision with the cost: pair_sm_decide() first (its reasons win);
 * where it allows sparse, sparse or dense by the estimates in `in` and in
 * s->r.  Pure: reads nothing else. */
void pair_sm_choose(const struct pair_sm *s, uint64_t src_last, uint64_t epoch, int stepped,
		    int marks_lost, const struct pair_cost_in *in, struct pair_choice *out);

/* A version went out: what it was, for the estimates (sparse versions
 * give the changed fraction and bytes per changed element). */
void pair_cost_sent(struct pair_sm *s, uint64_t version, int dense, enum pair_why why,
		    uint64_t changed, uint64_t elements, uint64_t bytes);
/* The sink applied `version` (ok) in apply_s seconds. */
void pair_cost_applied(struct pair_sm *s, uint64_t version, double apply_s);
/* A part of `bytes` was handed to the transport / came back from it, at
 * now_ns (any monotonic clock): the link rate is bytes over the time at
 * least one part was in flight. */
void pair_cost_part_out(struct pair_sm *s, uint64_t now_ns);
void pair_cost_part_done(struct pair_sm *s, uint64_t now_ns, uint64_t bytes);
/* A running estimate: the first sample, then an exponential average. */
double pair_cost_ewma(double old, double sample);

/* The label of a reason ("sparse" for PAIR_WHY_NONE). */
const char *pair_sm_why_name(enum pair_why why);

/* The names docs/SYNC.md's table uses. */
const char *pair_sm_state_name(enum pair_state st);
const char *pair_sm_event_name(enum pair_event ev);
const char *pair_sm_action_name(enum pair_action a);

/* Whether the sink has version v: 1 applied (or a later one), -1 it
 * reported v or a later version not applied, 0 not yet. */
int pair_sm_has(const struct pair_sm *s, uint64_t version);

#endif
