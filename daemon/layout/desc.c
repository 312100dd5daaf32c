/* daemon/layout/desc.c — "runtime:key=value,..." strings to layouts, as
 * `dtectl plan --source/--sink` and job configs spell them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/gen.h"

struct desc_key {
	const char *name;
	int64_t    *val;
};

/* Every option is a parallel degree, an index or a flag: bounding them here
 * keeps the generators' products (tp*dp, ep*etp, ...) far from overflow. */
#define DESC_MAX_VALUE (INT64_C(1) << 20)

/* Parses "k=v,k=v" against keys; every key must be known and an integer in
 * [0, DESC_MAX_VALUE]. */
static int desc_parse_kv(const char *who, const char *s, struct desc_key *keys, size_t nkeys,
			 char *err, size_t errlen)
{
	char buf[256], *save = NULL, *tok;
	size_t i;

	if (strlen(s) >= sizeof(buf))
		return dte_layout_err(err, errlen, "%s: options too long", who);
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '='), *end;
		long long v;
		if (!eq)
			return dte_layout_err(err, errlen, "%s: option \"%s\" is not key=value", who, tok);
		*eq = 0;
		for (i = 0; i < nkeys; i++)
			if (!strcmp(tok, keys[i].name))
				break;
		if (i == nkeys)
			return dte_layout_err(err, errlen, "%s: unknown option \"%s\"", who, tok);
		errno = 0;
		v = strtoll(eq + 1, &end, 10);
		if (errno || end == eq + 1 || *end)
			return dte_layout_err(err, errlen, "%s: %s=\"%s\" is not an integer", who, tok, eq + 1);
		if (v < 0 || v > DESC_MAX_VALUE)
			return dte_layout_err(err, errlen, "%s: %s=%lld is out of range [0, %lld]", who, tok,
					      v, (long long)DESC_MAX_VALUE);
		*keys[i].val = v;
	}
	return 0;
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

int dte_layout_from_desc_shards(struct dte_layout *l, const struct dte_spec *spec,
				const char *desc, int role, const char *shards, char *err,
				size_t errlen)
{
	const char *colon = strchr(desc, ':');
	const char *opts = colon ? colon + 1 : "";
	size_t kind = colon ? (size_t)(colon - desc) : strlen(desc);
	int source = role == DTE_LAYOUT_SOURCE;
	int rc;

	dte_layout_init(l, role, spec->hash);
#define IS(k) (kind == strlen(k) && !strncmp(desc, k, kind))
	if (IS("json")) {
		rc = dte_layout_load_json(l, spec, opts, err, errlen);
	} else if (IS("megatron") && source) {
		struct dte_megatron_cfg c = { 1, 1, 1, 0, 1 };
		int64_t dopt = 1;
		struct desc_key k[] = { { "tp", &c.tp }, { "dp", &c.dp }, { "ep", &c.ep },
					{ "etp", &c.etp }, { "dopt", &dopt } };
		rc = desc_parse_kv("megatron", opts, k, 5, err, errlen);
		c.dist_opt = dopt != 0;
		if (!rc && c.etp < 0)
			rc = dte_layout_err(err, errlen, "megatron: etp must be >= 1");
		if (!rc)
			rc = dte_layout_megatron(l, spec, &c, err, errlen);
	} else if ((IS("mcore") || IS("fsdp2")) && source) {
		struct dte_shards_cfg c;
		struct dte_shard *sh = NULL;
		size_t nsh = 0;
		int64_t dp = 1;
		struct desc_key k[] = { { "dp", &dp }, { "tp", &c.mg.tp }, { "ep", &c.mg.ep },
					{ "etp", &c.mg.etp } };

		memset(&c, 0, sizeof(c));
		c.megatron = IS("mcore");
		c.mg.tp = c.mg.ep = 1;
		rc = desc_parse_kv(c.megatron ? "mcore" : "fsdp2", opts, k, c.megatron ? 4 : 1, err,
				   errlen);
		c.mg.dp = dp;
		if (!rc && (dp < 1 || dp > 65536 || c.mg.tp < 1 || c.mg.tp > 4096 || c.mg.etp < 0))
			rc = dte_layout_err(err, errlen, "%s: dp in [1, 65536], tp in [1, 4096], etp >= 0",
					    c.megatron ? "mcore" : "fsdp2");
		c.ranks = c.megatron ? c.mg.tp * dp : dp;
		if (!rc)
			snprintf(l->desc, sizeof(l->desc), "%.*s", (int)(sizeof(l->desc) - 1), desc);
		if (!rc)
			rc = dte_shards_parse(shards, &sh, &nsh, err, errlen);
		if (!rc)
			rc = dte_layout_shards(l, spec, &c, sh, nsh, err, errlen);
		free(sh);
	} else if (IS("fsdp") && source) {
		struct dte_fsdp_cfg c = { 1 };
		struct desc_key k[] = { { "dp", &c.dp } };
		rc = desc_parse_kv("fsdp", opts, k, 1, err, errlen);
		if (!rc)
			rc = dte_layout_fsdp(l, spec, &c, err, errlen);
	} else if ((IS("sglang") || IS("vllm")) && !source) {
		struct dte_infer_cfg c = { 1, 1 };
		struct desc_key k[] = { { "tp", &c.tp }, { "ep", &c.ep } };
		int vllm = IS("vllm");
		rc = desc_parse_kv(vllm ? "vllm" : "sglang", opts, k, 2, err, errlen);
		if (!rc)
			rc = vllm ? dte_layout_vllm(l, spec, &c, err, errlen)
				  : dte_layout_sglang(l, spec, &c, err, errlen);
	} else {
		rc = dte_layout_err(err, errlen, "unknown %s layout \"%.*s\"; %s", source ? "source" : "sink",
				    (int)kind, desc,
				    source ? "sources: megatron:tp=,dp=[,ep=,etp=,dopt=], fsdp:dp=, "
					     "mcore:tp=,dp=[,ep=,etp=] and fsdp2:dp= (registered shards), json:FILE"
					   : "sinks: sglang:tp=[,ep=], vllm:tp=[,ep=], json:FILE");
	}
#undef IS
	if (rc)
		dte_layout_fini(l);
	return rc;
}
