/* daemon/layout/desc.c — "runtime:key=value,..." strings to layouts, as
 * `dtectl plan --source/--sink` and job configs spell them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"

/* Every layout kind and its options: the parser below reads this table,
 * and `dtectl plan --supported` lists it.  Keys are parallel degrees, an
 * index or a flag; each kind's branch in dte_layout_from_desc_shards reads
 * them by position. */
static const struct dte_layout_kind desc_kinds[] = {
	{ "megatron", DTE_LAYOUT_SOURCE, 0, 0, "Megatron-Core (flat param/grad buffers, distributed optimizer)",
	  5, { "tp", "dp", "ep", "etp", "dopt" }, { 1, 1, 1, 0, 1 } },
	{ "mcore", DTE_LAYOUT_SOURCE, 1, 0, "Megatron-Core, registered optimizer shards",
	  4, { "tp", "dp", "ep", "etp" }, { 1, 1, 1, 0 } },
	{ "fsdp", DTE_LAYOUT_SOURCE, 0, 0, "FSDP (dim-0 shards of HF tensors)",
	  1, { "dp" }, { 1 } },
	{ "fsdp2", DTE_LAYOUT_SOURCE, 1, 0, "PyTorch FSDP2, registered shards",
	  1, { "dp" }, { 1 } },
	{ "json", DTE_LAYOUT_SOURCE, 0, 1, "declarative pieces (gen_json.c)", 0, { NULL }, { 0 } },
	{ "sglang", DTE_LAYOUT_SINK, 0, 0, "SGLang (TP, FusedMoE EP; fp8=1: block-FP8 linear weights)",
	  3, { "tp", "ep", "fp8" }, { 1, 1, 0 } },
	{ "vllm", DTE_LAYOUT_SINK, 0, 0, "vLLM (TP, FusedMoE EP = 1 or TP*DP; dp: a data-parallel group's engines, experts over all; fp8=1: block-FP8 linear weights)",
	  4, { "tp", "ep", "fp8", "dp" }, { 1, 1, 0, 1 } },
	{ "json", DTE_LAYOUT_SINK, 0, 1, "declarative pieces (gen_json.c)", 0, { NULL }, { 0 } },
};
#define DESC_NKINDS (sizeof(desc_kinds) / sizeof(desc_kinds[0]))

/* Refused by name wherever they appear (a value of 1 is accepted: no
 * parallelism of that kind). */
static const struct dte_layout_refused desc_refused[] = {
	{ "pp", "pipeline parallelism" },
	{ "cp", "context parallelism" },
};
#define DESC_NREFUSED (sizeof(desc_refused) / sizeof(desc_refused[0]))

const struct dte_layout_kind *dte_layout_kinds(size_t *n)
{
	*n = DESC_NKINDS;
	return desc_kinds;
}

const struct dte_layout_refused *dte_layout_refused_keys(size_t *n)
{
	*n = DESC_NREFUSED;
	return desc_refused;
}

/* Every option is a parallel degree, an index or a flag: bounding them here
 * keeps the generators' products (tp*dp, ep*etp, ...) far from overflow. */
#define DESC_MAX_VALUE (INT64_C(1) << 20)

/* Parses "k=v,k=v" against the kind's keys into val[] (defaults first);
 * every key must be known and an integer in [0, DESC_MAX_VALUE]. */
static int desc_parse_kv(const struct dte_layout_kind *k, const char *s, int64_t *val,
			 char *err, size_t errlen)
{
	char buf[256], *save = NULL, *tok;
	const char *who = k->name;
	size_t i;

	for (i = 0; i < k->nkeys; i++)
		val[i] = k->defaults[i];
	if (strlen(s) >= sizeof(buf))
		return dte_layout_err(err, errlen, "%s: options too long", who);
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '='), *end;
		long long v;
		size_t r;
		if (!eq)
			return dte_layout_err(err, errlen, "%s: option \"%s\" is not key=value", who, tok);
		*eq = 0;
		for (i = 0; i < k->nkeys; i++)
			if (!strcmp(tok, k->keys[i]))
				break;
		for (r = 0; i == k->nkeys && r < DESC_NREFUSED; r++)
			if (!strcmp(tok, desc_refused[r].key))
				break;
		errno = 0;
		v = strtoll(eq + 1, &end, 10);
		if (i == k->nkeys && r < DESC_NREFUSED && !(errno == 0 && end != eq + 1 && !*end && v == 1))
			return dte_layout_err(err, errlen, "%s: unknown option \"%s\" (%s is not supported)",
					      who, tok, desc_refused[r].what);
		if (i == k->nkeys && r < DESC_NREFUSED)
			continue;    /* pp=1, cp=1: none */
		if (i == k->nkeys)
			return dte_layout_err(err, errlen, "%s: unknown option \"%s\"", who, tok);
		if (errno || end == eq + 1 || *end)
			return dte_layout_err(err, errlen, "%s: %s=\"%s\" is not an integer", who, tok, eq + 1);
		if (v < 0 || v > DESC_MAX_VALUE)
			return dte_layout_err(err, errlen, "%s: %s=%lld is out of range [0, %lld]", who, tok,
					      v, (long long)DESC_MAX_VALUE);
		val[i] = v;
	}
	return 0;
}

/* The error for a kind not in the table: what the role has. */
static int desc_unknown(int source, size_t len, const char *desc, char *err, size_t errlen)
{
	char list[512];
	size_t i, j, n = 0;

	list[0] = 0;
	for (i = 0; i < DESC_NKINDS && n < sizeof(list); i++) {
		const struct dte_layout_kind *k = &desc_kinds[i];
		int w;
		if (k->role != (source ? DTE_LAYOUT_SOURCE : DTE_LAYOUT_SINK))
			continue;
		w = snprintf(list + n, sizeof(list) - n, "%s%s:%s", n ? " " : "", k->name,
			     k->file ? "FILE" : "");
		for (j = 0; w >= 0 && j < k->nkeys && n + (size_t)w < sizeof(list); j++)
			w += snprintf(list + n + w, sizeof(list) - n - (size_t)w, "%s%s=", j ? "," : "",
				      k->keys[j]);
		if (w < 0)
			break;
		n += (size_t)w;
	}
	return dte_layout_err(err, errlen, "unknown %s layout \"%.*s\"; %s: %s", source ? "source" : "sink",
			      (int)len, desc, source ? "sources" : "sinks", list);
}

int dte_layout_desc_sharded(const char *desc)
{
	return !strncmp(desc, "mcore:", 6) || !strcmp(desc, "mcore") ||
	       !strncmp(desc, "fsdp2:", 6) || !strcmp(desc, "fsdp2");
}

int dte_layout_from_desc(struct dte_layout *l, const struct dte_spec *spec,
			 const char *desc, int role, char *err, size_t errlen)
{
	return dte_layout_from_desc_shards(l, spec, desc, role, NULL, err, errlen);
}

static int desc_layout(struct dte_layout *l, const struct dte_spec *spec, const char *desc,
		       int role, const char *shards, int plan_only, char *err, size_t errlen);

int dte_layout_from_desc_shards(struct dte_layout *l, const struct dte_spec *spec,
				const char *desc, int role, const char *shards, char *err,
				size_t errlen)
{
	return desc_layout(l, spec, desc, role, shards, 0, err, errlen);
}

int dte_layout_from_desc_plan(struct dte_layout *l, const struct dte_spec *spec,
			      const char *desc, int role, const char *shards, char *err,
			      size_t errlen)
{
	return desc_layout(l, spec, desc, role, shards, 1, err, errlen);
}

static int desc_layout(struct dte_layout *l, const struct dte_spec *spec, const char *desc,
		       int role, const char *shards, int plan_only, char *err, size_t errlen)
{
	const char *colon = strchr(desc, ':');
	const char *opts = colon ? colon + 1 : "";
	size_t len = colon ? (size_t)(colon - desc) : strlen(desc), i;
	int source = role == DTE_LAYOUT_SOURCE;
	const struct dte_layout_kind *k = NULL;
	int64_t v[DTE_LAYOUT_KIND_MAX_KEYS];
	const struct dte_spec *canon = spec;
	struct dte_spec rt;
	int rc;

	/* FP32 tensors are carried as halves (spec.h): the generators map the
	 * runtime tensors as the engines and trainers allocate them, on the
	 * spec's runtime view, and dte_layout_halves carries their pieces
	 * over.  A json: layout is written in the canonical coordinates.  A
	 * rule (a plan-only fsdp: layout) is not carried over: the arrays. */
	dte_layout_init(l, role, spec->hash);
	l->no_tensors = plan_only;
	memset(&rt, 0, sizeof(rt));
	if (spec->halves && strncmp(desc, "json:", 5)) {
		if (dte_spec_runtime(spec, &rt))
			return dte_layout_err(err, errlen, "out of memory");
		spec = &rt;
		plan_only = 0;
	}
	for (i = 0; i < DESC_NKINDS && !k; i++)
		if (desc_kinds[i].role == (source ? DTE_LAYOUT_SOURCE : DTE_LAYOUT_SINK) &&
		    strlen(desc_kinds[i].name) == len && !strncmp(desc, desc_kinds[i].name, len))
			k = &desc_kinds[i];
#define IS(n) (!strcmp(k->name, n))
	if (!k) {
		rc = desc_unknown(source, len, desc, err, errlen);
	} else if (k->file) {
		rc = dte_layout_load_json(l, spec, opts, err, errlen);
	} else if ((rc = desc_parse_kv(k, opts, v, err, errlen))) {
		;
	} else if (IS("megatron")) {
		struct dte_megatron_cfg c = { v[0], v[1], v[2], v[3], v[4] != 0 };
		if (c.etp < 0)
			rc = dte_layout_err(err, errlen, "megatron: etp must be >= 1");
		if (!rc)
			rc = dte_layout_megatron(l, spec, &c, err, errlen);
	} else if (IS("mcore") || IS("fsdp2")) {
		struct dte_shards_cfg c;
		struct dte_shard *sh = NULL;
		size_t nsh = 0;
		int64_t dp;

		memset(&c, 0, sizeof(c));
		c.megatron = IS("mcore");
		c.mg.tp = c.mg.ep = 1;
		if (c.megatron) {
			c.mg.tp = v[0];
			dp = v[1];
			c.mg.ep = v[2];
			c.mg.etp = v[3];
		} else {
			dp = v[0];
		}
		c.mg.dp = dp;
		if (dp < 1 || dp > 65536 || c.mg.tp < 1 || c.mg.tp > 4096 || c.mg.etp < 0)
			rc = dte_layout_err(err, errlen, "%s: dp in [1, 65536], tp in [1, 4096], etp >= 0",
					    k->name);
		c.ranks = c.megatron ? c.mg.tp * dp : dp;
		if (!rc)
			snprintf(l->desc, sizeof(l->desc), "%.*s", (int)(sizeof(l->desc) - 1), desc);
		if (!rc)
			rc = dte_shards_parse(shards, &sh, &nsh, err, errlen);
		if (!rc)
			rc = dte_layout_shards(l, spec, &c, sh, nsh, err, errlen);
		free(sh);
	} else if (IS("fsdp")) {
		struct dte_fsdp_cfg c = { v[0], plan_only };
		rc = dte_layout_fsdp(l, spec, &c, err, errlen);
	} else if (IS("sglang") || IS("vllm")) {
		struct dte_infer_cfg c = { v[0], v[1], v[2], IS("vllm") ? v[3] : 1 };
		rc = IS("vllm") ? dte_layout_vllm(l, spec, &c, err, errlen)
				: dte_layout_sglang(l, spec, &c, err, errlen);
	} else {
		rc = dte_layout_err(err, errlen, "%s: no generator for this layout", k->name);
	}
#undef IS
	if (!rc && spec != canon)
		rc = dte_layout_halves(l, canon, err, errlen);
	if (spec != canon)
		dte_spec_runtime_fini(&rt);
	if (rc)
		dte_layout_fini(l);
	return rc;
}
