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
	snprintf(c->compute_backend, sizeof(c->compute_backend), "auto");
	snprintf(c->peer_listen_address, sizeof(c->peer_listen_address), "0.0.0.0");
	c->peer_listen_port = 7370;
	c->peer_staging_bytes = DCONF_DEFAULT_STAGING;
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
	if (strcmp(key, "node_name") == 0)
		return copy_str(c->node_name, sizeof(c->node_name), v, p, key);
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
	snprintf(p->msg, sizeof(p->msg), "unknown key '%s' in [peer]", key);
	return 0;
}

static int on_entry(void *user, const char *section, const char *key, const char *value)
{
	struct parse_ctx *p = user;

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
	if (strcmp(section, "daemon") == 0)
		return daemon_key(p, key, value);
	if (strcmp(section, "peer") == 0)
		return peer_key(p, key, value);
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
