/* daemon/layout/plan_cli.c — `dtectl plan`: a dry run of a transfer plan
 * from a config.json and two layout descriptions; needs no daemon.
 *
 * Stable output lines (tests match them):
 *   coverage: exact
 *   entries: N            (one replica)
 *   detections: D
 *   replication: replicas=R entries=N*R detections=D shared=S factor=F
 *   link A->B: entries=.. elements=.. dense_bytes=.. sparse_bytes=..
 *   total: elements=.. dense_bytes=.. sparse_bytes=..
 * Sparse bytes estimate (2 B position + 2 B BF16 value) per changed element
 * at --density; dense is 2 B per element.  An invalid plan prints
 * "coverage: invalid" and the reason on stderr, exit 1; usage errors exit 2.
 *
 * `--supported` (no other option but --json) lists what the layout code
 * knows, from its own tables (spec.c's families, desc.c's layout kinds and
 * refused keys); docs/SUPPORTED.md is checked against it:
 *   family: NAME arch=ARCH attention_bias=0|1 qk_norm=0|1 moe=0|1
 *   source: NAME keys=k=default,.. sharded=0|1 -- what
 *   sink: NAME keys=... sharded=0 -- what
 *   refused: KEY -- what
 *   supported: families=F sources=S sinks=K refused=R
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "daemon/layout/gen.h"
#include "daemon/layout/plan.h"
#include "daemon/layout/plan_cli.h"

#define PLAN_SPARSE_BYTES_PER_ELEM 4.0
#define PLAN_DENSE_BYTES_PER_ELEM  2

struct plan_args {
	const char *model, *source, *sink, *shards;
	uint32_t    replicas, rpn;
	double      density;
	int         json, dump, supported;
};

static void plan_usage(FILE *f)
{
	fprintf(f,
		"usage: dtectl plan --model CONFIG.json --source SRC --sink SINK\n"
		"                   [--sink-replicas N] [--ranks-per-node N] [--density D]\n"
		"                   [--json [--dump-entries]] [--shards FILE]\n"
		"       dtectl plan --supported [--json]   (model families and layouts known)\n"
		"  SRC:  megatron:tp=T,dp=D[,ep=E,etp=X,dopt=0|1] | fsdp:dp=D | json:FILE\n"
		"        mcore:tp=T,dp=D[,ep=E,etp=X] | fsdp2:dp=D  (with --shards: the\n"
		"        registered shards, lines \"rank group lo hi name d0[,d1..]\")\n"
		"  SINK: sglang:tp=T[,ep=E] | vllm:tp=T[,ep=1|T] | json:FILE\n");
}

static int plan_u32(const char *opt, const char *v, uint32_t max, uint32_t *out)
{
	char *end;
	unsigned long long x;

	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || end == v || *end || x < 1 || x > max) {
		fprintf(stderr, "dtectl plan: %s needs an integer in [1, %u], not \"%s\"\n", opt, max, v);
		return -1;
	}
	*out = (uint32_t)x;
	return 0;
}

static int plan_parse(struct plan_args *a, int argc, char **argv)
{
	int i;

	memset(a, 0, sizeof(*a));
	a->replicas = 1;
	a->rpn = DTE_PLAN_DEFAULT_RANKS_PER_NODE;
	a->density = 0.02;
	for (i = 1; i < argc; i++) {
		const char *o = argv[i], *v = NULL, *eq = strchr(o, '=');
		char name[32];
		size_t n = eq ? (size_t)(eq - o) : strlen(o);
		if (n >= sizeof(name))
			n = sizeof(name) - 1;
		memcpy(name, o, n);
		name[n] = 0;
		if (!strcmp(name, "--json")) {
			a->json = 1;
			continue;
		}
		if (!strcmp(name, "--dump-entries")) {
			a->dump = 1;
			continue;
		}
		if (!strcmp(name, "--supported")) {
			a->supported = 1;
			continue;
		}
		if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
			plan_usage(stdout);
			return 1;
		}
		if (eq)
			v = eq + 1;
		else if (i + 1 < argc)
			v = argv[++i];
		if (!v) {
			fprintf(stderr, "dtectl plan: %s needs a value\n", name);
			return -1;
		}
		if (!strcmp(name, "--model")) {
			a->model = v;
		} else if (!strcmp(name, "--source")) {
			a->source = v;
		} else if (!strcmp(name, "--sink")) {
			a->sink = v;
		} else if (!strcmp(name, "--shards")) {
			a->shards = v;
		} else if (!strcmp(name, "--sink-replicas")) {
			if (plan_u32(name, v, 65536, &a->replicas))
				return -1;
		} else if (!strcmp(name, "--ranks-per-node")) {
			if (plan_u32(name, v, 65536, &a->rpn))
				return -1;
		} else if (!strcmp(name, "--density")) {
			char *end;
			errno = 0;
			a->density = strtod(v, &end);
			if (errno || end == v || *end || !(a->density >= 0 && a->density <= 1)) {
				fprintf(stderr, "dtectl plan: --density needs a number in [0, 1], not \"%s\"\n", v);
				return -1;
			}
		} else {
			fprintf(stderr, "dtectl plan: unknown option \"%s\"\n", o);
			return -1;
		}
	}
	if (a->supported) {
		if (a->model || a->source || a->sink || a->shards || a->dump) {
			fprintf(stderr, "dtectl plan: --supported takes no other option but --json\n");
			return -1;
		}
		return 0;
	}
	if (!a->model || !a->source || !a->sink) {
		fprintf(stderr, "dtectl plan: --model, --source and --sink are required\n");
		return -1;
	}
	if (a->dump && !a->json) {
		fprintf(stderr, "dtectl plan: --dump-entries needs --json (the entries are listed "
			"in the JSON output)\n");
		return -1;
	}
	if (dte_layout_desc_sharded(a->source) && !a->shards) {
		fprintf(stderr, "dtectl plan: source %s needs --shards FILE (what each rank's "
			"optimizer holds, lines \"rank group lo hi name d0[,d1..]\")\n", a->source);
		return -1;
	}
	return 0;
}

static uint64_t sparse_bytes(uint64_t elements, double density)
{
	return (uint64_t)llround((double)elements * density * PLAN_SPARSE_BYTES_PER_ELEM);
}

static void plan_print_text(const struct plan_args *a, const struct dte_spec *spec,
			    const struct dte_layout *src, const struct dte_layout *sink,
			    const struct dte_plan *p)
{
	size_t i, nl = p->nlinks * p->sink_replicas;
	uint64_t total = (uint64_t)p->elements * p->sink_replicas;

	/* Elements are 16-bit units: an FP32 tensor counts its halves. */
	printf("model: type=%s tensors=%u elements=%lld spec_hash=%016" PRIx64 "%s%.0u\n",
	       spec->cfg.model_type, spec->n, (long long)spec->total_elems, spec->hash,
	       spec->halves ? " fp32_tensors=" : "", spec->halves);
	printf("source: %s ranks=%u pieces=%zu nodes=%u\n", src->desc, src->nranks, src->npieces, p->src_nodes);
	printf("sink: %s ranks=%u pieces=%zu nodes=%u replicas=%u\n", sink->desc, sink->nranks,
	       sink->npieces, p->sink_nodes, p->sink_replicas);
	printf("coverage: exact\n");
	printf("entries: %zu\n", p->n);
	printf("detections: %zu\n", p->ndetect);
	printf("replication: replicas=%u entries=%zu detections=%zu shared=%zu factor=%.2f\n",
	       p->sink_replicas, p->n * p->sink_replicas, p->ndetect, p->shared_entries,
	       p->ndetect ? (double)(p->n * p->sink_replicas) / (double)p->ndetect : 0.0);
	for (i = 0; i < nl; i++) {
		const struct dte_plan_link *l = &p->links[i];
		printf("link %u->%u: entries=%" PRIu64 " elements=%" PRIu64 " dense_bytes=%" PRIu64
		       " sparse_bytes=%" PRIu64 "\n", l->src_node, l->sink_node, l->entries, l->elements,
		       l->elements * PLAN_DENSE_BYTES_PER_ELEM, sparse_bytes(l->elements, a->density));
	}
	printf("total: elements=%" PRIu64 " dense_bytes=%" PRIu64 " sparse_bytes=%" PRIu64 " density=%g\n",
	       total, total * PLAN_DENSE_BYTES_PER_ELEM, sparse_bytes(total, a->density), a->density);
	if (sink->nfp8) {
		struct dte_layout_fp8_use u;

		if (dte_layout_fp8_use(src, sink, spec, &u) == 0)
			printf("fp8: weights=%" PRIu64 " codes=%" PRIu64 " scales=%" PRIu64
			       " dense_bytes=%" PRIu64 " tensors=%" PRIu64 " blocks=%" PRIu64
			       " split_blocks=%" PRIu64 " syncable=%s%s\n", u.weights, u.codes, u.scales,
			       u.codes + 4 * u.scales, u.tensors, u.blocks, u.split,
			       u.split ? "no" : "yes",
			       u.split ? " (blocks no source shard holds whole: dted refuses this "
			       "pair's plan; docs/SYNC.md, \"FP8 sinks\")" : "");
	}
}

static json_t *i64s(const int64_t *v, uint32_t n)
{
	json_t *arr = json_array();
	uint32_t d;

	for (d = 0; d < n; d++)
		json_array_append_new(arr, json_integer(v[d]));
	return arr;
}

static json_t *plan_json_buffers(const struct dte_layout *l)
{
	json_t *arr = json_array();
	size_t i;

	for (i = 0; i < l->nbufs; i++) {
		struct dte_layout_buffer tmp;
		const struct dte_layout_buffer *b = dte_layout_buffer(l, i, &tmp);
		json_array_append_new(arr, json_pack("{s:i, s:i, s:I, s:s}", "rank", (int)b->rank,
						     "id", (int)b->id, "length", (json_int_t)b->length,
						     "name", b->name));
	}
	return arr;
}

static json_t *plan_json_fp8(const struct dte_layout *l)
{
	json_t *arr = json_array();

	for (size_t i = 0; i < l->nfp8; i++) {
		const struct dte_layout_fp8 *f = &l->fp8[i];

		json_array_append_new(arr, json_pack("{s:i, s:i, s:i, s:I, s:I, s:I}", "rank",
						     (int)f->rank, "buf", (int)f->buf, "scale_buf",
						     (int)f->scale_buf, "mats", (json_int_t)f->mats,
						     "rows", (json_int_t)f->rows, "cols", (json_int_t)f->cols));
	}
	return arr;
}

static json_t *plan_json_side(const struct dte_layout *l, uint32_t nodes, int dump)
{
	json_t *o = json_pack("{s:s, s:i, s:I, s:i}", "desc", l->desc, "ranks", (int)l->nranks,
			      "pieces", (json_int_t)l->npieces, "nodes", (int)nodes);
	if (dump)
		json_object_set_new(o, "buffers", plan_json_buffers(l));
	if (dump && l->nfp8)
		json_object_set_new(o, "fp8", plan_json_fp8(l));
	return o;
}

static int plan_print_json(const struct plan_args *a, const struct dte_spec *spec,
			   const struct dte_layout *src, const struct dte_layout *sink,
			   const struct dte_plan *p)
{
	json_t *root, *links = json_array();
	char hash[32];
	size_t i, nl = p->nlinks * p->sink_replicas;
	uint64_t total = (uint64_t)p->elements * p->sink_replicas;
	int rc;

	snprintf(hash, sizeof(hash), "%016" PRIx64, spec->hash);
	for (i = 0; i < nl; i++) {
		const struct dte_plan_link *l = &p->links[i];
		json_array_append_new(links, json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:I}",
			"src_node", (int)l->src_node, "sink_node", (int)l->sink_node,
			"replica", (int)(i / (p->nlinks ? p->nlinks : 1)),
			"entries", (json_int_t)l->entries, "elements", (json_int_t)l->elements,
			"dense_bytes", (json_int_t)(l->elements * PLAN_DENSE_BYTES_PER_ELEM),
			"sparse_bytes", (json_int_t)sparse_bytes(l->elements, a->density)));
	}
	root = json_pack("{s:{s:s, s:i, s:I, s:s, s:i}, s:o, s:o, s:s, s:I, s:I, s:i, s:I, s:o, s:{s:I, s:I, s:I, s:f}}",
		"model", "type", spec->cfg.model_type, "tensors", (int)spec->n,
		"elements", (json_int_t)spec->total_elems, "spec_hash", hash,
		"fp32_tensors", (int)spec->halves,
		"source", plan_json_side(src, p->src_nodes, a->dump),
		"sink", plan_json_side(sink, p->sink_nodes, a->dump),
		"coverage", "exact", "entries", (json_int_t)p->n, "detections", (json_int_t)p->ndetect,
		"replicas", (int)p->sink_replicas, "shared_entries", (json_int_t)p->shared_entries,
		"links", links,
		"total", "elements", (json_int_t)total, "dense_bytes", (json_int_t)(total * PLAN_DENSE_BYTES_PER_ELEM),
		"sparse_bytes", (json_int_t)sparse_bytes(total, a->density), "density", a->density);
	if (!root)
		return -1;
	if (sink->nfp8) {
		struct dte_layout_fp8_use u;

		if (dte_layout_fp8_use(src, sink, spec, &u) == 0)
			json_object_set_new(root, "fp8", json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}",
				"weights", (json_int_t)u.weights, "codes", (json_int_t)u.codes,
				"dense_bytes", (json_int_t)(u.codes + 4 * u.scales),
				"scales", (json_int_t)u.scales,
				"tensors", (json_int_t)u.tensors, "blocks", (json_int_t)u.blocks,
				"split_blocks", (json_int_t)u.split, "syncable", u.split == 0));
	}
	if (a->dump) {
		json_t *ents = json_array(), *names = json_array();
		for (i = 0; i < spec->n; i++)
			json_array_append_new(names, json_string(spec->t[i].name));
		for (i = 0; i < p->n; i++) {
			struct dte_plan_entry ent, *e = &ent;
			uint32_t nd;

			dte_plan_entry(p, i, e);
			nd = e->map.ndim;
			json_array_append_new(ents, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:I, s:o, s:I, s:o}",
				"tensor", (int)e->tensor, "src_rank", (int)e->src_rank, "src_buf", (int)e->src_buf,
				"group", (int)e->group, "sink_rank", (int)e->sink_rank, "sink_buf", (int)e->sink_buf,
				"link", (int)e->link, "detect", (int)e->detect, "ndim", (int)nd,
				"lo", i64s(e->lo, nd), "extent", i64s(e->map.extent, nd),
				"src_offset", (json_int_t)e->map.src_offset, "src_stride", i64s(e->map.src_stride, nd),
				"dst_offset", (json_int_t)e->map.dst_offset, "dst_stride", i64s(e->map.dst_stride, nd)));
		}
		json_object_set_new(root, "tensors", names);
		json_object_set_new(root, "plan_entries", ents);
	}
	rc = json_dumpf(root, stdout, JSON_COMPACT);
	fputc('\n', stdout);
	json_decref(root);
	return rc;
}

/* A whole file as a string (the shard table); NULL with the reason. */
static char *plan_read_file(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t n = 0, cap = 0;

	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	for (;;) {
		size_t got;

		if (cap - n < 4096) {
			char *nb;

			if (cap > ((size_t)1 << 30)) {
				snprintf(err, errlen, "%s: larger than 1 GiB", path);
				goto fail;
			}
			nb = realloc(buf, cap ? cap * 2 : 65536);
			if (!nb) {
				snprintf(err, errlen, "%s: out of memory", path);
				goto fail;
			}
			buf = nb;
			cap = cap ? cap * 2 : 65536;
		}
		got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "%s: read error", path);
		goto fail;
	}
	buf[n] = 0;
	fclose(f);
	return buf;
fail:
	free(buf);
	fclose(f);
	return NULL;
}

/* "tp=1,dp=1,..." (keys with their defaults), "FILE" for json. */
static void plan_kind_keys(const struct dte_layout_kind *k, char *buf, size_t len)
{
	size_t i, n = 0;

	buf[0] = 0;
	if (k->file)
		snprintf(buf, len, "FILE");
	for (i = 0; i < k->nkeys && n < len; i++) {
		int w = snprintf(buf + n, len - n, "%s%s=%lld", i ? "," : "", k->keys[i],
				 (long long)k->defaults[i]);
		if (w < 0)
			break;
		n += (size_t)w;
	}
}

static int plan_supported(int json)
{
	size_t nf, nk, nr, i, j, ns = 0, nsink = 0;
	const struct dte_spec_family *f = dte_spec_families(&nf);
	const struct dte_layout_kind *k = dte_layout_kinds(&nk);
	const struct dte_layout_refused *r = dte_layout_refused_keys(&nr);
	char keys[256];

	if (json) {
		json_t *root = json_object(), *fams = json_array(), *src = json_array(),
		       *sink = json_array(), *ref = json_array();
		int rc;

		for (i = 0; i < nf; i++)
			json_array_append_new(fams, json_pack("{s:s, s:s, s:b, s:b, s:b}",
				"model_type", f[i].model_type, "architecture", f[i].architecture,
				"attention_bias", f[i].attn_bias, "qk_norm", f[i].qk_norm, "moe", f[i].moe));
		for (i = 0; i < nk; i++) {
			json_t *kv = json_object();
			for (j = 0; j < k[i].nkeys; j++)
				json_object_set_new(kv, k[i].keys[j], json_integer(k[i].defaults[j]));
			json_array_append_new(k[i].role == DTE_LAYOUT_SOURCE ? src : sink,
				json_pack("{s:s, s:o, s:b, s:b, s:s}", "name", k[i].name, "keys", kv,
					  "sharded", k[i].sharded, "file", k[i].file, "runtime", k[i].runtime));
		}
		for (i = 0; i < nr; i++)
			json_array_append_new(ref, json_pack("{s:s, s:s}", "key", r[i].key, "what", r[i].what));
		json_object_set_new(root, "families", fams);
		json_object_set_new(root, "sources", src);
		json_object_set_new(root, "sinks", sink);
		json_object_set_new(root, "refused", ref);
		rc = json_dumpf(root, stdout, JSON_COMPACT);
		fputc('\n', stdout);
		json_decref(root);
		return rc ? 1 : 0;
	}
	for (i = 0; i < nf; i++)
		printf("family: %s arch=%s attention_bias=%d qk_norm=%d moe=%d\n", f[i].model_type,
		       f[i].architecture, f[i].attn_bias, f[i].qk_norm, f[i].moe);
	for (i = 0; i < nk; i++) {
		int source = k[i].role == DTE_LAYOUT_SOURCE;
		plan_kind_keys(&k[i], keys, sizeof(keys));
		printf("%s: %s keys=%s sharded=%d -- %s\n", source ? "source" : "sink", k[i].name,
		       keys, k[i].sharded, k[i].runtime);
		if (source)
			ns++;
		else
			nsink++;
	}
	for (i = 0; i < nr; i++)
		printf("refused: %s -- %s\n", r[i].key, r[i].what);
	printf("supported: families=%zu sources=%zu sinks=%zu refused=%zu\n", nf, ns, nsink, nr);
	return 0;
}

int dte_plan_cli(int argc, char **argv)
{
	struct dte_layout src, sink;
	struct dte_plan_opts opts;
	struct plan_args a;
	struct dte_spec spec;
	struct dte_plan plan;
	char err[1024], *shards = NULL;
	int rc;

	rc = plan_parse(&a, argc, argv);
	if (rc) {
		if (rc < 0)
			plan_usage(stderr);
		return rc < 0 ? 2 : 0;
	}
	if (a.supported) {
		rc = plan_supported(a.json);
		return fflush(stdout) ? 1 : rc;
	}
	if (dte_spec_load_file(&spec, a.model, err, sizeof(err))) {
		fprintf(stderr, "dtectl plan: %s\n", err);
		return 1;
	}
	rc = 1;
	if (a.shards && !dte_layout_desc_sharded(a.source)) {
		fprintf(stderr, "dtectl plan: --shards goes with an mcore: or fsdp2: source\n");
		goto out_spec;
	}
	if (a.shards && !(shards = plan_read_file(a.shards, err, sizeof(err)))) {
		fprintf(stderr, "dtectl plan: %s\n", err);
		goto out_spec;
	}
	if (dte_layout_from_desc_plan(&src, &spec, a.source, DTE_LAYOUT_SOURCE, shards, err,
				      sizeof(err))) {
		fprintf(stderr, "dtectl plan: source: %s\n", err);
		goto out_spec;
	}
	if (dte_layout_from_desc_plan(&sink, &spec, a.sink, DTE_LAYOUT_SINK, NULL, err, sizeof(err))) {
		fprintf(stderr, "dtectl plan: sink: %s\n", err);
		goto out_src;
	}
	opts.sink_replicas = a.replicas;
	opts.ranks_per_node = a.rpn;
	/* Only --dump-entries lists the entries: else they are counted. */
	if ((a.dump ? dte_plan_build : dte_plan_count)(&plan, &spec, &src, &sink, &opts, err, sizeof(err))) {
		if (!a.json)
			printf("coverage: invalid\n");
		fprintf(stderr, "dtectl plan: invalid plan: %s\n", err);
		goto out_sink;
	}
	if (a.json) {
		if (plan_print_json(&a, &spec, &src, &sink, &plan))
			fprintf(stderr, "dtectl plan: cannot write JSON\n");
		else
			rc = 0;
	} else {
		plan_print_text(&a, &spec, &src, &sink, &plan);
		rc = 0;
	}
	if (fflush(stdout))
		rc = 1;
	dte_plan_fini(&plan);
out_sink:
	dte_layout_fini(&sink);
out_src:
	dte_layout_fini(&src);
out_spec:
	free(shards);
	dte_spec_fini(&spec);
	return rc;
}
