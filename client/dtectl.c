/* client/dtectl.c — operator CLI for dted, built on libdte.
 *
 * Commands, their usage and help come from proto/cmdtab.h; daemon commands
 * without a printer here are sent generically (arguments become request
 * fields) and their replies printed field by field (client/msgfmt.h).
 * Exit status (dtectl(8), EXIT STATUS): 0 ok, 1 the daemon refused or
 * failed (or `wait` found no sink to wait for), 2 usage, 3 the daemon could
 * not be reached (or the connection broke), 4 timed out (a `wait` deadline,
 * or the daemon did not answer in time).  Under --json a failure also prints
 * {"error", "code", "message"} on stdout.
 */
#include <inttypes.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>
#include "client/dte_internal.h"
#include "client/msgfmt.h"
#include "daemon/layout/plan_cli.h"
#include "daemon/storage/storage_cli.h"
#include "proto/cmdtab.h"

enum { EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_TIMEOUT = 4 };

static int g_json;   /* --json: failures print a JSON object on stdout too */

struct ctx {
	const char *socket;
	int json;
	const struct dte_cmd *cmd;
	int argc;                 /* command arguments, after the name */
	char **argv;
};

/* The exit status of a libdte error (dtectl(8), EXIT STATUS). */
static int exit_of(int err)
{
	switch (err) {
	case DTE_ERR_UNREACHABLE: case DTE_ERR_IO:
		return EXIT_UNREACHABLE;
	case DTE_ERR_TIMEOUT:
		return EXIT_TIMEOUT;
	default:
		return EXIT_FAILED;
	}
}

/* A stable one-word name of a libdte error: --json's "error". */
static const char *error_name(int err)
{
	switch (err) {
	case DTE_ERR_INVAL: return "invalid";
	case DTE_ERR_NOMEM: return "no_memory";
	case DTE_ERR_UNREACHABLE: return "unreachable";
	case DTE_ERR_IO: return "connection";
	case DTE_ERR_TIMEOUT: return "timeout";
	case DTE_ERR_PROTOCOL: return "protocol";
	case DTE_ERR_VERSION: return "version";
	case DTE_ERR_DENIED: return "denied";
	case DTE_ERR_UNKNOWN_COMMAND: return "unknown_command";
	case DTE_ERR_BAD_REQUEST: return "bad_request";
	case DTE_ERR_NOT_FOUND: return "not_found";
	case DTE_ERR_BUSY: return "busy";
	case DTE_ERR_UNIMPLEMENTED: return "unimplemented";
	case DTE_ERR_INTERNAL: return "internal";
	default: return "failed";
	}
}

/* Reports a failure: the message on stderr, and under --json also
 * {"error": name, "code": exit status, "message": msg} on stdout. */
static int report(int code, const char *name, const char *msg)
{
	fprintf(stderr, "dtectl: %s\n", msg);
	if (g_json) {
		json_t *j = json_pack("{s:s, s:i, s:s}", "error", name, "code", code,
				      "message", msg);
		char *t = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;

		if (t)
			printf("%s\n", t);
		free(t);
		json_decref(j);
	}
	return code;
}

static int fail(int err, const char *msg)
{
	return report(exit_of(err), error_name(err), msg && *msg ? msg : dte_strerror(err));
}

/* A usage error: exit 2 (a JSON object too under --json). */
static int usage_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_fail(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return report(EXIT_USAGE, "usage", msg);
}

static void emit_json(json_t *j)
{
	char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);

	if (s)
		printf("%s\n", s);
	free(s);
	json_decref(j);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: dtectl [--socket PATH] [--json] COMMAND [ARGS]\n\n"
		   "  --socket PATH  control socket (default $%s, else %s)\n"
		   "  --json         machine-readable output (errors too)\n"
		   "  --help         this list; `dtectl help COMMAND` or `dtectl COMMAND --help`\n"
		   "                 for one command\n"
		   "  --version      dtectl's version and protocol\n\ncommands:\n",
		DTE_SOCKET_ENV, DTE_DEFAULT_SOCKET);
	fprintf(f, "  %-10s %s\n", "help", "list commands, or `help COMMAND` for its usage");
	for (size_t i = 0; i < DTE_CMD__COUNT; i++)
		if (!(dte_cmdtab[i].flags & DTE_CMD_HIDDEN))
			fprintf(f, "  %-10s %s\n", dte_cmdtab[i].name, dte_cmdtab[i].summary);
	fprintf(f, "\nexit status: 0 ok, 1 refused or failed, 2 usage, 3 daemon unreachable,\n"
		   "4 timed out (dtectl(8))\n");
}

/* Arguments a command cannot do without: the leading upper-case words of
 * its usage line, before the first optional `[...]`. */
static int required_args(const struct dte_cmd *cmd)
{
	const char *p = strchr(cmd->usage, ' ');
	int n = 0;

	while (p && *p) {
		const char *e;
		int upper = 1;

		while (*p == ' ')
			p++;
		if (!*p || *p == '[' || *p == '(')
			break;
		for (e = p; *e && *e != ' '; e++)
			if (!((*e >= 'A' && *e <= 'Z') || *e == '_'))
				upper = 0;
		n += upper;
		p = e;
	}
	return n;
}

/* Extra lines of `help CMD` beyond the table's usage and summary. */
static const char *help_more(const char *name)
{
	if (!strcmp(name, "wait"))
		return "  exit 0 once every sink fed from this daemon applied VERSION; 1 when a sink\n"
		       "  failed it or no sink is fed from this daemon; 4 when TIMEOUT_MS (default 0:\n"
		       "  answer at once) runs out.  While waiting, which sink is behind and by how\n"
		       "  many versions goes to stderr each second (-q, --quiet: not).\n";
	if (!strcmp(name, "history"))
		return "  one line of key=value words per version, oldest first; --json: a versions list\n";
	return NULL;
}

static int help_for(const char *name)
{
	const struct dte_cmd *cmd;
	const char *more;

	if (!strcmp(name, "help")) {
		printf("usage: dtectl help [COMMAND]\n"
		       "  list the commands, or print one command's usage (also `dtectl COMMAND --help`)\n");
		return 0;
	}
	cmd = dte_cmd_by_name(name);
	if (!cmd)
		return usage_fail("unknown command '%s' (try `dtectl help`)", name);
	printf("usage: dtectl [--socket PATH] [--json] %s\n  %s\n", cmd->usage, cmd->summary);
	if ((more = help_more(name)))
		fputs(more, stdout);
	return 0;
}

static int cmd_help(struct ctx *c)
{
	if (c->argc == 0) {
		usage(stdout);
		return 0;
	}
	if (c->argc > 1)
		return usage_fail("help takes one command name (usage: dtectl help [COMMAND])");
	return help_for(c->argv[0]);
}

static int connect_or_fail(struct ctx *c, dte_t **h)
{
	int rc = dte_connect(c->socket, h);

	return rc < 0 ? fail(rc, dte_errmsg(NULL)) : 0;
}

static int no_args(struct ctx *c)
{
	if (c->argc == 0)
		return 0;
	return usage_fail("%s takes no arguments (usage: dtectl %s)", c->cmd->name,
			  c->cmd->usage);
}

static int cmd_hello(struct ctx *c)
{
	struct dte_hello_info hi = { .size = sizeof(hi) };
	dte_t *h;
	int rc = no_args(c);

	if (rc || (rc = connect_or_fail(c, &h)))
		return rc;
	rc = dte_hello(h, &hi);
	if (rc < 0) {
		rc = fail(rc, dte_errmsg(h));
		dte_close(h);
		return rc;
	}
	if (c->json)
		emit_json(json_pack("{s:i, s:i, s:i, s:s, s:s}", "protocol", (json_int_t)hi.version,
				    "daemon_min", (json_int_t)hi.daemon_min, "daemon_max",
				    (json_int_t)hi.daemon_max, "version", hi.daemon_version,
				    "node_name", hi.node_name));
	else
		printf("protocol: %u\ndaemon_min: %u\ndaemon_max: %u\nversion: %s\nnode_name: %s\n",
		       hi.version, hi.daemon_min, hi.daemon_max, hi.daemon_version, hi.node_name);
	dte_close(h);
	return 0;
}

static int cmd_ping(struct ctx *c)
{
	uint64_t rtt;
	dte_t *h;
	int rc = no_args(c);

	if (rc || (rc = connect_or_fail(c, &h)))
		return rc;
	rc = dte_ping(h, &rtt);
	if (rc < 0) {
		rc = fail(rc, dte_errmsg(h));
		dte_close(h);
		return rc;
	}
	if (c->json)
		emit_json(json_pack("{s:b, s:I}", "ok", 1, "rtt_us", (json_int_t)(rtt / 1000)));
	else
		printf("pong\nrtt_us: %llu\n", (unsigned long long)(rtt / 1000));
	dte_close(h);
	return 0;
}

static int cmd_status(struct ctx *c)
{
	struct dte_status st = { .size = sizeof(st) };
	dte_t *h;
	int rc = no_args(c);

	if (rc || (rc = connect_or_fail(c, &h)))
		return rc;
	rc = dte_status(h, &st);
	if (rc < 0) {
		rc = fail(rc, dte_errmsg(h));
		dte_close(h);
		return rc;
	}
	if (c->json) {
		json_t *j = json_object();

		json_object_set_new(j, "version", json_string(st.version));
		json_object_set_new(j, "protocol", json_integer(st.protocol));
		json_object_set_new(j, "pid", json_integer(st.pid));
		json_object_set_new(j, "uptime_s", json_integer((json_int_t)st.uptime_s));
		json_object_set_new(j, "node_name", json_string(st.node_name));
		json_object_set_new(j, "backend", json_string(st.backend));
		json_object_set_new(j, "jobs", json_integer(st.jobs));
		json_object_set_new(j, "peers", json_integer(st.peers));
		json_object_set_new(j, "clients", json_integer(st.clients));
		json_object_set_new(j, "refused", json_integer((json_int_t)st.refused));
		json_object_set_new(j, "log_level", json_string(st.log_level));
		json_object_set_new(j, "requests", json_integer((json_int_t)st.requests));
		json_object_set_new(j, "bad_frames", json_integer((json_int_t)st.bad_frames));
		json_object_set_new(j, "metrics_address", json_string(st.metrics_address));
		json_object_set_new(j, "metrics_error", json_string(st.metrics_error));
		emit_json(j);
	} else {
		printf("version: %s\nprotocol: %u\npid: %d\nuptime_s: %llu\nnode_name: %s\n"
		       "backend: %s\njobs: %u\npeers: %u\nclients: %u\nrefused: %llu\n"
		       "log_level: %s\nrequests: %llu\nbad_frames: %llu\n",
		       st.version, st.protocol, (int)st.pid, (unsigned long long)st.uptime_s,
		       st.node_name, st.backend, st.jobs, st.peers, st.clients,
		       (unsigned long long)st.refused, st.log_level,
		       (unsigned long long)st.requests, (unsigned long long)st.bad_frames);
		/* The listener as bound (metrics_listen = HOST:0 picks a port). */
		if (st.metrics_error[0])
			printf("metrics: not served: %s\n", st.metrics_error);
		else if (st.metrics_address[0])
			printf("metrics: http://%s/metrics\n", st.metrics_address);
		else
			printf("metrics: off\n");
	}
	dte_close(h);
	return 0;
}

/* Prints a reply body; returns the exit status.  NULL: field by field. */
typedef int (*printer_fn)(struct ctx *c, const ProtobufCMessage *body, const char *message);

static int print_generic(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	if (c->json) {
		json_t *j = dte_msg_to_json(body);

		if (j && message && message[0])
			json_object_set_new(j, "message", json_string(message));
		emit_json(j);
	} else
		dte_msg_print(stdout, body, "");
	if (message && message[0] && !c->json)
		printf("message: %s\n", message);
	return 0;
}

/* verify: exit 1 when a sink's buffers did not match, so scripts notice. */
static int print_verify(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	const Dte__VerifyReply *v = (const Dte__VerifyReply *)body;

	print_generic(c, body, message);
	return v && v->mismatch ? EXIT_FAILED : 0;
}

/* `k="v",k2="v2"` (the exposition's escaping) into a JSON object. */
static json_t *labels_json(const char *p)
{
	json_t *o = json_object();

	while (o && *p) {
		const char *eq = strchr(p, '=');
		char key[64], *val;
		size_t n = 0, cap;

		if (!eq || eq[1] != '"' || (size_t)(eq - p) >= sizeof(key))
			break;
		memcpy(key, p, (size_t)(eq - p));
		key[eq - p] = '\0';
		p = eq + 2;
		cap = strlen(p) + 1;
		val = malloc(cap);
		if (!val)
			break;
		for (; *p && *p != '"'; p++) {
			if (*p == '\\' && p[1]) {
				p++;
				val[n++] = *p == 'n' ? '\n' : *p;
			} else {
				val[n++] = *p;
			}
		}
		val[n] = '\0';
		json_object_set_new(o, key, json_string(val));
		free(val);
		if (*p == '"')
			p++;
		if (*p == ',')
			p++;
	}
	return o;
}

/* A sample's value for --json: an integer where it is one (counters,
 * most gauges), else a real; null for NaN or an infinity. */
static json_t *metric_value_json(double v)
{
	if (!isfinite(v))
		return json_null();	/* JSON has no NaN or infinity */
	if (v == floor(v) && fabs(v) < 9007199254740992.0)	/* 2^53 */
		return json_integer((json_int_t)v);
	return json_real(v);
}

/* metrics: the Prometheus text as the daemon rendered it (its values in
 * the fewest digits that read back exactly: daemon/metrics.c); --json
 * gives every sample with its labels as an object. */
static int print_metrics(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	const Dte__MetricsReply *m = (const Dte__MetricsReply *)body;
	json_t *j, *arr;

	if (!m)
		return fail(DTE_ERR_PROTOCOL, "metrics: empty reply");
	if (!c->json) {
		fputs(m->text ? m->text : "", stdout);
		return 0;
	}
	j = json_object();
	arr = json_array();
	for (size_t i = 0; i < m->n_samples; i++)
		json_array_append_new(arr, json_pack("{s:s, s:o, s:o}", "name", m->samples[i]->name,
						     "labels", labels_json(m->samples[i]->labels),
						     "value", metric_value_json(m->samples[i]->value)));
	json_object_set_new(j, "samples", arr);
	json_object_set_new(j, "text", json_string(m->text ? m->text : ""));
	emit_json(j);
	return 0;
}

/* config: `section.key: value (source)` per key; --json nests
 * {section: {key: {value, source}}}. */
static int print_config(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	const Dte__ConfigReply *r = (const Dte__ConfigReply *)body;
	json_t *j = c->json ? json_object() : NULL;

	if (!r)
		return fail(DTE_ERR_PROTOCOL, "config: empty reply");
	for (size_t i = 0; i < r->n_entries; i++) {
		const Dte__ConfigEntry *e = r->entries[i];

		if (!j) {
			printf("%s.%s: %s (%s)\n", e->section, e->key, e->value, e->source);
			continue;
		}
		json_t *sec = json_object_get(j, e->section);

		if (!sec) {
			sec = json_object();
			json_object_set_new(j, e->section, sec);
		}
		json_object_set_new(sec, e->key, json_pack("{s:s, s:s}", "value", e->value,
							   "source", e->source));
	}
	if (j)
		emit_json(j);
	return 0;
}

/* history: one line per version, oldest first (note and reason last,
 * quoted); --json has every field as numbers. */
static int print_history(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	const Dte__HistoryReply *r = (const Dte__HistoryReply *)body;

	if (c->json) {
		json_t *j = dte_msg_to_json(body);

		if (j && !json_object_get(j, "versions"))
			json_object_set_new(j, "versions", json_array());
		if (j && message && message[0])
			json_object_set_new(j, "message", json_string(message));
		emit_json(j);
		return 0;
	}
	if (!r || r->n_versions == 0) {
		printf("no versions published from this daemon for job %s\n", c->argv[0]);
		return 0;
	}
	for (size_t i = 0; i < r->n_versions; i++) {
		const Dte__VersionRecord *v = r->versions[i];

		printf("version=%" PRIu64 " step=%" PRId64 " mode=%s changed_pct=%.3f bytes=%" PRIu64
		       " capture_ms=%.2f transfer_ms=%.2f apply_ms=%.2f checksum=%s sinks=%u",
		       v->version, v->step, v->mode, v->changed_pct, v->bytes, v->capture_ms,
		       v->transfer_ms, v->apply_ms, v->checksum, v->sinks);
		if (v->note && v->note[0])
			printf(" note=\"%s\"", v->note);
		if (v->reason && v->reason[0])
			printf(" reason=\"%s\"", v->reason);
		putchar('\n');
	}
	return 0;
}

/* jobs: says so when there are none. */
static int print_jobs(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	const Dte__JobsReply *r = (const Dte__JobsReply *)body;

	if (c->json) {
		json_t *j = dte_msg_to_json(body);

		if (j && !json_object_get(j, "jobs"))
			json_object_set_new(j, "jobs", json_array());
		emit_json(j);
		return 0;
	}
	if (!r || r->n_jobs == 0) {
		printf("no jobs on this daemon\n");
		return 0;
	}
	return print_generic(c, body, message);
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s[0] || s[0] == '-')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v > max)
		return -1;
	*out = v;
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The sinks of a job that have not applied `version` yet, as
 * "sink 3 (rank 0 replica 0 on n1) at 2, 1 behind; ..." into out. */
static int sinks_behind(dte_t *h, const char *job, uint64_t version, char *out, size_t n)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__JobRequest jr = DTE__JOB_REQUEST__INIT;
	Dte__Response *resp = NULL;
	size_t len = 0;
	int behind = 0;

	out[0] = 0;
	jr.name = (char *)job;
	req.cmd_case = DTE__REQUEST__CMD_JOB;
	req.job = &jr;
	if (dte__call(h, &req, &resp) < 0 || resp->body_case != DTE__RESPONSE__BODY_JOB) {
		if (resp)
			dte__response__free_unpacked(resp, NULL);
		return -1;
	}
	for (size_t i = 0; i < resp->job->n_participants; i++) {
		const Dte__ParticipantInfo *p = resp->job->participants[i];

		if (strcmp(p->role, "sink") || p->version >= version)
			continue;
		behind++;
		if (len < n)
			len += (size_t)snprintf(out + len, n - len, "%ssink 0x%" PRIx64 " (rank %u "
						"replica %u on %s) at version %" PRIu64 ", %" PRIu64
						" behind", behind > 1 ? "; " : "", p->id, p->rank,
						p->replica, p->node && p->node[0] ? p->node : "?",
						p->version, version - p->version);
	}
	dte__response__free_unpacked(resp, NULL);
	return behind;
}

/* wait JOB VERSION [TIMEOUT_MS]: asks the daemon in slices of at most a
 * second, so that in between it can say which sink is behind (stderr);
 * refuses to call a version applied when no sink is fed from here. */
static int cmd_wait(struct ctx *c)
{
	const char *job = NULL, *pos[3];
	uint64_t version = 0, timeout = 0, start, waited = 0;
	int npos = 0, quiet = 0, rc;
	dte_t *h;

	for (int i = 0; i < c->argc; i++) {
		if (!strcmp(c->argv[i], "-q") || !strcmp(c->argv[i], "--quiet"))
			quiet = 1;
		else if (npos < 3)
			pos[npos++] = c->argv[i];
		else
			npos = 4;
	}
	if (npos < 2 || npos > 3)
		return usage_fail("wait needs JOB and VERSION (usage: dtectl %s)", c->cmd->usage);
	job = pos[0];
	if (parse_u64(pos[1], UINT64_MAX, &version) || version == 0)
		return usage_fail("wait: VERSION must be a positive integer, not \"%s\"", pos[1]);
	if (npos == 3 && parse_u64(pos[2], UINT32_MAX, &timeout))
		return usage_fail("wait: TIMEOUT_MS must be milliseconds, not \"%s\"", pos[2]);
	if ((rc = connect_or_fail(c, &h)))
		return rc;
	start = now_ms();
	for (;;) {
		Dte__Request req = DTE__REQUEST__INIT;
		Dte__WaitRequest wr = DTE__WAIT_REQUEST__INIT;
		Dte__Response *resp = NULL;
		uint64_t left = timeout > waited ? timeout - waited : 0;
		char behind[1024], msg[1400];
		int nb;

		wr.job = (char *)job;
		wr.version = version;
		wr.timeout_ms = (uint32_t)(left > 1000 ? 1000 : left);
		req.cmd_case = DTE__REQUEST__CMD_WAIT;
		req.wait = &wr;
		rc = dte__call(h, &req, &resp);
		if (rc == 0) {
			uint32_t sinks = resp->wait ? resp->wait->sinks : 0;

			if (sinks == 0) {
				snprintf(msg, sizeof(msg), "job %s: no sink is fed from this daemon, so no "
					 "sink applied version %" PRIu64 " here (run wait on a daemon "
					 "with a source of the job)", job, version);
				rc = report(EXIT_FAILED, "no_sinks", msg);
			} else {
				rc = print_generic(c, &resp->wait->base, resp->message);
			}
			dte__response__free_unpacked(resp, NULL);
			break;
		}
		if (rc != DTE_ERR_TIMEOUT) {
			rc = fail(rc, dte_errmsg(h));
			break;
		}
		/* The daemon's deadline (a reply) keeps the handle; the socket's
		 * (the daemon did not answer) closed it, and the job query fails. */
		snprintf(msg, sizeof(msg), "%s", dte_errmsg(h));
		waited = now_ms() - start;
		nb = sinks_behind(h, job, version, behind, sizeof(behind));
		if (nb < 0) {
			rc = fail(DTE_ERR_TIMEOUT, msg);
			break;
		}
		if (waited < timeout) {
			if (!quiet)
				fprintf(stderr, "dtectl wait: job %s version %" PRIu64 ": %.1f s, %s\n",
					job, version, (double)waited / 1000.0,
					nb > 0 ? behind : "no sink reported behind yet");
			continue;
		}
		snprintf(msg, sizeof(msg), "job %s: version %" PRIu64 " not applied by every sink "
			 "within %" PRIu64 " ms%s%s", job, version, timeout, nb > 0 ? ": " : "",
			 nb > 0 ? behind : "");
		rc = report(EXIT_TIMEOUT, "timeout", msg);
		break;
	}
	dte_close(h);
	return rc;
}

/* Any daemon command: arguments fill the request message by descriptor,
 * the reply body prints by descriptor unless the command has a printer. */
static int call_daemon(struct ctx *c, printer_fn print)
{
	const ProtobufCFieldDescriptor *rf =
		protobuf_c_message_descriptor_get_field(&dte__request__descriptor, c->cmd->field);
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__Response *resp = NULL;
	ProtobufCMessage *sub;
	char err[256];
	dte_t *h;
	int rc;

	if (!rf || rf->type != PROTOBUF_C_TYPE_MESSAGE)
		return fail(DTE_ERR_INVAL, "command table and dte.proto disagree");
	sub = calloc(1, ((const ProtobufCMessageDescriptor *)rf->descriptor)->sizeof_message);
	if (!sub)
		return fail(DTE_ERR_NOMEM, NULL);
	protobuf_c_message_init(rf->descriptor, sub);
	if (c->argc < required_args(c->cmd)) {
		free(sub);
		return usage_fail("%s needs %d argument%s (usage: dtectl %s)", c->cmd->name,
				  required_args(c->cmd), required_args(c->cmd) == 1 ? "" : "s",
				  c->cmd->usage);
	}
	if (dte_msg_from_args(sub, c->argc, c->argv, err, sizeof(err)) < 0) {
		free(sub);
		return usage_fail("%s: %s (usage: dtectl %s)", c->cmd->name, err, c->cmd->usage);
	}
	*(ProtobufCMessage **)((char *)&req + rf->offset) = sub;
	*(uint32_t *)((char *)&req + rf->quantifier_offset) = rf->id;
	rc = connect_or_fail(c, &h);
	if (rc) {
		free(sub);
		return rc;
	}
	rc = dte__call(h, &req, &resp);
	if (rc < 0) {
		rc = fail(rc, dte_errmsg(h));
	} else {
		const ProtobufCFieldDescriptor *bf = protobuf_c_message_descriptor_get_field(
			&dte__response__descriptor, (unsigned)resp->body_case);
		const ProtobufCMessage *body =
			bf ? *(ProtobufCMessage *const *)((const char *)resp + bf->offset) : NULL;

		rc = (print ? print : print_generic)(c, body, resp->message);
		dte__response__free_unpacked(resp, NULL);
	}
	dte_close(h);
	free(sub);
	return rc;
}

/* plan and storage report on stderr; under --json their failure becomes
 * the JSON error object too (its message: the first line they wrote). */
static int run_local(struct ctx *c, int (*fn)(int, char **), int ac, char **av)
{
	FILE *saved = stderr, *mem;
	char *buf = NULL, *line, *nl;
	size_t len = 0;
	int rc, json = c->json;

	for (int i = 1; i < ac; i++)
		json |= !strcmp(av[i], "--json");
	if (!json || !(mem = open_memstream(&buf, &len)))
		return fn(ac, av);
	stderr = mem;
	rc = fn(ac, av);
	fflush(stdout);
	fclose(mem);
	stderr = saved;
	if (buf && len)
		fwrite(buf, 1, len, stderr);
	if (rc) {
		line = buf ? buf : "";
		if ((nl = strchr(line, '\n')))
			*nl = 0;
		if (!strncmp(line, "dtectl ", 7) || !strncmp(line, "dte-storage: ", 13))
			line = strchr(line, ':') ? strchr(line, ':') + 1 : line;
		while (*line == ' ')
			line++;
		{   /* not report(): the message is on stderr already */
			json_t *j = json_pack("{s:s, s:i, s:s}", "error", rc == EXIT_USAGE ? "usage" : "failed",
					      "code", rc, "message", *line ? line : "failed");
			emit_json(j);
		}
	}
	free(buf);
	return rc;
}

/* plan needs no daemon; it gets its own argv (argv[0] = "plan"). */
static int cmd_plan(struct ctx *c)
{
	char **av = calloc((size_t)c->argc + 3, sizeof(*av));
	int ac = 0, rc;

	if (!av)
		return fail(DTE_ERR_NOMEM, NULL);
	av[ac++] = "plan";
	if (c->json)
		av[ac++] = "--json";
	for (int i = 0; i < c->argc; i++)
		av[ac++] = c->argv[i];
	rc = run_local(c, dte_plan_cli, ac, av);
	free(av);
	return rc;
}

/* `storage ls|gc|verify|keyframe JOB`: a job the daemon knows with the
 * storage transport names its root; NULL when it does not. */
static char *storage_root_of(struct ctx *c, const char *job)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__JobRequest jr = DTE__JOB_REQUEST__INIT;
	Dte__Response *resp = NULL;
	char *root = NULL;
	dte_t *h;

	if (dte_connect(c->socket, &h) < 0)
		return NULL;
	jr.name = (char *)job;
	req.cmd_case = DTE__REQUEST__CMD_JOB;
	req.job = &jr;
	if (dte__call(h, &req, &resp) == 0 && resp->body_case == DTE__RESPONSE__BODY_JOB &&
	    resp->job->storage_root && resp->job->storage_root[0])
		root = strdup(resp->job->storage_root);
	if (resp)
		dte__response__free_unpacked(resp, NULL);
	dte_close(h);
	return root;
}

/* storage needs no daemon either: dte-storage's code, same arguments;
 * `ls|gc|verify|keyframe JOB` (no ROOT) asks the daemon for the root. */
static int cmd_storage(struct ctx *c)
{
	char **av = calloc((size_t)c->argc + 4, sizeof(*av));
	char *root = NULL;
	int ac = 0, rc;

	if (!av)
		return fail(DTE_ERR_NOMEM, NULL);
	av[ac++] = "storage";
	if (c->json)
		av[ac++] = "--json";
	if (c->argc >= 2 && c->argv[1][0] != '/' && c->argv[1][0] != '.' &&
	    (c->argc == 2 || c->argv[2][0] == '-') &&
	    (!strcmp(c->argv[0], "ls") || !strcmp(c->argv[0], "gc") ||
	     !strcmp(c->argv[0], "verify") || !strcmp(c->argv[0], "keyframe")))
		root = storage_root_of(c, c->argv[1]);
	for (int i = 0; i < c->argc; i++) {
		if (i == 1 && root)
			av[ac++] = root;
		av[ac++] = c->argv[i];
	}
	rc = run_local(c, dte_storage_cli, ac, av);
	free(root);
	free(av);
	return rc;
}

static int cmd_generic(struct ctx *c)
{
	return call_daemon(c, NULL);
}

static int cmd_verify(struct ctx *c)
{
	return call_daemon(c, print_verify);
}

static int cmd_history(struct ctx *c)
{
	return call_daemon(c, print_history);
}

static int cmd_jobs(struct ctx *c)
{
	int rc = no_args(c);

	return rc ? rc : call_daemon(c, print_jobs);
}

static int cmd_metrics(struct ctx *c)
{
	int rc = no_args(c);

	return rc ? rc : call_daemon(c, print_metrics);
}

static int cmd_config(struct ctx *c)
{
	int rc = no_args(c);

	return rc ? rc : call_daemon(c, print_config);
}

static const struct {
	const char *name;
	int (*fn)(struct ctx *c);
} client_cmds[] = {
	{ "hello", cmd_hello },
	{ "ping", cmd_ping },
	{ "status", cmd_status },
	{ "plan", cmd_plan },
	{ "storage", cmd_storage },
	{ "verify", cmd_verify },
	{ "wait", cmd_wait },
	{ "history", cmd_history },
	{ "jobs", cmd_jobs },
	{ "metrics", cmd_metrics },
	{ "config", cmd_config },
};

/* Global options may come before or after the command name (not inside
 * `plan`'s or `storage`'s own arguments, which are passed through
 * untouched). */
static int take_option(struct ctx *c, int argc, char **argv, int *i)
{
	const char *a = argv[*i];

	if (!strcmp(a, "--json") || !strcmp(a, "-j")) {
		c->json = g_json = 1;
		return 1;
	}
	if (!strncmp(a, "--socket=", 9)) {
		c->socket = a + 9;
		return 1;
	}
	if (!strcmp(a, "--socket") || !strcmp(a, "-s")) {
		if (*i + 1 >= argc)
			return -usage_fail("%s needs a path", a);
		c->socket = argv[++*i];
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct ctx c = { 0 };
	const char *name = NULL;
	char **rest;
	int i, nrest = 0, want_help = 0, rc;

	for (i = 1; i < argc; i++)   /* --json anywhere: usage errors as JSON too */
		if (!strcmp(argv[i], "--json") || !strcmp(argv[i], "-j"))
			g_json = 1;
		else if (!strcmp(argv[i], "plan") || !strcmp(argv[i], "storage"))
			break;
	rest = calloc((size_t)argc + 1, sizeof(*rest));
	if (!rest)
		return fail(DTE_ERR_NOMEM, NULL);
	for (i = 1; i < argc; i++) {
		int t;

		if (name && (!strcmp(name, "plan") || !strcmp(name, "storage"))) {
			rest[nrest++] = argv[i];
			continue;
		}
		t = take_option(&c, argc, argv, &i);
		if (t < 0) {
			rc = EXIT_USAGE;
			goto out;
		}
		if (t)
			continue;
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			if (!name)
				name = "help";
			else
				want_help = 1;
		} else if (!name && (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V"))) {
			printf("dtectl %s (protocol %u)\n", DTE_VERSION, DTE_PROTO_VERSION);
			rc = 0;
			goto out;
		} else if (!name && argv[i][0] == '-') {
			rc = usage_fail("unknown option '%s' (try `dtectl --help`)", argv[i]);
			goto out;
		} else if (!name) {
			name = argv[i];
		} else {
			rest[nrest++] = argv[i];
		}
	}
	if (!name) {
		usage(stderr);
		rc = g_json ? usage_fail("no command given") : EXIT_USAGE;
		goto out;
	}
	c.argc = nrest;
	c.argv = rest;
	if (!strcmp(name, "help")) {
		rc = want_help ? help_for("help") : cmd_help(&c);
		goto out;
	}
	c.cmd = dte_cmd_by_name(name);
	if (!c.cmd) {
		rc = usage_fail("unknown command '%s' (try `dtectl help`)", name);
		goto out;
	}
	if (want_help) {
		rc = help_for(name);
		goto out;
	}
	for (size_t k = 0; k < sizeof(client_cmds) / sizeof(client_cmds[0]); k++) {
		if (!strcmp(client_cmds[k].name, name)) {
			rc = client_cmds[k].fn(&c);
			goto out;
		}
	}
	if (!(c.cmd->flags & DTE_CMD_DAEMON)) {
		rc = report(EXIT_FAILED, "unavailable", "this command is not available in this build");
		goto out;
	}
	rc = cmd_generic(&c);
out:
	free(rest);
	return rc;
}
