/* daemon/job_api.h — the sync engine's requests and results: plain C, no
 * wire types (daemon/job.h's operations take and fill these).  The
 * control handlers (daemon/cmd_job.c, cmd_ops.c) fill the requests from
 * the control protocol's messages and build its replies from the results;
 * daemon/wire_job.c keeps a job's creation on disk.  The fields are the
 * protocol's (proto/dte.proto), one for one, so a reply carries exactly
 * what the engine filled.
 *
 * Strings and arrays of a request are borrowed for the call; those of a
 * result point into the engine (or into the reply arena it was handed) and
 * hold until the loop runs again: pack them before returning to it. */
#ifndef DTED_JOB_API_H
#define DTED_JOB_API_H

#include <stddef.h>
#include <stdint.h>

struct jres;
struct jreq;

/* The answer to a request the engine deferred (*deferred = 1): rc is 0 or
 * a negative errno (daemon/derr.h) with the reason in err; res is the
 * result when rc is 0, else NULL.  Called once, on the loop; res and what
 * it points at hold for the call only. */
typedef void jdone_fn(const struct jreq *rq, int rc, const char *err, const struct jres *res);

/* Who asks, and where a deferred answer goes (raft's request with its
 * callback).  Copied by the engine: the caller's may go once the call
 * returns. */
struct jreq {
	uint64_t conn;            /* the caller's connection: its participants, buffers, waits */
	uint32_t id;              /* its request id, handed back to done */
	jdone_fn *done;           /* NULL: a deferred answer is logged and dropped */
	void *arg;                /* the caller's, for done */
};

/* ------------------------------------------------------------- requests */

struct jcreate_args {
	const char *name;
	const char *model_config;    /* HF config.json text */
	const char *coordinator;     /* "local" or host:port */
	const char *token;
	uint32_t publish_interval;   /* K; 0 means 1 */
	const char *transport;       /* ucx (default) | storage | both */
	const char *storage_root;
	const char *storage_role;    /* writer (default) | reader */
	uint32_t keyframe_every;
	uint32_t keep_versions;
	uint32_t keep_keyframes;
	const char *storage_watch;   /* inotify (default) | poll */
	const char *detect;          /* adamw (default) | snapshot */
	uint32_t zstd_level;
};

struct jattach_args {
	const char *job;
	const char *token;
	const char *role;            /* source | sink */
	const char *layout;
	uint32_t rank;
	uint32_t replica;
	const uint64_t *buffers;     /* registered ids, one per layout buffer of the rank */
	size_t n_buffers;
	const char *shards;
	int rederives;               /* sinks: rebuilds the engine's derived copies */
};

/* One optimizer group of a publish or mark. */
struct jhparams {
	double lr, beta1, beta2, eps, weight_decay;
	const char *variant;         /* torch (default) | fused */
	int64_t step;                /* the group's own step count; 0: the request's */
	int unchanged;               /* its tensors did not step since the last */
};

struct jpublish_args {
	const char *job;
	uint64_t participant;
	uint64_t version;
	int64_t step;
	const struct jhparams *groups;
	size_t n_groups;
	int async;                   /* answered at once; wait_captured later */
	/* The engine's own (a relay reader's, job_storage.c): the last
	 * published version again, to the pairs it was never sent (sinks
	 * planned since), its source unchanged since; never a client's. */
	int again;
};

struct jmark_args {
	const char *job;
	uint64_t participant;
	int64_t step;
	const struct jhparams *groups;
	size_t n_groups;
};

/* wait (participant unused), wait_captured, wait_staged (version unused). */
struct jwait_args {
	const char *job;
	uint64_t participant;
	uint64_t version;
	uint32_t timeout_ms;         /* 0: answer now */
};

struct japply_args {
	const char *job;
	uint64_t participant;
	uint64_t version;            /* apply every staged version <= this */
};

/* -------------------------------------------------------------- results */

struct jcreate_res {
	int created;                 /* 0: it existed with the same parameters */
	int coordinator;             /* this daemon coordinates it */
	uint64_t spec_hash;
	uint32_t tensors;
};

struct jattach_res {
	uint64_t participant;
	uint64_t epoch;
	int complete;
};

struct jwait_res {
	uint64_t version;
	uint32_t sinks;
};

struct jstaged_res {
	uint64_t version;            /* newest staged */
	uint64_t applied;
};

/* A publish's counts (publish and wait_captured). */
struct jpublish_res {
	uint64_t version;
	uint32_t sinks;
	uint32_t dense;
	uint64_t changed;
	uint64_t elements;
	uint64_t bytes;
	double capture_ms;
	int captured;                /* the counts are the capture's (0: async accept) */
	const uint8_t *cuda_event;   /* device source: its capture event's handle, or NULL */
	size_t cuda_event_len;
};

struct jmark_res {
	uint64_t dirty;
	int gap;
};

struct japply_res {
	uint64_t version;            /* the version the buffers hold now */
	uint32_t applied;
	int checksum_ok;
	uint64_t checksum_failures;
	double apply_ms;
};

struct jquery_res {
	uint64_t applied;
	uint64_t staged;
	uint64_t checksum_failures;
};

struct jverify_sink {
	uint64_t participant;
	uint32_t rank;
	uint32_t replica;
	uint64_t version;
	const char *result;          /* ok | mismatch | unapplied | skipped */
	uint32_t buffers;
	uint32_t mismatched;
	const char *detail;
};

struct jverify_res {
	const char *job;
	uint32_t sinks, ok, mismatch;
	const struct jverify_sink *results;
	size_t n_results;
	char note[256];              /* answered now, nothing to check: why ("" otherwise) */
};

struct jresync_res {
	const char *job;
	uint32_t pairs;
	uint32_t remote;
};

/* dtectl jobs */
struct jjob_summary {
	const char *name;
	int coordinator;
	uint64_t epoch;
	int complete;
	uint32_t participants;
	uint32_t local_participants;
	uint64_t version;
};

struct jpart_info {
	uint64_t id;
	const char *role;
	const char *layout;
	uint32_t rank;
	uint32_t replica;
	const char *node;
	int local;
	uint64_t version;
	uint64_t staged;
	uint64_t checksum_failures;
	uint64_t relay_parent;    /* docs/SYNC.md, "Relay": 0 fed by the sources */
};

/* dtectl job */
struct jjob_info {
	const char *name;
	const char *coordinator;
	int is_coordinator;
	uint64_t spec_hash;
	uint32_t publish_interval;
	uint64_t epoch;
	int complete;
	const char **members;
	size_t n_members;
	struct jpart_info *participants;
	size_t n_participants;
	uint64_t entries;
	uint64_t versions;
	uint64_t refused;
	const char *transport;
	const char *storage_root;    /* NULL: no storage */
	const char *storage_role;
	int64_t storage_head;
	uint64_t storage_broken;
	const char *storage_error;
	const char *plan_error;      /* coordinator: why there is no plan (NULL: none) */
};

/* dtectl history */
struct jhist_entry {
	uint64_t version;
	int64_t step;
	const char *mode;            /* sparse | dense | mixed */
	double changed_pct;
	uint64_t bytes;
	double capture_ms;
	double transfer_ms;
	double apply_ms;
	const char *checksum;        /* ok | failed | pending | none */
	uint32_t sinks;
	const char *note;
	const char *reason;
};

/* A deferred answer's result: which operation it answers, and its fields. */
enum jop {
	JOP_ATTACH = 1,
	JOP_WAIT,
	JOP_WAIT_STAGED,
	JOP_WAIT_CAPTURED,        /* publish holds the capture's counts */
	JOP_PUBLISH,
	JOP_MARK,
	JOP_APPLY,
	JOP_VERIFY,
};

struct jres {
	enum jop op;
	union {
		struct jattach_res attach;
		struct jwait_res wait;
		struct jstaged_res staged;
		struct jpublish_res publish;
		struct jmark_res mark;
		struct japply_res apply;
		struct jverify_res verify;
	};
};

#endif
