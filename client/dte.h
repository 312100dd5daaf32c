/* client/dte.h — libdte: talk to the local dted over its control socket.
 *
 * One handle is one connection.  Every call on a handle is one request and
 * its reply, serialized by a per-handle mutex, so a handle may be shared by
 * threads.  Functions return DTE_OK (0) or a negative enum dte_err and write
 * their outputs only on success; dte_errmsg() tells what went wrong.
 *
 * Structs filled by the library start with `size` (the caller sets it to
 * sizeof the struct it was compiled with) and `field_mask` (the library
 * sets a bit for every field it filled), so fields can be appended without
 * breaking callers built against an older header.
 */
#ifndef DTE_H
#define DTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DTE_DEFAULT_SOCKET "/run/dted/dted.sock"
#define DTE_SOCKET_ENV     "DTE_SOCKET"

typedef struct dte dte_t;

enum dte_err {
	DTE_OK = 0,
	DTE_ERR_INVAL = -1,            /* bad argument to a libdte call */
	DTE_ERR_NOMEM = -2,
	DTE_ERR_UNREACHABLE = -3,      /* no daemon listening at the path */
	DTE_ERR_IO = -4,               /* connection broke or was closed */
	DTE_ERR_TIMEOUT = -5,
	DTE_ERR_PROTOCOL = -6,         /* malformed frame or reply */
	DTE_ERR_VERSION = -7,          /* no protocol version in common */
	DTE_ERR_DENIED = -8,           /* not allowed to use this daemon */
	DTE_ERR_UNKNOWN_COMMAND = -9,  /* daemon does not know the request */
	DTE_ERR_BAD_REQUEST = -10,     /* daemon refused the arguments */
	DTE_ERR_NOT_FOUND = -11,
	DTE_ERR_BUSY = -12,
	DTE_ERR_UNIMPLEMENTED = -13,
	DTE_ERR_INTERNAL = -14,        /* daemon-side failure */
};

/* Static text for an error code. */
const char *dte_strerror(int err);

/* Connect to dted and negotiate the protocol (hello).  `path` NULL means
 * $DTE_SOCKET, else DTE_DEFAULT_SOCKET.  On failure *out is untouched and
 * dte_errmsg(NULL) describes the failure (per thread). */
int dte_connect(const char *path, dte_t **out);
void dte_close(dte_t *h);

/* Last error on this handle (NULL: this thread's last dte_connect failure).
 * Valid until the next call on the handle. */
const char *dte_errmsg(const dte_t *h);

/* Send/receive timeout per request, in ms (default 30000; 0 = none). */
int dte_set_timeout(dte_t *h, unsigned ms);

enum dte_hello_field {
	DTE_HELLO_VERSION = 1u << 0,
	DTE_HELLO_DAEMON_RANGE = 1u << 1,
	DTE_HELLO_DAEMON_VERSION = 1u << 2,
	DTE_HELLO_NODE_NAME = 1u << 3,
};

struct dte_hello_info {
	size_t   size;                 /* in: sizeof(struct dte_hello_info) */
	uint64_t field_mask;           /* out: DTE_HELLO_* filled */
	uint32_t version;              /* negotiated protocol version */
	uint32_t daemon_min, daemon_max;
	char     daemon_version[32];
	char     node_name[64];
};

/* Negotiate again (dte_connect already did once); `out` may be NULL. */
int dte_hello(dte_t *h, struct dte_hello_info *out);

/* One round trip; *rtt_ns (may be NULL) gets its duration. */
int dte_ping(dte_t *h, uint64_t *rtt_ns);

enum dte_status_field {
	DTE_STATUS_VERSION = 1u << 0,
	DTE_STATUS_PROTOCOL = 1u << 1,
	DTE_STATUS_PID = 1u << 2,
	DTE_STATUS_UPTIME = 1u << 3,
	DTE_STATUS_NODE_NAME = 1u << 4,
	DTE_STATUS_BACKEND = 1u << 5,
	DTE_STATUS_JOBS = 1u << 6,
	DTE_STATUS_PEERS = 1u << 7,
	DTE_STATUS_CLIENTS = 1u << 8,
	DTE_STATUS_REFUSED = 1u << 9,
	DTE_STATUS_LOG_LEVEL = 1u << 10,
	DTE_STATUS_REQUESTS = 1u << 11,
	DTE_STATUS_BAD_FRAMES = 1u << 12,
	DTE_STATUS_METRICS = 1u << 13,     /* metrics_address, metrics_error */
};

struct dte_status {
	size_t   size;                 /* in: sizeof(struct dte_status) */
	uint64_t field_mask;           /* out: DTE_STATUS_* filled */
	char     version[32];          /* dted's version */
	uint32_t protocol;             /* protocol version of this connection */
	int32_t  pid;
	uint64_t uptime_s;
	char     node_name[64];
	char     backend[16];          /* cpu | cuda */
	uint32_t jobs;
	uint32_t peers;
	uint32_t clients;              /* control connections, this one too */
	uint64_t refused;              /* connections refused by credentials */
	char     log_level[16];
	uint64_t requests;
	uint64_t bad_frames;
	char     metrics_address[80];  /* metrics HTTP listener as bound, "" off */
	char     metrics_error[160];   /* why metrics_listen is not served */
	/* New fields go here, with a new DTE_STATUS_* bit. */
};

int dte_status(dte_t *h, struct dte_status *out);

/* ------------------------------------------------------------------------
 * Same-cluster sync (docs/SYNC.md).  A source (trainer rank) and a sink
 * (inference rank) register their buffers, attach to a job with a layout
 * and a rank, then publish / wait (source) or wait_staged / apply (sink).
 * Buffers and participants belong to the handle's connection and are
 * released when it closes.
 * ---------------------------------------------------------------------- */

enum dte_dtype { DTE_FP32 = 0, DTE_BF16 = 1 };
enum dte_role { DTE_SOURCE = 0, DTE_SINK = 1 };
enum dte_adamw { DTE_ADAMW_TORCH = 0, DTE_ADAMW_FUSED = 1 };

/* Host buffer: `fd` is a memfd sealed with F_SEAL_SHRINK; the daemon maps
 * [offset, offset + length * elemsize) of it.  The caller keeps its fd. */
int dte_buffer_register_fd(dte_t *h, int fd, uint64_t offset, uint64_t length, int dtype,
			   const char *name, uint64_t *id);
/* GPU buffer: a CUDA IPC memory handle (+ offset into that allocation) and
 * the IPC event the trainer records after each step (may be NULL). */
int dte_buffer_register_cuda(dte_t *h, const void *ipc_handle, size_t handle_len,
			     const void *ipc_event, size_t event_len, int device, uint64_t offset,
			     uint64_t length, int dtype, const char *name, uint64_t *id);
int dte_buffer_unregister(dte_t *h, uint64_t id);

struct dte_job_params {
	size_t      size;               /* in: sizeof(struct dte_job_params) */
	const char *name;
	const char *model_config;       /* HF config.json text */
	const char *coordinator;        /* "local" or host:port; NULL = local */
	const char *token;
	uint32_t    publish_interval;   /* K; 0 = 1 */
	const char *transport;          /* NULL = "ucx"; "storage", "both" */
	/* Storage transport (docs/STORAGE.md); NULL / 0 take the defaults. */
	const char *storage_root;       /* directory both clusters mount */
	const char *storage_role;       /* "writer" (default) | "reader"; with transport
					 * "both", a reader is its cluster's relay reader */
	uint32_t    keyframe_every;     /* N (10) */
	uint32_t    keep_versions;      /* K (32) */
	uint32_t    keep_keyframes;     /* M (2) */
	const char *storage_watch;      /* reader: "inotify" (default) | "poll" */
	const char *detect;             /* NULL = "adamw"; "snapshot" (docs/SYNC.md) */
	uint32_t    zstd_level;         /* remote payloads: 0 raw (default), 1..3 zstd */
};

/* *created (may be NULL): 0 when the job existed with these parameters. */
int dte_job_create(dte_t *h, const struct dte_job_params *p, int *created);

struct dte_attach_params {
	size_t          size;           /* in: sizeof(struct dte_attach_params) */
	const char     *job;
	const char     *token;
	int             role;           /* enum dte_role */
	const char     *layout;         /* "megatron:tp=2", "sglang:tp=2", ... */
	uint32_t        rank;
	uint32_t        replica;        /* sinks */
	const uint64_t *buffers;        /* one per layout buffer of the rank, by id */
	size_t          nbuffers;
	/* Sources of mcore:/fsdp2: layouts: the rank's shard table, one line
	 * "rank group lo hi name d0[,d1..]" per shard; shard k's param,
	 * exp_avg, exp_avg_sq are buffers 3k, 3k+1, 3k+2.  NULL otherwise. */
	const char     *shards;
	/* Sinks: DTE_ATTACH_REDERIVES when this sink rebuilds, after every
	 * apply, what its engine derives from the weights (multi-head latent
	 * attention: SGLang's w_kc/w_vc, vLLM's W_UK/W_UV from kv_b_proj;
	 * dte.integrations.vllm does).  A sink of an MLA model without it is
	 * refused at attach: it would serve stale attention.  Read only when
	 * size covers it. */
	uint32_t        flags;
};

/* Returns once the coordinator planned with the participant. */
#define DTE_ATTACH_REDERIVES (1u << 0)

int dte_attach(dte_t *h, const struct dte_attach_params *p, uint64_t *participant);
int dte_detach(dte_t *h, const char *job, uint64_t participant);

/* One optimizer group's hyper-parameters; the array index is the layout's
 * group id (0: with weight decay, 1: without). */
struct dte_hparams {
	double lr;                      /* the lr the step used */
	double beta1, beta2, eps, weight_decay;
	int    variant;                 /* enum dte_adamw */
};

enum dte_publish_field {
	DTE_PUBLISH_COUNTS = 1u << 0,   /* sinks, dense */
	DTE_PUBLISH_SIZES = 1u << 1,    /* changed, elements, bytes */
	DTE_PUBLISH_TIME = 1u << 2,
	DTE_PUBLISH_CAPTURED = 1u << 3, /* captured */
	DTE_PUBLISH_CUDA_EVENT = 1u << 4, /* cuda_event, cuda_event_len */
};

struct dte_publish_info {
	size_t   size;                  /* in: sizeof(struct dte_publish_info) */
	uint64_t field_mask;            /* out: DTE_PUBLISH_* filled */
	uint32_t sinks, dense;
	uint64_t changed, elements, bytes;
	double   capture_ms;
	int      captured;              /* DTE_PUBLISH_CAPTURED: 1 once the capture ended and
					 * the counts above are its; 0: an async accept */
	/* DTE_PUBLISH_CUDA_EVENT, sources with CUDA buffers: the daemon's
	 * capture event (cudaIpcEventHandle_t), recorded after each capture's
	 * kernels; the trainer's stream waits on it before its next step. */
	uint8_t  cuda_event[64];
	uint32_t cuda_event_len;
};

/* Captures version `version` after optimizer step `step` and returns; the
 * trainer may step again.  info may be NULL. */
int dte_publish(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		int64_t step, const struct dte_hparams *groups, size_t ngroups,
		struct dte_publish_info *info);
/* After every optimizer step when publishing every K > 1 steps. */
int dte_mark(dte_t *h, const char *job, uint64_t participant, int64_t step,
	     const struct dte_hparams *groups, size_t ngroups, uint64_t *dirty);
/* The same with a step count per group (registered shards, where every
 * tensor keeps its own): group_steps[i] > 0 is group i's count after the
 * step, 0 the request's `step`, DTE_GROUP_UNCHANGED says its tensors did
 * not step since the last publish or mark (a grad of None: nothing of
 * them changed).  group_steps may be NULL. */
#define DTE_GROUP_UNCHANGED (-1)
#define DTE_MAX_GROUPS 65536
int dte_publish_steps(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		      int64_t step, const struct dte_hparams *groups, const int64_t *group_steps,
		      size_t ngroups, struct dte_publish_info *info);
int dte_mark_steps(dte_t *h, const char *job, uint64_t participant, int64_t step,
		   const struct dte_hparams *groups, const int64_t *group_steps, size_t ngroups,
		   uint64_t *dirty);
/* Publish that does not stop the trainer (protocol 2).  With
 * DTE_PUBLISH_ASYNC the call returns once the daemon accepted the version
 * (arguments checked, buffers pinned, capture queued): info->captured is
 * 0 and the counts come from dte_wait_captured.  The trainer may run its
 * next forward and backward meanwhile, but must call dte_wait_captured
 * before it writes θ, m or v again (its next optimizer step).  On a
 * daemon that speaks only protocol 1 the flag is ignored: the call
 * returns after the capture, as dte_publish_steps does.
 *
 * The async publish is pipelined: dte_publish_ex writes the request and
 * returns without reading the daemon's answer (info: only captured = 0,
 * field_mask DTE_PUBLISH_CAPTURED).  The handle keeps the publish pending
 * (up to 64 at a time) and its next call that uses the connection, of any
 * kind, first reads every pending answer in order, so each call still gets
 * its own reply.  DTE_OK from it therefore means "sent", not "accepted":
 * a refusal (unknown job or participant, a version not after the last, a
 * capture still running, ...) is returned, with the daemon's reason in
 * dte_errmsg, by dte_wait_captured for that job, participant and version
 * (0: the newest pending), which then sends nothing; other calls in
 * between succeed or fail on their own.  The capture event
 * (DTE_PUBLISH_CUDA_EVENT) comes in dte_wait_captured's info.  A broken
 * connection fails the next call.  Thread-safety as for every call: the
 * pending answers belong to the handle, whichever thread reads them. */
enum dte_publish_flags {
	DTE_PUBLISH_ASYNC = 1u << 0,
};
int dte_publish_ex(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		   int64_t step, const struct dte_hparams *groups, const int64_t *group_steps,
		   size_t ngroups, unsigned flags, struct dte_publish_info *info);
/* Returns once the capture of `version` (0: the participant's last
 * publish) no longer reads the trainer's buffers, with its counts in info
 * (may be NULL); the capture's own error (a step the optimizer state does
 * not match, ...) and a pipelined async publish's refusal are returned
 * here with the daemon's message.
 * DTE_ERR_TIMEOUT after timeout_ms (the capture still reads: do not step).
 * DTE_OK at once on a protocol-1 daemon (every publish was synchronous). */
int dte_wait_captured(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		      unsigned timeout_ms, struct dte_publish_info *info);
/* Returns once every sink settled `version`: 0 when every one applied it;
 * DTE_ERR_INTERNAL (the daemon's message names the sink) when one failed
 * it, answered only once every other sink applied or failed it too, so
 * that every sink that applies `version` holds it when dte_wait returns;
 * DTE_ERR_TIMEOUT when a sink did not answer in timeout_ms and none failed
 * (docs/SYNC.md, WAIT). */
int dte_wait(dte_t *h, const char *job, uint64_t version, unsigned timeout_ms);

/* Sink: the newest staged version (newer than the applied one). */
int dte_wait_staged(dte_t *h, const char *job, uint64_t participant, unsigned timeout_ms,
		    uint64_t *version);

enum dte_apply_field {
	DTE_APPLY_VERSION = 1u << 0,
	DTE_APPLY_CHECKSUM = 1u << 1,   /* checksum_ok, checksum_failures */
	DTE_APPLY_TIME = 1u << 2,
};

struct dte_apply_info {
	size_t   size;                  /* in: sizeof(struct dte_apply_info) */
	uint64_t field_mask;
	uint64_t version;               /* what the buffers hold now */
	uint32_t applied;               /* staged versions applied */
	int      checksum_ok;
	uint64_t checksum_failures;
	double   apply_ms;
};

/* Applies every staged version <= version, in order, and verifies. */
int dte_apply(dte_t *h, const char *job, uint64_t participant, uint64_t version,
	      struct dte_apply_info *info);
int dte_query_version(dte_t *h, const char *job, uint64_t participant, uint64_t *applied,
		      uint64_t *staged);

/* No daemon needed: the buffers rank `rank` of a layout expects, so a
 * client can allocate matching memory.  Writes min(cap, count) entries and
 * the count to *n; err (may be NULL) says why on DTE_ERR_INVAL. */
struct dte_layout_buffer_info {
	uint32_t id;
	/* Elements, as the client registers the buffer: 16-bit units for a
	 * sink's FP8 weight (its float8_e4m3fn codes two to a unit: bytes / 2)
	 * and its FP32 weight_scale_inv (two units a scale), with -1 for an
	 * FP8 weight of odd length (sglang:/vllm: fp8=1, issue 33). */
	int64_t  length;
	char     name[96];
};

int dte_layout_buffers(const char *model_config, const char *layout, int role, uint32_t rank,
		       struct dte_layout_buffer_info *out, size_t cap, size_t *n, char *err,
		       size_t errlen);

/* No daemon needed: where each runtime tensor of rank `rank` lives, so a
 * trainer or server can allocate its tensors at exactly those places.
 * Names are the runtime's (Megatron-Core: decoder.layers.0.self_attention.
 * linear_qkv.weight; SGLang/vLLM: model.layers.0.self_attn.qkv_proj.weight;
 * FSDP2: the HF name), shapes are local (row-major), `buffer` is the
 * layout buffer id (for a source: the param buffer; exp_avg and exp_avg_sq
 * use the same offset in theirs) and `offset` is in elements from the
 * buffer's start.  With Megatron's distributed optimizer over dp > 1 a
 * tensor can straddle DP shards: its offset is relative to this rank's
 * shard and may lie outside it.  Writes min(cap, count) entries and the
 * count to *n; json: layouts describe no tensors (count 0). */
struct dte_layout_tensor_info {
	uint32_t buffer;
	uint32_t ndim;
	int64_t  offset;                /* elements (a sink's FP32 tensor: 16-bit units) */
	int64_t  shape[6];
	char     name[96];
};

int dte_layout_tensors(const char *model_config, const char *layout, int role, uint32_t rank,
		       struct dte_layout_tensor_info *out, size_t cap, size_t *n, char *err,
		       size_t errlen);

/* No daemon needed: the model's tensors the engines hold in FP32 (GLM-4.5's
 * router weight, the MoE routers' e_score_correction_bias), by canonical
 * (Hugging Face) name.  dted moves them as their exact bits, as 16-bit
 * halves: a sink registers such a parameter as 16-bit units, twice its
 * elements (dte_layout_buffers' length and dte_layout_tensors' offset
 * count those units), and a source may hold one without optimizer state
 * (an HF buffer): it is sent whole every version.  Writes min(cap, count)
 * names and the count to *n. */
struct dte_model_tensor_name {
	char name[128];
};

int dte_model_fp32_tensors(const char *model_config, struct dte_model_tensor_name *out, size_t cap,
			   size_t *n, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
