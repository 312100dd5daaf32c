/* client/dtectl.c — operator CLI for dted, built on libdte.
 *
 * Commands, their usage and help come from proto/cmdtab.h; daemon commands
 * without a printer here are sent generically (arguments become request
 * fields) and their replies printed field by field (client/msgfmt.h).
 * Exit status: 0 ok, 1 the daemon refused or failed, 2 usage, 3 the daemon
 * could not be reached.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "client/dte_internal.h"
#include "client/msgfmt.h"
#include "daemon/layout/plan_cli.h"
#include "daemon/storage/storage_cli.h"
#include "proto/cmdtab.h"

enum { EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

struct ctx {
	const char *socket;
	int json;
	const struct dte_cmd *cmd;
	int argc;                 /* command arguments, after the name */
	char **argv;
};

static int fail(int err, const char *msg)
{
	fprintf(stderr, "dtectl: %s\n", msg && *msg ? msg : dte_strerror(err));
	return err == DTE_ERR_UNREACHABLE || err == DTE_ERR_IO || err == DTE_ERR_TIMEOUT ?
	       EXIT_UNREACHABLE : EXIT_FAILED;
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
		   "  --json         machine-readable output\n\ncommands:\n",
		DTE_SOCKET_ENV, DTE_DEFAULT_SOCKET);
	fprintf(f, "  %-10s %s\n", "help", "list commands, or `help COMMAND` for its usage");
	for (size_t i = 0; i < DTE_CMD__COUNT; i++)
		if (!(dte_cmdtab[i].flags & DTE_CMD_HIDDEN))
			fprintf(f, "  %-10s %s\n", dte_cmdtab[i].name, dte_cmdtab[i].summary);
}

static int cmd_help(struct ctx *c)
{
	const struct dte_cmd *cmd;

	if (c->argc == 0) {
		usage(stdout);
		return 0;
	}
	cmd = dte_cmd_by_name(c->argv[0]);
	if (!cmd) {
		fprintf(stderr, "dtectl: unknown command '%s'\n", c->argv[0]);
		return EXIT_USAGE;
	}
	printf("usage: dtectl [--socket PATH] [--json] %s\n  %s\n", cmd->usage, cmd->summary);
	return 0;
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
	fprintf(stderr, "dtectl: %s takes no arguments (usage: dtectl %s)\n", c->cmd->name,
		c->cmd->usage);
	return EXIT_USAGE;
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
		emit_json(j);
	} else {
		printf("version: %s\nprotocol: %u\npid: %d\nuptime_s: %llu\nnode_name: %s\n"
		       "backend: %s\njobs: %u\npeers: %u\nclients: %u\nrefused: %llu\n"
		       "log_level: %s\nrequests: %llu\nbad_frames: %llu\n",
		       st.version, st.protocol, (int)st.pid, (unsigned long long)st.uptime_s,
		       st.node_name, st.backend, st.jobs, st.peers, st.clients,
		       (unsigned long long)st.refused, st.log_level,
		       (unsigned long long)st.requests, (unsigned long long)st.bad_frames);
	}
	dte_close(h);
	return 0;
}

/* Prints a reply body; returns the exit status.  NULL: field by field. */
typedef int (*printer_fn)(struct ctx *c, const ProtobufCMessage *body, const char *message);

static int print_generic(struct ctx *c, const ProtobufCMessage *body, const char *message)
{
	if (c->json)
		emit_json(dte_msg_to_json(body));
	else
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

/* metrics: the Prometheus text as the daemon rendered it; --json gives
 * every sample with its labels as an object. */
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
		json_array_append_new(arr, json_pack("{s:s, s:o, s:f}", "name", m->samples[i]->name,
						     "labels", labels_json(m->samples[i]->labels),
						     "value", m->samples[i]->value));
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
	if (dte_msg_from_args(sub, c->argc, c->argv, err, sizeof(err)) < 0) {
		fprintf(stderr, "dtectl %s: %s (usage: dtectl %s)\n", c->cmd->name, err, c->cmd->usage);
		free(sub);
		return EXIT_USAGE;
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
	rc = dte_plan_cli(ac, av);
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
	rc = dte_storage_cli(ac, av);
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
		c->json = 1;
		return 1;
	}
	if (!strncmp(a, "--socket=", 9)) {
		c->socket = a + 9;
		return 1;
	}
	if (!strcmp(a, "--socket") || !strcmp(a, "-s")) {
		if (*i + 1 >= argc) {
			fprintf(stderr, "dtectl: %s needs a path\n", a);
			return -1;
		}
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
	int i, nrest = 0;

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
		if (t < 0)
			goto usage_err;
		if (t)
			continue;
		if (!name && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
			name = "help";
		} else if (!name && (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V"))) {
			printf("dtectl %s (protocol %u)\n", DTE_VERSION, DTE_PROTO_VERSION);
			free(rest);
			return 0;
		} else if (!name && argv[i][0] == '-') {
			fprintf(stderr, "dtectl: unknown option '%s'\n", argv[i]);
			goto usage_err;
		} else if (!name) {
			name = argv[i];
		} else {
			rest[nrest++] = argv[i];
		}
	}
	if (!name) {
		usage(stderr);
		free(rest);
		return EXIT_USAGE;
	}
	c.argc = nrest;
	c.argv = rest;
	int rc;

	if (!strcmp(name, "help")) {
		rc = cmd_help(&c);
		goto out;
	}
	c.cmd = dte_cmd_by_name(name);
	if (!c.cmd) {
		fprintf(stderr, "dtectl: unknown command '%s' (try `dtectl help`)\n", name);
		rc = EXIT_USAGE;
		goto out;
	}
	for (size_t k = 0; k < sizeof(client_cmds) / sizeof(client_cmds[0]); k++) {
		if (!strcmp(client_cmds[k].name, name)) {
			rc = client_cmds[k].fn(&c);
			goto out;
		}
	}
	if (!(c.cmd->flags & DTE_CMD_DAEMON)) {
		fprintf(stderr, "dtectl: %s is not available in this build\n", name);
		rc = EXIT_FAILED;
		goto out;
	}
	rc = cmd_generic(&c);
out:
	free(rest);
	return rc;
usage_err:
	free(rest);
	return EXIT_USAGE;
}
