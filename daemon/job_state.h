/* daemon/job_state.h — the sync engine's objects and its bottom layer
 * (job_state.c); internal to the engine, not for other layers.  The
 * engine is built in layers that call only downward (docs/SYNC.md,
 * "Layers"); from the top:
 *   job.c          control API, records in (job_peer_recv), waits, lifecycle
 *   job_storage.c  the storage writer and reader
 *   job_local.c    a participant made and freed (both roles)
 *   job_coord.c    membership (JOIN), plans (coordinator and member)
 *   job_src.c      source: publish, mark, acks
 *   job_sink*.c    sink: records in, apply on arrival, staging, apply
 *                  (job_sink_int.h: its files, one concern each)
 *   job_ops.c      verify, resync (and what they remember at apply)
 *   job_capture.c  a capture on a worker; job_task.c: heavy steps on
 *                  workers, the shutdown drain
 *   job_state.c    the engine's lookups, sends, answers, waits, history, layouts
 *   engine_io.h    the engine's I/O: clock, timers, workers, wake, watch,
 *                  peer transport (daemon/engine_io_uv.c: libuv, route.c)
 * A lower file learns of a higher one's business only through a
 * completion the higher one gave with its request (struct jwait's try,
 * jsink_make_writer's staged): no call up, no engine-wide event.
 *
 * The engine is an instance (struct dte_engine below, opaque in job.h):
 * every piece of its mutable state lives in it, two engines can live in
 * one process, and nothing reaches "the" engine through a global.  A job
 * knows its engine (job.eng); a function without a job takes the engine
 * as its first argument; an I/O callback finds it through its argument
 * or its task (tests/system/engine_api.sh counts what is left global).
 * The engine reaches the world only through its struct dte_engine_io
 * (e->io, daemon/engine_io.h): no engine file calls libuv or the router. */
#ifndef DTED_JOB_STATE_H
#define DTED_JOB_STATE_H

#include <stdint.h>
#include <pthread.h>
#include "daemon/buf.h"
#include "daemon/bufpool.h"
#include "daemon/derr.h"
#include "daemon/job_ext.h"
#include "daemon/layout/layout.h"
#include "daemon/layout/spec.h"
#include "daemon/pair_sm.h"
#include "daemon/sink_sm.h"
#include "daemon/engine_io.h"
#include "gpu/compute.h"
#include "gpu/entry.h"
#include "daemon/job_api.h"
#include "proto/peer.pb-c.h"
#include "proto/peer_protocol.h"
#include "proto/peer_auth.h"

#define JOB_NAME_MAX   64
#define JOB_WAIT_TICK_MS 20	/* the waits' tick: how late a deadline is seen */
#define JOB_NODE_MAX   64
#define JOB_ADDR_MAX   96
#define JOB_DESC_MAX   128
#define JOB_HISTORY    512
#define JOB_MAX_GROUPS 65536     /* = DTE_SHARD_MAX_GROUPS: a group per shard */

enum { JROLE_SOURCE = 0, JROLE_SINK = 1 };
/* Change detection (job option `detect`, docs/SYNC.md). */
enum { JDETECT_ADAMW = 0, JDETECT_SNAPSHOT = 1 };

struct dte_engine;
struct jsnap;
struct side_tab;

/* A participant as the plan names it (any node). */
struct jpinfo {
	uint64_t id;
	int      role;
	char     layout[JOB_DESC_MAX];
	uint32_t rank, replica;
	char     node[JOB_NODE_MAX];
	/* A sink under relay (PLAN, Participant.relay_parent/_root): the
	 * replica its records come through (0: the sources) and its tree's
	 * root (itself for the root; 0: not relayed). */
	uint64_t relay_parent, relay_root;
	/* Coordinator only (relay_lag_check): since when this sink has been
	 * behind a neighbour in its tree (0: not), and whether it is planned
	 * as a leaf for that. */
	uint64_t lag_since_ns;
	int lagging;
	/* Coordinator, [peer] relay_shape = measured (relay_assign): its
	 * node's measured rate is under a third of its tree's median, so it is
	 * planned as a leaf (after any lagging relay). */
	int slow;
};

/* This daemon's send rate toward one node in a job (peer protocol 10,
 * RATES; job_coord.c, the relay shape): PAYLOAD parts of its sources and
 * records its relays forwarded. */
struct jlink {
	char node[JOB_NODE_MAX];
	struct rate_meter m;
};

/* A member's reported send rate toward one node (RATES), and when its
 * newest sample was taken (the coordinator's clock). */
struct jlinkrate {
	char to[JOB_NODE_MAX];
	double Bps;
	uint64_t sample_ns;
};

/* One plan entry as this daemon uses it. */
struct jentry {
	uint32_t tensor, group;
	uint32_t src_buf, src_buf_m, src_buf_v;   /* layout buffer ids, source rank */
	uint32_t dst_buf;                         /* layout buffer id, sink rank */
	uint64_t box;                             /* elements */
	struct dte_box_map map;
	/* An FP32 tensor's halves (daemon/layout/spec.h): the source map is
	 * in 16-bit units of its FP32 buffer, and the entry is sent whole
	 * every version as the bits are (job_capture.c entry_raw). */
	uint8_t  raw;
	/* An entry into an FP8 sink (layout/plan.h, dte_fp8_split): map's
	 * extent and dst side are 16-bit units of dst_buf; its src_offset and
	 * src_stride[0..1] are the element box [fbox[0], fbox[1]] the source
	 * quantizes with fp8_flags (job_capture.c entry_fp8). */
	uint8_t  fp8;                             /* 0, JFP8_CODES or JFP8_SCALES */
	uint32_t fp8_flags;
	int64_t  fbox[2];
};

enum { JFP8_CODES = 1, JFP8_SCALES = 2 };

/* Every entry from one source participant to one sink participant. */
struct jpair {
	uint64_t src, dst;
	struct jentry *e;
	size_t n;
	uint64_t hash;            /* of the entries: same hash keeps the state */
	/* source side */
	uint64_t **dirty;         /* per entry: bitmap of marked steps */
	struct side_tab *side;    /* published values of first marks (side_table.h) */
	struct jsnap *snap;       /* detect = snapshot: per entry, values last captured */
	struct pair_sm sm;        /* sent, acknowledged, sparse or dense (pair_sm.h) */
};

/* One PAYLOAD part as received: entries [first, first + entries) of the
 * pair, framed (peer.proto, Payload). */
struct jpart {
	uint32_t part, first, entries;
	uint8_t *data;
	size_t len;
	/* PAYLOAD.counts and base_version when the source sent them (a
	 * sparse part readable before COUNTS), else NULL. */
	uint64_t *cnt;
	uint64_t base;
	int mode;                 /* Dtep__Mode, with cnt */
	/* What the record said of its data (PAYLOAD.xxh3): a part that comes
	 * again saying the same is the same record, delivered twice. */
	uint64_t xxh3;
};

/* A version collected for one local sink from its sources.  Parts come
 * while the source still detects, COUNTS last (naming how many parts and
 * bytes); either may overtake the other on the wire. */
struct jpend_src {
	uint64_t src;
	Dtep__Counts *counts;     /* unpacked COUNTS, NULL until it came */
	struct jpart *parts;
	size_t nparts, cap;
	uint64_t bytes;           /* Σ parts' len */
};

struct jpend {
	uint64_t version, epoch;
	struct jpend_src *s;
	size_t n;
	/* Its state (sink_sm.h), changed only by sink_decide: collecting
	 * (its records kept) or refused (kept without data: later records of
	 * it are dropped).  While the version is on arrival its state is the
	 * jarrive's; this one still says whether its records are kept. */
	enum sink_vstate state;
	struct jpend *next;
};

/* At most this many parts per (pair, version): 2^16 · the part size is
 * far past any model, and a peer cannot make a sink track more. */
#define JOB_MAX_PARTS 65536

/* A write of one entry, self-contained (plans may change).  Host
 * buffers keep the checked payload bytes (enc, inside the version's held
 * payloads) and apply from them; CUDA buffers and the storage writer's
 * mirror get decoded positions and values. */
struct jwrite {
	uint32_t dst_slot;        /* index into the sink's buffers */
	int dense;
	struct dte_box_map map;
	uint64_t n;               /* positions (sparse) */
	uint64_t *pos;
	uint16_t *val;            /* n values, or box values when dense */
	const uint8_t *enc;       /* or: the entry's payload (sparse codec or dense LE values) */
	size_t enc_len;
	int swapped;              /* apply worker: enc holds the old values (undo: swap again) */
};

struct jarrive;
struct recvpool;

struct jstaged {
	uint64_t version;
	enum sink_vstate state;   /* staged; applying once an apply took it (sink_decide) */
	int all_dense;            /* every source sent it dense (in place too) */
	struct jwrite *w;
	size_t n;
	uint64_t *expect;         /* per sink buffer slot: Σ partials */
	uint8_t *covered;         /* per slot: some entry maps into it */
	uint64_t *srcs;           /* sources to acknowledge */
	size_t nsrcs;
	uint8_t **held;           /* payload buffers the writes' enc point into */
	size_t nheld;
	/* Applied on arrival: its values are in the buffers already and
	 * verified (isum per slot under ikey); the apply writes nothing. */
	int in_place;
	uint64_t *isum;
	uint64_t ikey;
	struct jstaged *next;
};

/* A participant attached on this daemon: what every role has.  It is
 * the first member of a struct jsource or struct jsink (info.role says
 * which, fixed at jlocal_new()); the role's own state is reached only
 * through jsource_of() / jsink_of(), which check the role. */
struct jlocal {
	struct jpinfo info;
	uint64_t owner;           /* control connection */
	size_t nbufs;
	uint32_t *buf_ids;        /* layout buffer ids of its rank, ascending */
	struct dbuf **bufs;
	int announced;            /* a PLAN including it arrived */
	char refused[256];        /* the coordinator refused it: why */
	struct jlocal *next;
};

/* A source attached here (job_src.c, job_capture.c). */
struct jsource {
	struct jlocal l;
	char *shards;             /* of an mcore:/fsdp2: layout: its shard table */
	uint64_t last_version;
	int64_t covered;          /* last optimizer step in the dirty state */
	int gap;                  /* a step was missed since the last publish */
	int marked;               /* a mark scanned since the last publish */
	int busy;                 /* a capture of it is on a worker */
	/* The last publish's capture (protocol 2, async publish): `accepted`
	 * is its version, `cap_pending` while a worker still reads the
	 * source's buffers; once it ended, cap_rc / cap_err say how and
	 * cap_rep holds its counts (wait_captured answers with them). */
	uint64_t accepted;
	int cap_pending;
	int cap_rc;
	char cap_err[512];
	struct jpublish_res cap_rep;
	/* Device sources: the event the daemon records after each capture's
	 * kernels (the trainer's stream waits on it before its next step; its
	 * handle travels in PublishReply.cuda_capture_event).  NULL: none. */
	void *cap_ev;
	uint8_t cap_ev_handle[64];
};

/* The storage writer's canonical sink (job_storage.c) holds its APPLIED
 * back until the version is committed to storage, so a trainer's wait(v)
 * still means "v is in storage".  Only that sink has one. */
struct job;

struct jwriter {
	struct japplied *deferred; /* the APPLIED held back; NULL: none */
	/* The writer's completion, given by the layer that made this sink
	 * (jsink_make_writer): each version staged here, on the loop. */
	void (*staged)(struct job *j, struct jlocal *l);
};

/* A sink attached here (job_sink*.c), or the storage writer's canonical
 * sink (then w is set). */
struct jsink {
	struct jlocal l;
	uint64_t held;            /* newest staged (or applied) version */
	uint64_t applied;
	uint64_t failed;          /* the last version whose check failed (undone: not applied) */
	uint64_t staging;         /* a worker stages this version; 0: none */
	uint64_t applying;        /* an apply on a worker brings it to this version; 0: none */
	/* The states (sink_sm.h) of the versions on a worker, while staging
	 * or applying is set: they move here from their jpend or jstaged and
	 * change only by sink_decide. */
	enum sink_vstate staging_state, applying_state;
	uint64_t apply_gen;       /* applies started: a verify that saw another one skips */
	uint64_t checksum_failures;
	uint64_t staging_drops;   /* staged chains dropped at max_staged_versions */
	/* Verified state (docs/SYNC.md): per slot, the checksum of the boxes
	 * of the last applied version, valid while vkey (those boxes and
	 * buffers) is nonzero; sparse applies onto it add their deltas. */
	uint64_t *vsum;
	uint64_t vkey;
	uint32_t since_full;      /* versions verified incrementally since the last full pass */
	uint64_t full_verifies, incremental_verifies;
	/* Apply on arrival (job_sink_aoa.c, docs/SYNC.md): parked counts the
	 * client's wait_staged calls outstanding (job.c keeps it); arrive is
	 * the one version whose parts are swapped into the buffers as they
	 * come (NULL: none). */
	uint32_t parked;
	struct jarrive *arrive;
	uint64_t arrival_parts, arrival_versions, arrival_undos, arrival_retreats;
	uint64_t apply_undos;      /* applies whose failed check undid their writes */
	struct jpend *pend;
	struct jstaged *staged;
	struct jwriter *w;        /* the storage writer's canonical sink; NULL otherwise */
	/* The receive arena for the sink's next version when that is likely
	 * dense (recvpool.h; job_sink_version.c, jsink_arena_next); NULL: none. */
	struct recvpool *rpool;
};

/* A role accessor used on the other role: a bug in the daemon, never
 * input.  It logs and aborts in every build rather than read another
 * role's memory. */
void jlocal_role_misuse(const struct jlocal *l, int want, const char *func)
	__attribute__((noreturn));

static inline struct jsource *jsource_of(struct jlocal *l)
{
	if (__builtin_expect(!l || l->info.role != JROLE_SOURCE, 0))
		jlocal_role_misuse(l, JROLE_SOURCE, __func__);
	return (struct jsource *)l;
}

static inline const struct jsource *jsource_cof(const struct jlocal *l)
{
	if (__builtin_expect(!l || l->info.role != JROLE_SOURCE, 0))
		jlocal_role_misuse(l, JROLE_SOURCE, __func__);
	return (const struct jsource *)l;
}

static inline struct jsink *jsink_of(struct jlocal *l)
{
	if (__builtin_expect(!l || l->info.role != JROLE_SINK, 0))
		jlocal_role_misuse(l, JROLE_SINK, __func__);
	return (struct jsink *)l;
}

static inline const struct jsink *jsink_cof(const struct jlocal *l)
{
	if (__builtin_expect(!l || l->info.role != JROLE_SINK, 0))
		jlocal_role_misuse(l, JROLE_SINK, __func__);
	return (const struct jsink *)l;
}

/* Coordinator's view of one member daemon. */
struct jmember {
	char node[JOB_NODE_MAX];
	char address[JOB_ADDR_MAX];
	struct jpinfo *p;
	size_t n;
	/* Its newest JOIN processed (proto/peer_protocol.h): a JOIN with the
	 * same join_boot and a join_seq at or below this is a duplicate. */
	uint64_t join_boot, join_seq;
	/* Its JOIN nonce (peer auth), echoed in every PLAN to it. */
	uint8_t nonce[PEER_AUTH_NONCEBYTES];
	/* The PLAN it was last sent (packed), until it acknowledges its term;
	 * retried at next_ns with backoff until deadline_ns. */
	uint8_t *plan;
	size_t plan_len;
	uint64_t plan_term, acked_term;
	/* Its entries as the PLAN carries them (packed once, job_coord.c's
	 * member_part), kept while a re-plan makes its part of the same
	 * pairs from the same cached plans. */
	uint8_t *part;
	size_t part_len;
	uint64_t part_hash;       /* the key of what it was made of */
	int part_ok;
	/* What the plan of plan_term gives it (peer protocol 8: the next
	 * PLAN may carry only the difference): its participants by id with
	 * a hash of each one's packed bytes, and its pairs (source id, sink
	 * id, key of their entries), both sorted; sel_ok when they describe
	 * plan_term.  i and k are where each stood in the re-plan that made
	 * them (job_coord.c, send_plans).  need_full: its next PLAN is whole
	 * (a new JOIN). */
	struct jsel_part { uint64_t id, h; uint32_t i; } *sel_p;
	struct jsel_pair { uint64_t src, dst, key; uint32_t k; } *sel_q;
	size_t nsel_p, nsel_q;
	int sel_ok, need_full;
	uint64_t plans_delta, plans_full;
	/* Its newest RATES (peer protocol 10): send rates toward nodes, and
	 * the bytes of its sources' recent pair-versions (0: none). */
	struct jlinkrate *rates;
	size_t nrates;
	double pair_bytes;
	/* ...and what its sources know of the sinks they feed (RATES.seen,
	 * under its plan of term seen_epoch): the relay lag check's. */
	struct jseen { uint64_t sink, staged, sent; } *seen;
	size_t nseen;
	uint64_t seen_epoch;
	uint64_t next_ns, deadline_ns;
	uint32_t backoff_ms;
	int expired;              /* past deadline_ns unacknowledged: retried every PEER_PLAN_SLOW_MS */
	uint64_t plan_retries;
	struct jmember *next;
};

struct jhist {
	uint64_t version;
	int64_t step;
	int sparse, dense;        /* pairs */
	uint64_t changed, elements, bytes;
	double capture_ms, transfer_ms, apply_ms;
	uint64_t t_captured;      /* jio_now */
	uint32_t pairs, staged_acks;
	uint32_t ok, failed;      /* sink apply results */
	uint32_t sinks;
	char note[96];            /* storage: refusal reason, keyframe */
	char reason[192];         /* sparse or dense, and why (pair_sm_choose) */
	uint64_t reason_dst;      /* the sink of the first pair's reason */
	int reason_multi;         /* pairs differ: reason is "<sink>: ...; <sink>: ..." */
};

struct job {
	struct dte_engine *eng;   /* the engine it lives in */
	char name[JOB_NAME_MAX];
	char token[128];
	/* Peer auth (daemon/job_auth.c, proto/peer_auth.h): on unless the
	 * operator turned it off for this job; the key derived from token;
	 * this daemon's JOIN nonce; records refused for their MAC. */
	int auth;
	uint8_t auth_key[PEER_AUTH_KEYBYTES];
	uint8_t auth_nonce[PEER_AUTH_NONCEBYTES];
	uint64_t auth_refused;
	/* The newest REFUSED of our records that did not verify: not acted
	 * on (a forgery, or a peer with another token), named in the error
	 * of an attach that then times out (job.c). */
	char refusal_hint[384];
	char coordinator[JOB_ADDR_MAX];
	char transport[16];
	struct jstore *store;     /* transport storage/both (job_storage.c) */
	/* Coordinator, relay on: trees in the current plan, and when relay
	 * lag is looked at next (job_coord.c, relay_lag_check); 0: not due. */
	size_t relay_trees;
	uint64_t lag_next_ns;
	/* Send rates measured here (struct jlink; rates_gen counts new
	 * samples, rates_sent_gen the newest a RATES carried, at
	 * rates_sent_ns) and the bytes of this daemon's sources' recent
	 * pair-versions.  A member sends them to a coordinator whose PLAN
	 * said coord_proto >= PEER_PROTO_RATES. */
	struct jlink *links;
	size_t nlinks;
	double pair_bytes;
	uint32_t rates_gen, rates_sent_gen;
	uint64_t rates_sent_ns;
	uint32_t coord_proto;
	/* Coordinator, relay_shape = measured: new rates came (shape_due_ns:
	 * when the shape is looked at again; 0: not due) and the signature
	 * of the shape the current plan was made with (relay_assign). */
	uint64_t shape_due_ns, shape_sig;
	uint64_t rates_expiry_ns; /* the next measured rate to expire (0: none) */
	uint64_t reshapes;
	char *config;             /* config.json text */
	struct dte_spec spec;
	uint32_t interval;        /* K */
	int detect;               /* JDETECT_*: how a source finds changed elements */
	uint32_t zstd_level;      /* payloads to other nodes; 0 raw */
	int is_coord;
	/* this daemon's participants */
	struct jlocal *locals;
	/* the plan part this daemon holds */
	uint64_t epoch;
	int complete;
	struct jpinfo *parts;
	size_t nparts;
	struct jpair *pairs;
	size_t npairs;
	char (*addr_node)[JOB_NODE_MAX];
	char (*addr_addr)[JOB_ADDR_MAX];
	size_t naddr;
	char plan_error[256];
	/* member side of the control records (proto/peer_protocol.h) */
	uint64_t boot;            /* drawn at create: join_boot, and the coordinator's term boot */
	uint64_t join_seq;        /* JOINs sent (a retry repeats the newest) */
	uint64_t join_acked;      /* newest join_seq a PLAN echoed */
	uint64_t join_next_ns;    /* next JOIN retry */
	uint32_t join_backoff_ms;
	uint64_t join_retries, rejoins, plans_refused;
	char coord_node[JOB_NODE_MAX]; /* the coordinator's node name, once a PLAN came */
	int coord_down;           /* it went down; we rejoin when it answers */
	uint64_t retired[PEER_TERM_RETIRED]; /* boots of coordinators superseded */
	unsigned nretired;
	/* coordinator */
	struct jmember *members;
	char **src_shards;        /* [n_src_shards]: shard table per source rank (JOINs) */
	uint32_t n_src_shards;
	uint64_t src_shards_gen;  /* bumped with every shard table kept (the plan cache's key) */
	/* Why the newest re-plan could not plan the sources (their layout
	 * did not build: a tensor no rank registered, a gap); "" when it
	 * could.  dtectl job shows it; a sink's wait that times out says it. */
	char coord_plan_err[1024];
	/* Layouts and plans kept across re-plans (job_coord.c): a (source,
	 * sink layout) plan depends on the spec and the two descriptions
	 * alone. */
	struct jplan_cache *plan_cache;
	uint64_t coord_epoch;     /* term of the newest plan (peer_term(boot, counter)) */
	int coord_complete;       /* that plan had every source rank attached */
	/* counters and history */
	uint64_t refused;
	uint64_t dup_parts;       /* PAYLOAD parts delivered twice: the copy dropped */
	/* relay (job_sink_intake.c): records and bytes forwarded to this
	 * daemon's sinks' children, and forwards refused or failed */
	uint64_t relayed_records, relayed_bytes, relay_bad;
	/* COUNTS and PAYLOAD of a term newer than the plan held, waiting for
	 * its PLAN (job_sink_intake.c, jsink_ahead_*): oldest first, bounded. */
	struct jahead *ahead;
	size_t ahead_n, ahead_bytes;
	uint64_t ahead_held, ahead_dropped;
	/* ...and when such records have waited long, the member asks for the
	 * plan again with its JOIN (job.c, ahead_ask): when, how often. */
	uint64_t ahead_asked_ns, ahead_asks;
	uint64_t ghosts_told;      /* plans naming a participant of this node it does not hold (plan_ghost_check) */
	uint64_t plans_delta;      /* plans taken that carried only what changed (peer protocol 8) */
	uint64_t plans_delta_refused; /* ... on a plan this node did not hold: asked for the whole one */
	uint64_t published;
	/* Running estimates of a capture's reads (pair_sm_choose): bytes of
	 * θ, m, v a detect reads per second (12/element), bytes of θ a dense
	 * capture reads per second (4/element); 0 until measured. */
	double scan_Bps, dense_Bps;
	struct jhist hist[JOB_HISTORY];
	size_t nhist;             /* records ever; ring index nhist % JOB_HISTORY */
	struct job *next;
};

/* An engine's payload buffers of parts that went out, taken again by the
 * next parts (bufpool.h; job_capture.c).  Its own allocation: the router
 * may give a chunk back after the engine is freed (eng is NULL then, and
 * the last chunk back frees the pool). */
struct jcap_pool {
	struct bpool bp;
	size_t chunks_out;        /* given to the router, not back yet (loop only) */
	struct dte_engine *eng;   /* NULL: the engine is gone */
};

/* A capture (mark or publish) on a worker thread: job_capture.c runs it,
 * job_src.c prepares it and finishes it on the loop.  The task owns all
 * of it; nothing here points into a job. */
enum { JCAP_MARK = 0, JCAP_PUBLISH = 1 };

struct jcap_pair {
	uint64_t dst, hash;
	struct jentry *e;         /* copy of the pair's entries */
	size_t n;
	uint32_t *det;            /* per entry: its detection */
	uint64_t **dirty;         /* taken from the pair (marks); NULL: none */
	struct side_tab *side;    /* taken with dirty; NULL: none (the union is sent) */
	struct jsnap *snap;       /* detect = snapshot: taken from the pair like dirty */
	int want_dirty;           /* allocate dirty if missing (a scan fills it) */
	int sparse, remote;
	/* Relay (docs/SYNC.md): this version reaches this sink through its
	 * relay tree (the root's pair carries it), so it is neither framed
	 * nor sent; a root's pair names the members of its tree sent
	 * directly instead (COUNTS/PAYLOAD.relay_direct). */
	int relayed;
	uint64_t *direct;
	size_t ndirect;
	enum pair_why why;        /* pair_sm_choose: PAIR_WHY_NONE = sparse */
	char reason[128];
	/* results */
	uint64_t *counts;
	uint32_t *cbuf;           /* per destination buffer: its partial checksum */
	uint64_t *csum;
	size_t nck;
	size_t chunk_len;         /* Σ of its parts' framed bytes */
	uint64_t changed, elements;
	struct dtc_bytes raw;     /* the part being built */
	/* its chunk hash, fed as the dense extract writes (job_capture.c,
	 * entry_dense): raw.p[DTC_CHUNK_HDR, hashed) is in hs; NULL or
	 * hashed = 0: the part is hashed whole when framed */
	struct XXH3_state_s *hs;
	size_t hashed;
	uint32_t part_first;      /* first entry of that part */
	uint32_t nparts;          /* parts framed by the worker */
	/* loop side */
	uint32_t parts_sent;
	int parts_lost;           /* a part could not go: no COUNTS, dense next */
};

/* A framed part the worker handed to the loop (jcap.q), sent at once. */
struct jcap_part {
	struct jcap_part *next;
	size_t pair;              /* index in jcap.p */
	uint32_t part, first, entries;
	uint8_t *chunk;
	size_t len;
	size_t cap;               /* chunk's capacity (it goes back to a pool) */
	uint64_t *counts;         /* its entries' counts (PAYLOAD.counts) */
};

struct jcap {
	struct dte_work work;
	struct dte_engine *eng;   /* its engine: the pool, parts_wake, inflight */
	int kind;
	char job[JOB_NAME_MAX];
	uint64_t participant;
	struct jreq rq;           /* answered here (conn 0: nobody, an async publish) */
	uint64_t epoch, version;
	uint64_t base;            /* the source's last version at publish: the sparse base (PAYLOAD, COUNTS) */
	int64_t step;
	int scan;                 /* OR this step into the dirty bitmaps */
	int detect;               /* JDETECT_* of the job */
	uint32_t zstd_level;      /* remote pairs' payloads */
	size_t part_bytes;        /* a part goes once its payload reaches this */
	int notify;               /* wake the loop (eng->parts_wake) per part */
	pthread_mutex_t mu;       /* guards q between the worker and the loop */
	int mu_init;
	struct jcap_part *q, **q_tail;
	struct dtc_consts *k;     /* [ngroups] */
	size_t ngroups;
	size_t nbufs;
	uint32_t *buf_ids;
	struct dbuf **bufs;       /* referenced until the task ends */
	struct jcap_pair *p;
	size_t np;
	uint64_t t0;
	int rc;                   /* 0, or a negative errno with the reason in err */
	char err[256];
	/* what the worker did */
	double work_ms;
	double read_ms;           /* of which the source buffers were read */
	uint64_t detections, scans, scan_entries, scan_elements, dirty;
	/* side tables (K > 1): first marks kept, not kept (uncertain, cap),
	 * and positions a publish did not send since the sink holds them */
	uint64_t side_kept, side_uncertain, side_left_out, side_dropped;
	int side_wrong;           /* a test build's fault (job_ext.h): drops to break */
	uint64_t dense_elements;  /* read for dense pairs (shared ones once) */
	struct jfp8_box *f8;      /* the last FP8 box computed (job_capture.c entry_fp8) */
	uint64_t fp8_units, fp8_sent;  /* FP8 entries' units, and those sent */
	struct jcap *next;        /* eng->inflight */
};

int job_send_to_node_given(struct job *j, const char *node, Dtep__PeerMsgType type,
			   const ProtobufCMessage *msg, void *data, size_t len,
			   void (*release)(void *data, void *rarg), void *rarg);

/* A heavy step on a worker (job_task.c): run() on the worker
 * touches only what the task owns; done() on the loop, with the task
 * unlinked, looks its job and participant up again, commits or drops the
 * result, and frees the task.  cancelled: it never ran (shutdown). */
struct jtask {
	struct dte_work work;
	struct dte_engine *eng;   /* set by jtask_start */
	void (*run)(struct jtask *t);
	void (*done)(struct jtask *t, int cancelled);
	struct jtask *next;       /* eng->tasks */
};

struct jverify;

/* A control request answered later (attach, wait, wait_staged,
 * wait_captured): kept in the engine's table below until its own
 * completion answers it.  The layer that takes the request fills it in
 * and gives jwait_add the function that decides (its completion, as
 * raft_apply takes one): try(e, w, expired) answers w through
 * job_done(&w->rq, ...) and returns 1, or returns 0 to keep waiting;
 * expired is set once its deadline passed.  gone(e, w), optional, runs
 * when w leaves the table for any reason. */
struct jwait {
	int kind;                 /* the adding layer's own */
	struct jreq rq;           /* who waits, and its answer */
	char job[JOB_NAME_MAX];
	uint64_t arg, arg2;       /* the adding layer's own */
	uint64_t deadline;        /* jio_now ns (jwait_add sets it) */
	int (*try)(struct dte_engine *e, struct jwait *w, int expired);
	void (*gone)(struct dte_engine *e, const struct jwait *w);
	struct jwait *next;
};

/* The engine (job.h's opaque struct dte_engine): made by dte_engine_new,
 * freed by dte_engine_free.  Every file of the engine keeps its mutable
 * state here, in its own part below. */
struct dte_engine {
	struct dte_engine_io io;  /* its I/O (daemon/engine_io.h), owned */
	const struct dtc_backend *be;
	const char *backend_name;
	struct job *jobs;
	uint32_t next_local;
	uint32_t node_hash;
	struct dte_timer *timer;  /* waits' tick (job.c); NULL: none */
	int timer_on;
	struct dte_timer *ctl_timer; /* JOIN and PLAN retries (job_coord.c) */
	int ctl_timer_on;
	struct jcap *inflight;    /* captures on workers */
	struct jtask *tasks;      /* sink work on workers: apply, verify (job_task.c) */
	int stopping;             /* shutting down: no new work goes to a worker */
	/* Sink versions found elsewhere than their table said after an
	 * action (jsink_step_check): daemon bugs, logged; the tests want 0. */
	uint64_t sink_sm_bugs;
	/* Pair events after which its fields said another state than the
	 * one stored (pair_sm.h), of the pairs freed: bugs; the tests want 0. */
	uint64_t pair_sm_bugs;
	uint64_t scans, scan_entries; /* detection passes, and the entries they served */
	uint32_t max_staged;      /* per sink; 0: JOB_MAX_STAGED_DEFAULT */
	uint32_t verify_full_every; /* sink: full checksum pass every N versions; 0: default */
	size_t part_bytes;        /* source: payload part size; 0: JOB_PART_BYTES_DEFAULT */
	int mode_policy;          /* source: enum pair_mode_policy (config sync_mode) */
	/* coordinator: relay trees over each sink rank's replicas ([peer]
	 * relay_fanout, relay_roots; job_coord.c relay_assign); fanout 0: off */
	uint32_t relay_fanout, relay_roots;
	/* [peer] relay_lag_ms: a relay this long behind its tree is re-planned
	 * as a leaf (job_coord.c, relay_lag_check); 0: off */
	uint32_t relay_lag_ms;
	int relay_measured;       /* [peer] relay_shape = measured (job_set_relay_shape) */
	uint32_t relay_rate_age_ms; /* [peer] relay_rate_max_age_ms */
	struct dte_wake *parts_wake; /* a worker framed a part (job_src.c sends it) */
	int closing;              /* handles closed, their callbacks not run yet */
	/* Extension points (job_ext.h): a test build's hooks, copied from
	 * job_ext_builtin at dte_engine_new when one is linked; all NULL in
	 * production.  A unit test may set its engine's own. */
	struct job_ext ext;

	/* Control requests answered later (struct jwait; job_state.c keeps
	 * the table, each wait's completion decides).  job.c: records
	 * refused that named no job; the hook called after every job
	 * created (job.h). */
	struct jwait *waits;
	int waits_checking, waits_again; /* jwait_check running; asked again meanwhile */
	uint64_t refused;
	void (*created)(struct dte_engine *e, const struct jcreate_args *a);
	/* job_ops.c: what resync remembers for verify at apply. */
	struct jverify *verifies;
	/* job_sink.c: wait_staged calls parked, all sinks. */
	uint64_t parked_total;
	/* job_storage.c: owner ids of the storage writers' participants;
	 * writers' commits on workers. */
	uint64_t store_owners;
	int store_commits;
	/* job_capture.c: payload buffers of parts (struct jcap_pool); dense
	 * prefills on workers (shutdown waits for them). */
	struct jcap_pool *cpool;
	unsigned prefills;
	/* job_auth.c: the operator's switch (job_auth_configure). */
	struct {
		int off;            /* auth = off: every job */
		char off_jobs[512];  /* auth_off_jobs */
	} auth;
	/* job_persist.c: where jobs are kept (empty: nowhere); a restore is
	 * creating them again (not saved twice). */
	struct {
		char dir[4096];
		int restoring;
	} persist;
};

#define JOB_MAX_STAGED_DEFAULT 8
/* A pair's payload goes in parts of about this size while the source is
 * still detecting (docs/SYNC.md): 34 ms of a 1 Gbit/s link, 0.3 ms of a
 * 100 Gbit/s one, so the wire starts early and the tail after the last
 * detection is short, while the per-part cost (one record, its xxh3,
 * which framing pays anyway) stays negligible.  Parts end at entry
 * boundaries, so an entry larger than this is one part. */
#define JOB_PART_BYTES_DEFAULT ((size_t)4 << 20)
#define JOB_VERIFY_FULL_EVERY_DEFAULT 16

/* job_state.c: the bottom layer. */
struct job *job_find(struct dte_engine *e, const char *name);
struct jlocal *job_local(struct job *j, uint64_t id);
struct jlocal *job_local_owned(struct job *j, uint64_t id, uint64_t conn);
/* The job `name` and its source participant `id` that connection conn
 * attached: 0, or -ENOENT with the reason (publish, mark, wait_captured). */
int job_source_owned(struct dte_engine *e, const char *name, uint64_t id, uint64_t conn,
		     struct job **jp,
		     struct jlocal **lp, char *err, size_t errlen);
const struct jpinfo *job_part(const struct job *j, uint64_t id);
const char *job_node_address(const struct job *j, const char *node);
/* Send a record to the daemon holding participant `id` (or node). */
int job_send_to_node(struct job *j, const char *node, Dtep__PeerMsgType type,
		     const ProtobufCMessage *msg, const void *data, size_t len);
void job_fill_ref(const struct job *j, Dtep__JobRef *ref);
/* Find a pair of the current plan, NULL when none. */
struct jpair *job_pair(struct job *j, uint64_t src, uint64_t dst);
struct dbuf *jlocal_buf(const struct jlocal *l, uint32_t layout_id, size_t *slot);
double job_ms_since(const struct dte_engine *e, uint64_t t0);
/* A deferred answer to rq: rc is 0 or a negative errno (daemon/derr.h)
 * with the reason in msg; res only when rc is 0 (NULL otherwise).
 * rq->done gets it (job_api.h); none: logged and dropped. */
void job_done(const struct jreq *rq, int rc, const char *msg, const struct jres *res);
/* A participant id unique in every job of e: this node's hash, then a counter. */
uint64_t job_participant_id_new(struct dte_engine *e);
/* Frees a pair's source side (dirty bitmaps, snapshot). */
void jpair_free_state(struct jpair *p);
struct jhist *jhist_find(struct job *j, uint64_t version);
/* Send rates (struct jlink): a part or relayed record to remote `node`
 * went out (jlink_out) and its transport is done with it (jlink_done,
 * from the release callback: the job is looked up by name, it may be
 * gone); jlinks_busy while any is in flight.  A new sample bumps
 * j->rates_gen. */
void jlink_out(struct job *j, const char *node);
void jlink_done(struct dte_engine *e, const char *job, const char *node, uint64_t bytes);
int  jlinks_busy(const struct job *j);
/* Builds a layout for a participant description; 0, or a negative errno
 * (-EINVAL: the description, rank or shards refused; -ENOMEM) with err.  For
 * a source that registers shards (mcore:, fsdp2:) `shards` is the table
 * the layout is built from (one rank's, or every rank's); NULL: none. */
int jlayout_build(const struct job *j, int role, const char *desc, uint32_t rank,
		  const char *shards, struct dte_layout *l, char *err, size_t errlen);
/* The layout of the storage writer's sink and of a relay reader's source
 * (job_storage.c): daemon-owned, never a client's. */
#define JSTORE_CANON_LAYOUT "canonical"
/* The canonical layout (rank 0, buffer 0) for role JROLE_SINK (BF16: every
 * spec tensor row-major, back to back) or JROLE_SOURCE (FP32: the same
 * order, an FP32 tensor's halves as the bits of its elements). */
int jstore_canonical_layout(const struct dte_spec *spec, int role, struct dte_layout *l,
			    char *err, size_t errlen);
/* The waits (struct jwait).  jwait_add: a copy of *w joins the table,
 * due timeout_ms from now; 0, or -ENOMEM.  jwait_check: every wait's
 * completion is asked (expired: past its deadline); those that answered
 * leave.  Any layer calls it where a version's progress may answer one
 * (a staging, an apply, a capture came back, a record).  jwait_drop_conn:
 * the waits of a closed connection leave unanswered.  jwait_fini: all
 * leave, unanswered (shutdown). */
int jwait_add(struct dte_engine *e, const struct jwait *w, uint32_t timeout_ms);
void jwait_check(struct dte_engine *e);
void jwait_drop_conn(struct dte_engine *e, uint64_t conn);
void jwait_fini(struct dte_engine *e);

/* The engine's I/O (daemon/engine_io.h), for its files. */
static inline uint64_t jio_now(const struct dte_engine *e)
{
	return e->io.now_ns(e->io.ctx);
}
/* Work can go to a worker (else it runs inline). */
static inline int jio_workers(const struct dte_engine *e)
{
	return e->io.work_queue != NULL;
}
/* Queue w (run, after) on a worker: 0, or < 0 when it cannot go (no
 * workers, none to be had): the caller runs it inline then. */
int jio_queue(struct dte_engine *e, struct dte_work *w, void (*run)(struct dte_work *w),
	      void (*after)(struct dte_work *w, int cancelled));
static inline const char *jio_self(const struct dte_engine *e)
{
	return e->io.self_node(e->io.ctx);
}
static inline const char *jio_self_address(const struct dte_engine *e)
{
	return e->io.self_address(e->io.ctx);
}
static inline int jio_is_self(const struct dte_engine *e, const char *node, const char *address)
{
	return e->io.is_self(e->io.ctx, node, address);
}
static inline int jio_send(struct dte_engine *e, const char *node, const char *address,
			   Dtep__PeerMsgType type, const ProtobufCMessage *msg, const void *data,
			   size_t len)
{
	return e->io.send(e->io.ctx, node, address, type, msg, data, len);
}
/* A timer (no-op without timers). */
void jio_timer_start(struct dte_engine *e, struct dte_timer *t, uint64_t timeout_ms,
		     uint64_t repeat_ms);
void jio_timer_stop(struct dte_engine *e, struct dte_timer *t);

#endif
