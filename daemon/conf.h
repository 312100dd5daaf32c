/* daemon/conf.h — dted configuration: conf/dted.conf plus command line.
 *
 * The file is INI (parsed by inih).  Every key has a default (documented in
 * conf/dted.conf); unknown sections or keys are errors, so a typo never
 * silently leaves a default in place.  Errors name file:line.
 */
#ifndef DTED_CONF_H
#define DTED_CONF_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#define DCONF_DEFAULT_PATH   "/etc/dted/dted.conf"
#define DCONF_DEFAULT_RUNDIR "/run/dted"
#define DCONF_SOCKET_NAME    "dted.sock"
#define DCONF_MAX_IDS        32
#define DCONF_MIN_FRAME      1024u
#define DCONF_MAX_FRAME      (256u * 1024u * 1024u)
#define DCONF_DEFAULT_STAGING (16ull << 20)
#define DCONF_MIN_STAGING    (1ull << 20)
#define DCONF_MAX_STAGING    (64ull << 30)
/* Payload part size (a source sends a pair's payload in parts of about
 * this many bytes while it still detects). */
#define DCONF_DEFAULT_PART   (256ull << 10)
/* mark_table_size: the side tables' budget (daemon/side_table.h). */
#define DCONF_DEFAULT_MARK_TABLE (256ull << 20)
#define DCONF_MAX_MARK_TABLE (1ull << 40)
#define DCONF_MIN_PART       (64ull << 10)
#define DCONF_MAX_PART       (1ull << 30)
/* metrics_listen = on: loopback only, this port. */
#define DCONF_METRICS_HOST   "127.0.0.1"
#define DCONF_METRICS_PORT   9370

/* Where a key's effective value came from (`dtectl config`). */
enum dconf_src {
	DCONF_SRC_DEFAULT = 0,
	DCONF_SRC_FILE,
	DCONF_SRC_FLAG,
};

/* Every key, [section] key order as in conf/dted.conf. */
enum dconf_key {
	DCONF_K_RUNTIME_DIR, DCONF_K_SOCKET, DCONF_K_SOCKET_GROUP, DCONF_K_ALLOW_UIDS,
	DCONF_K_ALLOW_GIDS, DCONF_K_LOG_LEVEL, DCONF_K_MAX_FRAME_BYTES, DCONF_K_MAX_CLIENTS,
	DCONF_K_COMPUTE_BACKEND, DCONF_K_NODE_NAME, DCONF_K_METRICS_LISTEN,
	DCONF_K_PEER_LISTEN_ADDRESS, DCONF_K_PEER_LISTEN_PORT, DCONF_K_PEER_ADVERTISE_ADDRESS,
	DCONF_K_PEER_STAGING_SIZE, DCONF_K_MAX_STAGED_VERSIONS, DCONF_K_VERIFY_FULL_EVERY,
	DCONF_K_PEER_PART_SIZE, DCONF_K_JOB_STATE_DIR, DCONF_K_MARK_TABLE_SIZE,
	DCONF_K_SYNC_MODE, DCONF_K_PEER_AUTH, DCONF_K_PEER_AUTH_OFF_JOBS,
	DCONF_K_PEER_RELAY_FANOUT, DCONF_K_PEER_RELAY_ROOTS, DCONF_K_PEER_RELAY_LAG,
	DCONF_K_PEER_RELAY_SHAPE, DCONF_K_PEER_RELAY_RATE_AGE,
	DCONF_K__COUNT
};

struct dconf {
	/* [daemon] */
	char     socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char     runtime_dir[PATH_MAX];
	int      log_level;            /* enum dlog_level */
	uint32_t max_frame_bytes;
	uint32_t max_clients;
	uid_t    allow_uids[DCONF_MAX_IDS];
	unsigned n_allow_uids;
	gid_t    allow_gids[DCONF_MAX_IDS];
	unsigned n_allow_gids;
	char     socket_group[64];     /* "" = leave the group as created */
	char     compute_backend[8];   /* auto | cpu | cuda */
	char     node_name[64];
	/* HTTP listener for GET /metrics, "host:port"; "" = off (default). */
	char     metrics_listen[96];
	/* Versions a sink may hold staged, unapplied (daemon/job_sink_stage.c). */
	uint32_t max_staged_versions;
	/* A sink's full checksum pass every N applies (job_sink_apply.c). */
	uint32_t verify_full_every;
	/* K > 1: bytes all sources' side tables of first-marked elements may
	 * hold (daemon/side_table.h); 0 = off (the union of marks is sent). */
	uint64_t mark_table_bytes;
	/* Where a daemon keeps the jobs created on it, so a restart gets them
	 * back (daemon/job_persist.c); "" = not kept (default). */
	char     job_state_dir[PATH_MAX];
	/* Sparse or dense per pair and version: "auto" (the cheaper by the
	 * running estimates, default) or "sparse" (wherever allowed). */
	char     sync_mode[8];
	/* [peer] — the UCX layer's listener (used by daemon/peer). */
	char     peer_listen_address[64];
	uint16_t peer_listen_port;
	/* host:port other daemons are told to connect to ("" = the listen
	 * address, or this host's first non-loopback IPv4 when that is a
	 * wildcard, with the bound port). */
	char     peer_advertise_address[96];
	uint64_t peer_staging_bytes;   /* UCX-registered receive staging */
	uint64_t peer_part_bytes;      /* payload part size */
	/* Peer auth (daemon/job_auth.h): on (1, default) or off for every
	 * job, and the jobs it is off for (comma separated names). */
	int      peer_auth;
	char     peer_auth_off_jobs[512];
	uint32_t peer_relay_fanout;    /* coordinator: relay trees; 0 off */
	uint32_t peer_relay_roots;     /* replicas of a rank the sources feed */
	uint32_t peer_relay_lag_ms;    /* coordinator: a relay this far behind is re-planned; 0 off */
	int      peer_relay_measured;  /* coordinator: relay_shape = measured (1) or fixed */
	uint32_t peer_relay_rate_age_ms; /* measured send rates older than this are not used */
	unsigned char src[DCONF_K__COUNT];  /* enum dconf_src per key */
};

/* Fill every field with its default. */
void dconf_defaults(struct dconf *c);

/* Parse `path` on top of what `c` holds.  On error returns -1 and writes
 * "file:line: what" to err; `c` may then be partly updated. */
int dconf_load_file(struct dconf *c, const char *path, char *err, size_t errlen);

/* Same, from a string; `name` stands in for the file name in errors. */
int dconf_load_string(struct dconf *c, const char *text, const char *name,
		      char *err, size_t errlen);

/* Settle derived values (socket defaults to runtime_dir/dted.sock, node_name
 * to the host name).  -1 with a message if the result is unusable. */
int dconf_finish(struct dconf *c, char *err, size_t errlen);

/* "host:port" or "[v6addr]:port" into its parts (host may be NULL to
 * only validate).  -1 when malformed or host does not fit. */
int dconf_parse_hostport(const char *s, char *host, size_t hostlen, uint16_t *port);

/* Key i's section and name; its effective value written to val (lists
 * comma separated, sizes in bytes); its source as "default", "file" or
 * "flag".  -1 when i is out of range. */
int dconf_describe(const struct dconf *c, unsigned i, const char **section, const char **key,
		   char *val, size_t vlen, const char **source);

/* A command-line flag set key i. */
void dconf_mark_flag(struct dconf *c, enum dconf_key i);

/* Whether a peer with these credentials may use the control socket:
 * root, the daemon's own uid, allow_uids, or allow_gids (primary or any of
 * the `ngroups` supplementary groups). */
int dconf_peer_allowed(const struct dconf *c, uid_t uid, gid_t gid,
		       const gid_t *groups, unsigned ngroups);

#endif
