/* daemon/conf.c — parse conf/dted.conf with inih into struct dconf. */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/conf.h"
#include "daemon/log.h"

/* Section and name of every key, in enum dconf_key order. */
static const struct {
	const char *section, *key;
} keytab[DCONF_K__COUNT] = {
	[DCONF_K_RUNTIME_DIR] = { "daemon", "runtime_dir" },
	[DCONF_K_SOCKET] = { "daemon", "socket" },
	[DCONF_K_SOCKET_GROUP] = { "daemon", "socket_group" },
	[DCONF_K_ALLOW_UIDS] = { "daemon", "allow_uids" },
	[DCONF_K_ALLOW_GIDS] = { "daemon", "allow_gids" },
	[DCONF_K_LOG_LEVEL] = { "daemon", "log_level" },
	[DCONF_K_MAX_FRAME_BYTES] = { "daemon", "max_frame_bytes" },
	[DCONF_K_MAX_CLIENTS] = { "daemon", "max_clients" },
	[DCONF_K_COMPUTE_BACKEND] = { "daemon", "compute_backend" },
	[DCONF_K_NODE_NAME] = { "daemon", "node_name" },
	[DCONF_K_METRICS_LISTEN] = { "daemon", "metrics_listen" },
	[DCONF_K_PEER_LISTEN_ADDRESS] = { "peer", "listen_address" },
	[DCONF_K_PEER_LISTEN_PORT] = { "peer", "listen_port" },
	[DCONF_K_PEER_ADVERTISE_ADDRESS] = { "peer", "advertise_address" },
	[DCONF_K_PEER_STAGING_SIZE] = { "peer", "staging_size" },
	[DCONF_K_MAX_STAGED_VERSIONS] = { "daemon", "max_staged_versions" },
	[DCONF_K_VERIFY_FULL_EVERY] = { "daemon", "verify_full_every" },
	[DCONF_K_PEER_PART_SIZE] = { "peer", "part_size" },
	[DCONF_K_JOB_STATE_DIR] = { "daemon", "job_state_dir" },
	[DCONF_K_MARK_TABLE_SIZE] = { "daemon", "mark_table_size" },
	[DCONF_K_SYNC_MODE] = { "daemon", "sync_mode" },
	[DCONF_K_PEER_AUTH] = { "peer", "auth" },
	[DCONF_K_PEER_AUTH_OFF_JOBS] = { "peer", "auth_off_jobs" },
	[DCONF_K_PEER_RELAY_FANOUT] = { "peer", "relay_fanout" },
	[DCONF_K_PEER_RELAY_ROOTS] = { "peer", "relay_roots" },
	[DCONF_K_PEER_RELAY_LAG] = { "peer", "relay_lag_ms" },
	[DCONF_K_PEER_RELAY_SHAPE] = { "peer", "relay_shape" },
	[DCONF_K_PEER_RELAY_RATE_AGE] = { "peer", "relay_rate_max_age_ms" },
};

struct parse_ctx {
	struct dconf *c;
	char msg[256];          /* first handler error, without file:line */
};

void dconf_defaults(struct dconf *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->runtime_dir, sizeof(c->runtime_dir), "%s", DCONF_DEFAULT_RUNDIR);
	c->log_level = DLOG_NOTICE;
	c->max_frame_bytes = 4u * 1024u * 1024u;
	c->max_clients = 1024;
	c->max_staged_versions = 8;
	c->verify_full_every = 16;
	c->mark_table_bytes = DCONF_DEFAULT_MARK_TABLE;
	snprintf(c->compute_backend, sizeof(c->compute_backend), "auto");
	snprintf(c->sync_mode, sizeof(c->sync_mode), "auto");
	c->peer_relay_roots = 1;
	c->peer_relay_lag_ms = 1000;
	c->peer_relay_measured = 1;
	c->peer_relay_rate_age_ms = 300000;
	snprintf(c->peer_listen_address, sizeof(c->peer_listen_address), "0.0.0.0");
	c->peer_listen_port = 7370;
	c->peer_staging_bytes = DCONF_DEFAULT_STAGING;
	c->peer_part_bytes = DCONF_DEFAULT_PART;
	c->peer_auth = 1;
}

static int copy_str(char *dst, size_t cap, const char *v, struct parse_ctx *p, const char *key)
{
	size_t n = strlen(v);

	if (n >= cap) {
		snprintf(p->msg, sizeof(p->msg), "%s: value longer than %zu bytes", key, cap - 1);
		return 0;
	}
	memcpy(dst, v, n + 1);
	return 1;
}

/* Decimal with an optional K/M/G (binary) suffix; the whole string must
 * parse and fit in [lo, hi]. */
static int parse_u64(const char *v, uint64_t lo, uint64_t hi, int suffix, uint64_t *out)
{
	char *end;
	unsigned long long x;

	if (!isdigit((unsigned char)*v))
		return 0;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno)
		return 0;
	if (suffix && *end) {
		unsigned shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 :
				 *end == 'G' || *end == 'g' ? 30 : 0;

		if (!shift || x > (UINT64_MAX >> shift))
			return 0;
		x <<= shift;
		end++;
	}
	if (*end || x < lo || x > hi)
		return 0;
	*out = x;
	return 1;
}

/* Comma/space separated list of names or numbers, resolved through
 * passwd/group so a typo'd user name is an error, not a silent no-op. */
static int parse_ids(const char *v, int is_group, unsigned *count, unsigned *ids,
		     struct parse_ctx *p, const char *key)
{
	char buf[512], *save = NULL, *tok;
	unsigned n = 0;

	if (strlen(v) >= sizeof(buf)) {
		snprintf(p->msg, sizeof(p->msg), "%s: list too long", key);
		return 0;
	}
	strcpy(buf, v);
	for (tok = strtok_r(buf, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
		uint64_t x;

		if (n == DCONF_MAX_IDS) {
			snprintf(p->msg, sizeof(p->msg), "%s: more than %d entries", key, DCONF_MAX_IDS);
			return 0;
		}
		if (parse_u64(tok, 0, UINT32_MAX - 1, 0, &x)) {
			ids[n++] = (unsigned)x;
		} else if (is_group) {
			struct group *g = getgrnam(tok);

			if (!g)
				goto unknown;
			ids[n++] = g->gr_gid;
		} else {
			struct passwd *pw = getpwnam(tok);

			if (!pw)
				goto unknown;
			ids[n++] = pw->pw_uid;
		}
		continue;
unknown:
		snprintf(p->msg, sizeof(p->msg), "%s: unknown %s '%s'", key,
			 is_group ? "group" : "user", tok);
		return 0;
	}
	*count = n;
	return 1;
}

static int bad_value(struct parse_ctx *p, const char *key, const char *v, const char *want)
{
	snprintf(p->msg, sizeof(p->msg), "%s: invalid value '%s' (%s)", key, v, want);
	return 0;
}

/* off | on (loopback, the default port) | PORT (loopback) | HOST:PORT.
 * Stored as "host:port", "" when off. */
static int metrics_listen(struct parse_ctx *p, const char *key, const char *v)
{
	struct dconf *c = p->c;
	uint64_t x;

	if (!*v || !strcmp(v, "off") || !strcmp(v, "no") || !strcmp(v, "false")) {
		c->metrics_listen[0] = '\0';
		return 1;
	}
	if (!strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true")) {
		snprintf(c->metrics_listen, sizeof(c->metrics_listen), "%s:%d", DCONF_METRICS_HOST,
			 DCONF_METRICS_PORT);
		return 1;
	}
	if (parse_u64(v, 1, 65535, 0, &x)) {
		snprintf(c->metrics_listen, sizeof(c->metrics_listen), "%s:%u", DCONF_METRICS_HOST,
			 (unsigned)x);
		return 1;
	}
	if (dconf_parse_hostport(v, NULL, 0, NULL) < 0)
		return bad_value(p, key, v, "off, on, PORT or HOST:PORT (IPv6 as [addr]:port)");
	return copy_str(c->metrics_listen, sizeof(c->metrics_listen), v, p, key);
}

static int daemon_key(struct parse_ctx *p, const char *key, const char *v)
{
	struct dconf *c = p->c;
	uint64_t x;

	if (strcmp(key, "socket") == 0) {
		if (*v && *v != '/')
			return bad_value(p, key, v, "an absolute path");
		return copy_str(c->socket, sizeof(c->socket), v, p, key);
	}
	if (strcmp(key, "runtime_dir") == 0) {
		if (*v != '/')
			return bad_value(p, key, v, "an absolute path");
		return copy_str(c->runtime_dir, sizeof(c->runtime_dir), v, p, key);
	}
	if (strcmp(key, "job_state_dir") == 0) {
		if (*v && *v != '/')
			return bad_value(p, key, v, "an absolute path or empty");
		return copy_str(c->job_state_dir, sizeof(c->job_state_dir), v, p, key);
	}
	if (strcmp(key, "log_level") == 0) {
		int l = dlog_level_parse(v);

		if (l < 0)
			return bad_value(p, key, v, "error|warn|notice|info|debug");
		c->log_level = l;
		return 1;
	}
	if (strcmp(key, "max_frame_bytes") == 0) {
		if (!parse_u64(v, DCONF_MIN_FRAME, DCONF_MAX_FRAME, 1, &x))
			return bad_value(p, key, v, "bytes in 1K..256M, K/M/G suffix allowed");
		c->max_frame_bytes = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "max_clients") == 0) {
		if (!parse_u64(v, 1, 65536, 0, &x))
			return bad_value(p, key, v, "1..65536");
		c->max_clients = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "max_staged_versions") == 0) {
		if (!parse_u64(v, 1, 4096, 0, &x))
			return bad_value(p, key, v, "1..4096");
		c->max_staged_versions = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "verify_full_every") == 0) {
		if (!parse_u64(v, 1, 1u << 20, 0, &x))
			return bad_value(p, key, v, "1..1048576");
		c->verify_full_every = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "mark_table_size") == 0) {
		if (!parse_u64(v, 0, DCONF_MAX_MARK_TABLE, 1, &x))
			return bad_value(p, key, v, "bytes in 0..1T, K/M/G suffix allowed (0 = off)");
		c->mark_table_bytes = x;
		return 1;
	}
	if (strcmp(key, "allow_uids") == 0)
		return parse_ids(v, 0, &c->n_allow_uids, (unsigned *)c->allow_uids, p, key);
	if (strcmp(key, "allow_gids") == 0)
		return parse_ids(v, 1, &c->n_allow_gids, (unsigned *)c->allow_gids, p, key);
	if (strcmp(key, "socket_group") == 0)
		return copy_str(c->socket_group, sizeof(c->socket_group), v, p, key);
	if (strcmp(key, "compute_backend") == 0) {
		if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda"))
			return bad_value(p, key, v, "auto|cpu|cuda");
		return copy_str(c->compute_backend, sizeof(c->compute_backend), v, p, key);
	}
	if (strcmp(key, "sync_mode") == 0) {
		if (strcmp(v, "auto") && strcmp(v, "sparse"))
			return bad_value(p, key, v, "auto|sparse");
		return copy_str(c->sync_mode, sizeof(c->sync_mode), v, p, key);
	}
	if (strcmp(key, "node_name") == 0)
		return copy_str(c->node_name, sizeof(c->node_name), v, p, key);
	if (strcmp(key, "metrics_listen") == 0)
		return metrics_listen(p, key, v);
	snprintf(p->msg, sizeof(p->msg), "unknown key '%s' in [daemon]", key);
	return 0;
}

static int peer_key(struct parse_ctx *p, const char *key, const char *v)
{
	struct dconf *c = p->c;
	uint64_t x;

	if (strcmp(key, "listen_address") == 0)
		return copy_str(c->peer_listen_address, sizeof(c->peer_listen_address), v, p, key);
	if (strcmp(key, "listen_port") == 0) {
		if (!parse_u64(v, 0, 65535, 0, &x))
			return bad_value(p, key, v, "0..65535");
		c->peer_listen_port = (uint16_t)x;
		return 1;
	}
	if (strcmp(key, "advertise_address") == 0) {
		if (*v && dconf_parse_hostport(v, NULL, 0, NULL) < 0)
			return bad_value(p, key, v, "HOST:PORT, IPv6 as [addr]:port");
		return copy_str(c->peer_advertise_address, sizeof(c->peer_advertise_address),
				v, p, key);
	}
	if (strcmp(key, "staging_size") == 0) {
		if (!parse_u64(v, DCONF_MIN_STAGING, DCONF_MAX_STAGING, 1, &x))
			return bad_value(p, key, v, "bytes in 1M..64G, K/M/G suffix allowed");
		c->peer_staging_bytes = x;
		return 1;
	}
	if (strcmp(key, "part_size") == 0) {
		if (!parse_u64(v, DCONF_MIN_PART, DCONF_MAX_PART, 1, &x))
			return bad_value(p, key, v, "bytes in 64K..1G, K/M/G suffix allowed");
		c->peer_part_bytes = x;
		return 1;
	}
	if (strcmp(key, "auth") == 0) {
		if (strcmp(v, "on") && strcmp(v, "off"))
			return bad_value(p, key, v, "on|off");
		c->peer_auth = !strcmp(v, "on");
		return 1;
	}
	if (strcmp(key, "auth_off_jobs") == 0)
		return copy_str(c->peer_auth_off_jobs, sizeof(c->peer_auth_off_jobs), v, p, key);
	if (strcmp(key, "relay_fanout") == 0) {
		if (!parse_u64(v, 0, 64, 0, &x))
			return bad_value(p, key, v, "0 (off)..64");
		c->peer_relay_fanout = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "relay_roots") == 0) {
		if (!parse_u64(v, 1, 4096, 0, &x))
			return bad_value(p, key, v, "1..4096");
		c->peer_relay_roots = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "relay_lag_ms") == 0) {
		if (!parse_u64(v, 0, 3600000, 0, &x))
			return bad_value(p, key, v, "0 (off)..3600000");
		c->peer_relay_lag_ms = (uint32_t)x;
		return 1;
	}
	if (strcmp(key, "relay_shape") == 0) {
		if (strcmp(v, "measured") && strcmp(v, "fixed"))
			return bad_value(p, key, v, "measured or fixed");
		c->peer_relay_measured = !strcmp(v, "measured");
		return 1;
	}
	if (strcmp(key, "relay_rate_max_age_ms") == 0) {
		if (!parse_u64(v, 1000, 86400000, 0, &x))
			return bad_value(p, key, v, "1000..86400000");
		c->peer_relay_rate_age_ms = (uint32_t)x;
		return 1;
	}
	snprintf(p->msg, sizeof(p->msg), "unknown key '%s' in [peer]", key);
	return 0;
}

static void mark_file(struct dconf *c, const char *section, const char *key)
{
	for (unsigned i = 0; i < DCONF_K__COUNT; i++)
		if (!strcmp(keytab[i].section, section) && !strcmp(keytab[i].key, key))
			c->src[i] = DCONF_SRC_FILE;
}

static int on_entry(void *user, const char *section, const char *key, const char *value)
{
	struct parse_ctx *p = user;
	int ok;

	/* inih keeps going after an error and reports the first line; keep
	 * the first message so it matches that line. */
	if (p->msg[0])
		return 0;
	if (!key) { /* section header alone (inih built to report them) */
		if (strcmp(section, "daemon") == 0 || strcmp(section, "peer") == 0)
			return 1;
		snprintf(p->msg, sizeof(p->msg), "unknown section [%s]", section);
		return 0;
	}
	if (strcmp(section, "daemon") == 0 || strcmp(section, "peer") == 0) {
		ok = section[0] == 'd' ? daemon_key(p, key, value) : peer_key(p, key, value);
		if (ok)
			mark_file(p->c, section, key);
		return ok;
	}
	if (*section)
		snprintf(p->msg, sizeof(p->msg), "unknown section [%s]", section);
	else
		snprintf(p->msg, sizeof(p->msg), "key '%s' outside any section", key);
	return 0;
}

static int report(int rc, struct parse_ctx *p, const char *name, char *err, size_t errlen)
{
	if (rc == 0)
		return 0;
	if (rc == -1)
		snprintf(err, errlen, "%s: %s", name, strerror(errno ? errno : ENOENT));
	else if (rc == -2)
		snprintf(err, errlen, "%s: out of memory", name);
	else
		snprintf(err, errlen, "%s:%d: %s", name, rc, p->msg[0] ? p->msg : "syntax error");
	return -1;
}

int dconf_load_file(struct dconf *c, const char *path, char *err, size_t errlen)
{
	struct parse_ctx p = { .c = c };
	int rc;

	errno = 0;
	rc = ini_parse(path, on_entry, &p);
	return report(rc, &p, path, err, errlen);
}

int dconf_load_string(struct dconf *c, const char *text, const char *name,
		      char *err, size_t errlen)
{
	struct parse_ctx p = { .c = c };

	return report(ini_parse_string(text, on_entry, &p), &p, name, err, errlen);
}

int dconf_finish(struct dconf *c, char *err, size_t errlen)
{
	if (!c->socket[0]) {
		int n = snprintf(c->socket, sizeof(c->socket), "%s/%s", c->runtime_dir,
				 DCONF_SOCKET_NAME);

		if (n < 0 || (size_t)n >= sizeof(c->socket)) {
			snprintf(err, errlen, "socket path %s/%s longer than %zu bytes",
				 c->runtime_dir, DCONF_SOCKET_NAME, sizeof(c->socket) - 1);
			return -1;
		}
	}
	if (!c->node_name[0] && gethostname(c->node_name, sizeof(c->node_name)) < 0)
		snprintf(c->node_name, sizeof(c->node_name), "localhost");
	c->node_name[sizeof(c->node_name) - 1] = '\0';
	return 0;
}

int dconf_peer_allowed(const struct dconf *c, uid_t uid, gid_t gid,
		       const gid_t *groups, unsigned ngroups)
{
	if (uid == 0 || uid == geteuid())
		return 1;
	for (unsigned i = 0; i < c->n_allow_uids; i++)
		if (c->allow_uids[i] == uid)
			return 1;
	for (unsigned i = 0; i < c->n_allow_gids; i++) {
		if (c->allow_gids[i] == gid)
			return 1;
		for (unsigned j = 0; j < ngroups; j++)
			if (c->allow_gids[i] == groups[j])
				return 1;
	}
	return 0;
}

int dconf_parse_hostport(const char *s, char *host, size_t hostlen, uint16_t *port)
{
	const char *colon, *h = s, *hend;
	char *end;
	unsigned long x;

	if (*s == '[') {
		hend = strchr(s, ']');
		if (!hend || hend[1] != ':')
			return -1;
		h = s + 1;
		colon = hend + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || memchr(s, ':', (size_t)(colon - s)))
			return -1;
		hend = colon;
	}
	if (hend == h || !isdigit((unsigned char)colon[1]))
		return -1;
	errno = 0;
	x = strtoul(colon + 1, &end, 10);
	if (errno || *end || x > 65535)
		return -1;
	if (host) {
		if ((size_t)(hend - h) >= hostlen)
			return -1;
		memcpy(host, h, (size_t)(hend - h));
		host[hend - h] = '\0';
	}
	if (port)
		*port = (uint16_t)x;
	return 0;
}

void dconf_mark_flag(struct dconf *c, enum dconf_key i)
{
	if ((unsigned)i < DCONF_K__COUNT)
		c->src[i] = DCONF_SRC_FLAG;
}

static void fmt_ids(char *val, size_t vlen, const unsigned *ids, unsigned n)
{
	size_t o = 0;

	val[0] = '\0';
	for (unsigned i = 0; i < n && o < vlen; i++) {
		int k = snprintf(val + o, vlen - o, "%s%u", i ? "," : "", ids[i]);

		if (k < 0)
			break;
		o += (size_t)k;
	}
}

int dconf_describe(const struct dconf *c, unsigned i, const char **section, const char **key,
		   char *val, size_t vlen, const char **source)
{
	static const char *const srcname[] = { "default", "file", "flag" };

	if (i >= DCONF_K__COUNT || !vlen)
		return -1;
	*section = keytab[i].section;
	*key = keytab[i].key;
	*source = c->src[i] < 3 ? srcname[c->src[i]] : "?";
	switch ((enum dconf_key)i) {
	case DCONF_K_RUNTIME_DIR: snprintf(val, vlen, "%s", c->runtime_dir); break;
	case DCONF_K_JOB_STATE_DIR: snprintf(val, vlen, "%s", c->job_state_dir); break;
	case DCONF_K_SOCKET: snprintf(val, vlen, "%s", c->socket); break;
	case DCONF_K_SOCKET_GROUP: snprintf(val, vlen, "%s", c->socket_group); break;
	case DCONF_K_ALLOW_UIDS:
		fmt_ids(val, vlen, (const unsigned *)c->allow_uids, c->n_allow_uids);
		break;
	case DCONF_K_ALLOW_GIDS:
		fmt_ids(val, vlen, (const unsigned *)c->allow_gids, c->n_allow_gids);
		break;
	case DCONF_K_LOG_LEVEL:
		snprintf(val, vlen, "%s", dlog_level_name((enum dlog_level)c->log_level));
		break;
	case DCONF_K_MAX_FRAME_BYTES: snprintf(val, vlen, "%u", c->max_frame_bytes); break;
	case DCONF_K_MAX_CLIENTS: snprintf(val, vlen, "%u", c->max_clients); break;
	case DCONF_K_MAX_STAGED_VERSIONS: snprintf(val, vlen, "%u", c->max_staged_versions); break;
	case DCONF_K_VERIFY_FULL_EVERY: snprintf(val, vlen, "%u", c->verify_full_every); break;
	case DCONF_K_COMPUTE_BACKEND: snprintf(val, vlen, "%s", c->compute_backend); break;
	case DCONF_K_SYNC_MODE: snprintf(val, vlen, "%s", c->sync_mode); break;
	case DCONF_K_NODE_NAME: snprintf(val, vlen, "%s", c->node_name); break;
	case DCONF_K_METRICS_LISTEN:
		snprintf(val, vlen, "%s", c->metrics_listen[0] ? c->metrics_listen : "off");
		break;
	case DCONF_K_PEER_LISTEN_ADDRESS: snprintf(val, vlen, "%s", c->peer_listen_address); break;
	case DCONF_K_PEER_LISTEN_PORT: snprintf(val, vlen, "%u", c->peer_listen_port); break;
	case DCONF_K_PEER_ADVERTISE_ADDRESS:
		snprintf(val, vlen, "%s", c->peer_advertise_address);
		break;
	case DCONF_K_PEER_STAGING_SIZE:
		snprintf(val, vlen, "%llu", (unsigned long long)c->peer_staging_bytes);
		break;
	case DCONF_K_PEER_PART_SIZE:
		snprintf(val, vlen, "%llu", (unsigned long long)c->peer_part_bytes);
		break;
	case DCONF_K_MARK_TABLE_SIZE:
		snprintf(val, vlen, "%llu", (unsigned long long)c->mark_table_bytes);
		break;
	case DCONF_K_PEER_AUTH: snprintf(val, vlen, "%s", c->peer_auth ? "on" : "off"); break;
	case DCONF_K_PEER_AUTH_OFF_JOBS: snprintf(val, vlen, "%s", c->peer_auth_off_jobs); break;
	case DCONF_K_PEER_RELAY_FANOUT: snprintf(val, vlen, "%u", c->peer_relay_fanout); break;
	case DCONF_K_PEER_RELAY_ROOTS: snprintf(val, vlen, "%u", c->peer_relay_roots); break;
	case DCONF_K_PEER_RELAY_LAG: snprintf(val, vlen, "%u", c->peer_relay_lag_ms); break;
	case DCONF_K_PEER_RELAY_SHAPE:
		snprintf(val, vlen, "%s", c->peer_relay_measured ? "measured" : "fixed");
		break;
	case DCONF_K_PEER_RELAY_RATE_AGE:
		snprintf(val, vlen, "%u", c->peer_relay_rate_age_ms);
		break;
	case DCONF_K__COUNT:
		return -1;
	}
	return 0;
}
