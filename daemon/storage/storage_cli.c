/* daemon/storage/storage_cli.c — `dte-storage` (and `dtectl storage`):
 * argument parsing, dispatch, and the ls / gc / verify / keyframe
 * subcommands (write and read: cli_rw.c; the model and the messages both
 * use: cli_model.c).
 *
 * Stable output lines (tests match them):
 *   ls:      job J: versions=N first=F head=H keyframes=K readers=R orphans=O
 *            vN kind=delta|keyframe base=B changed=C delta_bytes=D keyframe_bytes=K chunks=n
 *            reader NAME version=V age=S [stale]
 *   gc:      gc: floor=F removed=N bytes=B orphans=O reader_floor=R
 *   verify:  vN ok|BAD ...   then   verify: versions=N bad=B
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include "daemon/storage/cli_int.h"
#include "daemon/storage/storage_int.h"
#include "daemon/storage/storage_cli.h"

/* "dte-storage", or "dtectl storage" when dtectl runs it (argv[0] "storage"). */
static const char *prog = "dte-storage";

static void usage(FILE *f)
{
	fprintf(f,
		"usage: %1$s write ROOT JOB (--spec F | --config F) --version N\n"
		"                         [--delta F] [--dense F] [--keyframe] [--keyframe-every N]\n"
		"                         [--max-chunk BYTES] [--zlevel 1-3]\n"
		"       %1$s read ROOT JOB (--spec F | --config F) [--name R] [--state F]\n"
		"                         [--watch inotify|poll|none] [--interval-ms N] [--until V]\n"
		"                         [--timeout S]\n"
		"       %1$s ls ROOT JOB [--stale-after S] [--json]\n"
		"       %1$s gc ROOT JOB [--keep K] [--keep-keyframes M] [--stale-after S]\n"
		"                         [--dry-run] [--json]\n"
		"       %1$s verify ROOT JOB [--spec F | --config F] [--json]\n"
		"       %1$s keyframe ROOT JOB   (the writing dted makes its next\n"
		"                         version a keyframe)\n"
		"  --spec F: JSON {\"tensors\":[{\"name\":..,\"numel\":..},..][,\"spec_hash\":\"hex16\"]}\n"
		"  --config F: a Hugging Face config.json (the model spec of dted)\n"
		"  --delta F: \"DTSD1\\0\\0\\0\" u32 ntensors u32 0, per tensor u64 count,\n"
		"             u64 positions[count], u16 values[count] (little-endian)\n"
		"  --dense F: all tensors' BF16 values, in spec order\n", prog);
}

static int parse_num(const char *opt, const char *v, double lo, double hi, double *out)
{
	char *end;
	double x;

	errno = 0;
	x = strtod(v, &end);
	if (errno || end == v || *end || x < lo || x > hi) {
		fprintf(stderr, "dte-storage: %s needs a number in [%g, %g], not \"%s\"\n", opt,
			lo, hi, v);
		return -1;
	}
	*out = x;
	return 0;
}

static int parse_args(struct cli *c, int argc, char **argv)
{
	static const struct {
		const char *name;
		int         kind;    /* 0 flag, 1 string, 2 number */
		double      lo, hi;
	} opts[] = {
		{ "--json", 0, 0, 0 }, { "--dry-run", 0, 0, 0 }, { "--keyframe", 0, 0, 0 },
		{ "--spec", 1, 0, 0 }, { "--config", 1, 0, 0 }, { "--delta", 1, 0, 0 },
		{ "--dense", 1, 0, 0 }, { "--name", 1, 0, 0 }, { "--state", 1, 0, 0 },
		{ "--watch", 1, 0, 0 },
		{ "--version", 2, 0, 9e18 }, { "--until", 2, 0, 9e18 },
		{ "--keep", 2, 1, 1e9 }, { "--keep-keyframes", 2, 1, 1e9 },
		{ "--keyframe-every", 2, 0, 1e9 }, { "--max-chunk", 2, DTS_MAX_CHUNK_MIN,
						     DTS_MAX_CHUNK_MAX },
		{ "--interval-ms", 2, 1, 3.6e6 }, { "--zlevel", 2, 1, 3 },
		{ "--stale-after", 2, 0, 1e9 }, { "--timeout", 2, 0, 1e6 },
	};

	memset(c, 0, sizeof(*c));
	c->version = c->until = -1;
	c->keep = 10;
	c->keep_keyframes = 2;
	c->interval_ms = 200;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = NULL, *eq;
		size_t k, n;

		if (a[0] != '-' || !a[1]) {
			if (!c->sub)
				c->sub = a;
			else if (c->npos < CLI_MAX_POS)
				c->pos[c->npos++] = a;
			else
				return cli_err("too many arguments at \"%s\"", a), -1;
			continue;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return usage(stdout), 1;
		eq = strchr(a, '=');
		n = eq ? (size_t)(eq - a) : strlen(a);
		for (k = 0; k < sizeof(opts) / sizeof(opts[0]); k++)
			if (strlen(opts[k].name) == n && !strncmp(a, opts[k].name, n))
				break;
		if (k == sizeof(opts) / sizeof(opts[0]))
			return cli_err("unknown option \"%s\"", a), -1;
		if (opts[k].kind == 0) {
			if (eq)
				return cli_err("%s takes no value", opts[k].name), -1;
			if (!strcmp(opts[k].name, "--json"))
				c->json = 1;
			else if (!strcmp(opts[k].name, "--dry-run"))
				c->dry_run = 1;
			else
				c->keyframe = 1;
			continue;
		}
		if (eq)
			v = eq + 1;
		else if (i + 1 < argc)
			v = argv[++i];
		else
			return cli_err("%s needs a value", opts[k].name), -1;
		if (opts[k].kind == 1) {
			const char *nm = opts[k].name;

			*(!strcmp(nm, "--spec") ? &c->spec : !strcmp(nm, "--config") ? &c->config :
			  !strcmp(nm, "--delta") ? &c->delta : !strcmp(nm, "--dense") ? &c->dense :
			  !strcmp(nm, "--name") ? &c->name : !strcmp(nm, "--state") ? &c->state :
			  &c->watch) = v;
		} else {
			const char *nm = opts[k].name;
			double x;

			if (parse_num(nm, v, opts[k].lo, opts[k].hi, &x) < 0)
				return -1;
			if (!strcmp(nm, "--version"))
				c->version = (int64_t)x;
			else if (!strcmp(nm, "--until"))
				c->until = (int64_t)x;
			else if (!strcmp(nm, "--keep"))
				c->keep = (uint64_t)x;
			else if (!strcmp(nm, "--keep-keyframes"))
				c->keep_keyframes = (uint64_t)x;
			else if (!strcmp(nm, "--keyframe-every"))
				c->keyframe_every = (uint64_t)x;
			else if (!strcmp(nm, "--max-chunk"))
				c->max_chunk = (uint64_t)x;
			else if (!strcmp(nm, "--interval-ms"))
				c->interval_ms = (uint64_t)x;
			else if (!strcmp(nm, "--zlevel"))
				c->zlevel = (int)x;
			else if (!strcmp(nm, "--stale-after"))
				c->stale_after = x;
			else
				c->timeout = x;
		}
	}
	if (!c->sub)
		return usage(stderr), -1;
	if (c->npos != 2)
		return cli_err("%s needs ROOT and JOB", c->sub), -1;
	if (!dts_job_name_ok(c->pos[1]))
		return cli_err("bad job name \"%s\" (letters, digits, '.', '_', '-')", c->pos[1]), -1;
	return 0;
}

/* ---- ls ------------------------------------------------------------- */

static json_t *ls_json(const struct dts_catalog *cat)
{
	json_t *o = json_object(), *vs = json_array(), *rs = json_array(), *ks = json_array();
	double now = dts_now();

	for (size_t i = 0; i < cat->nv; i++) {
		const struct dts_cat_version *v = &cat->v[i];
		json_t *j;

		if (v->bad) {
			j = json_pack("{s:I,s:b,s:s}", "version", (json_int_t)v->version, "ok", 0,
				      "error", v->err);
		} else {
			j = json_pack("{s:I,s:b,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}",
				      "version", (json_int_t)v->version, "ok", 1,
				      "kind", v->keyframe ? "keyframe" : "delta",
				      "base", (json_int_t)v->base, "changed", (json_int_t)v->changed,
				      "delta_bytes", (json_int_t)v->delta_stored,
				      "delta_raw", (json_int_t)v->delta_raw,
				      "keyframe_bytes", (json_int_t)v->key_stored,
				      "chunks", (json_int_t)(v->delta_chunks + v->key_chunks),
				      "elements", (json_int_t)v->total_elems,
				      "keyframe_raw", (json_int_t)v->key_raw, "created", v->created);
			if (v->keyframe)
				json_array_append_new(ks, json_integer((json_int_t)v->version));
		}
		json_array_append_new(vs, j);
	}
	for (size_t i = 0; i < cat->nr; i++)
		json_array_append_new(rs, json_pack("{s:s,s:I,s:f,s:b}", "name", cat->r[i].name,
						    "version", (json_int_t)cat->r[i].version,
						    "age", now - cat->r[i].updated,
						    "stale", cat->r[i].stale));
	json_object_set_new(o, "job", json_string(cat->job));
	json_object_set_new(o, "head", json_integer(cat->head));
	json_object_set_new(o, "versions", vs);
	json_object_set_new(o, "keyframes", ks);
	json_object_set_new(o, "readers", rs);
	json_object_set_new(o, "orphans", json_integer((json_int_t)cat->orphans));
	return o;
}

static void print_json(json_t *o)
{
	char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;

	if (s)
		puts(s);
	free(s);
	json_decref(o);
}

static int cmd_ls(struct cli *c)
{
	struct dts_catalog cat;
	char err[256];
	size_t nk = 0;
	double now = dts_now();

	struct stat st;

	/* A root that is not there is a mistake, not a job without versions
	 * (a job directory not written yet is: versions=0). */
	if (stat(c->pos[0], &st) < 0)
		return cli_err("ls: %s: %s", c->pos[0], strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return cli_err("ls: %s: not a directory", c->pos[0]);
	if (dts_catalog_load(&cat, c->pos[0], c->pos[1], c->stale_after, err, sizeof(err)))
		return cli_err("ls: %s", err);
	if (c->json) {
		print_json(ls_json(&cat));
		dts_catalog_fini(&cat);
		return 0;
	}
	for (size_t i = 0; i < cat.nv; i++)
		nk += !cat.v[i].bad && cat.v[i].keyframe;
	printf("job %s: versions=%zu first=%" PRId64 " head=%" PRId64 " keyframes=%zu readers=%zu "
	       "orphans=%" PRIu64 "\n", cat.job, cat.nv, cat.nv ? (int64_t)cat.v[0].version : -1,
	       cat.head, nk, cat.nr, cat.orphans);
	for (size_t i = 0; i < cat.nv; i++) {
		const struct dts_cat_version *v = &cat.v[i];

		if (v->bad) {
			printf("v%" PRIu64 " BAD %s\n", v->version, v->err);
			continue;
		}
		printf("v%" PRIu64 " kind=%s base=%" PRId64 " changed=%" PRIu64 " delta_bytes=%" PRIu64
		       " keyframe_bytes=%" PRIu64 " chunks=%" PRIu64 "\n", v->version,
		       v->keyframe ? "keyframe" : "delta", v->base, v->changed, v->delta_stored,
		       v->key_stored, v->delta_chunks + v->key_chunks);
	}
	for (size_t i = 0; i < cat.nr; i++)
		printf("reader %s version=%" PRId64 " age=%.1f%s\n", cat.r[i].name,
		       cat.r[i].version, now - cat.r[i].updated, cat.r[i].stale ? " stale" : "");
	dts_catalog_fini(&cat);
	return 0;
}

/* ---- gc ------------------------------------------------------------- */

static int cmd_gc(struct cli *c)
{
	struct dts_gc_cfg cfg = { 0 };
	struct dts_gc_result res;
	char err[256];

	cfg.keep = (uint32_t)c->keep;
	cfg.keep_keyframes = (uint32_t)c->keep_keyframes;
	cfg.stale_after_s = c->stale_after;
	cfg.dry_run = c->dry_run;
	if (dts_gc(c->pos[0], c->pos[1], &cfg, &res, err, sizeof(err)))
		return cli_err("gc: %s", err);
	if (c->json)
		print_json(json_pack("{s:I,s:I,s:I,s:I,s:I,s:b}", "floor", (json_int_t)res.floor,
				     "removed", (json_int_t)res.removed,
				     "bytes", (json_int_t)res.removed_bytes,
				     "orphans", (json_int_t)res.orphans_removed,
				     "reader_floor", (json_int_t)res.reader_floor,
				     "dry_run", c->dry_run));
	else
		printf("gc: floor=%" PRId64 " removed=%" PRIu64 " bytes=%" PRIu64 " orphans=%" PRIu64
		       " reader_floor=%" PRId64 "%s\n", res.floor, res.removed, res.removed_bytes,
		       res.orphans_removed, res.reader_floor, c->dry_run ? " (dry run)" : "");
	return 0;
}

/* ---- verify --------------------------------------------------------- */

static int cmd_verify(struct cli *c)
{
	struct dts_catalog cat;
	json_t *arr = c->json ? json_array() : NULL;
	char err[512];
	size_t bad = 0;

	if ((c->spec || c->config) && cli_load_model(c))
		return 1;
	if (dts_catalog_load(&cat, c->pos[0], c->pos[1], 0, err, sizeof(err)))
		return cli_err("verify: %s", err);
	for (size_t i = 0; i < cat.nv; i++) {
		const struct dts_cat_version *cv = &cat.v[i];
		const struct dts_model *m = c->model.numel ? &c->model : NULL;
		struct dts_version *v;
		int rc = DTS_OK;

		err[0] = 0;
		for (int part = 0; part < 2 && rc == DTS_OK; part++) {
			if (part == DTS_PART_KEYFRAME && (cv->bad || !cv->keyframe))
				break;
			rc = dts_version_load(c->pos[0], c->pos[1], cv->version, part, m, &v, err,
					      sizeof(err));
			dts_version_free(v);
		}
		bad += rc != DTS_OK;
		if (arr)
			json_array_append_new(arr, json_pack("{s:I,s:b,s:s}", "version",
							     (json_int_t)cv->version, "ok", rc == 0,
							     "error", err));
		else if (rc)
			printf("v%" PRIu64 " BAD %s: %s\n", cv->version, dts_strerror(rc), err);
		else
			printf("v%" PRIu64 " ok%s\n", cv->version, cv->keyframe ? " keyframe" : "");
	}
	if (arr)
		print_json(json_pack("{s:o,s:I,s:I}", "versions", arr, "count", (json_int_t)cat.nv,
				     "bad", (json_int_t)bad));
	else
		printf("verify: versions=%zu bad=%zu\n", cat.nv, bad);
	dts_catalog_fini(&cat);
	return bad ? 1 : 0;
}

/* ---- keyframe ------------------------------------------------------- */

static int cmd_keyframe(struct cli *c)
{
	char err[256];

	if (dts_keyframe_request(c->pos[0], c->pos[1], err, sizeof(err)))
		return cli_err("keyframe: %s", err);
	printf("keyframe: requested for %s (the writer's next version)\n", c->pos[1]);
	return 0;
}

int dte_storage_cli(int argc, char **argv)
{
	struct cli c;
	int rc;

	prog = argc > 0 && !strcmp(argv[0], "storage") ? "dtectl storage" : "dte-storage";
	if ((rc = parse_args(&c, argc, argv)) != 0)
		return rc > 0 ? 0 : 2;
	if (!strcmp(c.sub, "ls"))
		rc = cmd_ls(&c);
	else if (!strcmp(c.sub, "gc"))
		rc = cmd_gc(&c);
	else if (!strcmp(c.sub, "verify"))
		rc = cmd_verify(&c);
	else if (!strcmp(c.sub, "write"))
		rc = cli_write(&c);
	else if (!strcmp(c.sub, "read"))
		rc = cli_read(&c);
	else if (!strcmp(c.sub, "keyframe"))
		rc = cmd_keyframe(&c);
	else
		rc = cli_err("unknown subcommand \"%s\" (write, read, ls, gc, verify, keyframe)",
			     c.sub) + 1;
	free(c.numel);
	return rc;
}
