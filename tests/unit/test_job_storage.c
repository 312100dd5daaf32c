/* A job's storage transport (daemon/job_storage.c): JobCreate's storage
 * fields (defaults and refusals), the canonical layout the writer plans
 * with, which participants each side accepts, writer and reader jobs
 * in-process, and the library pieces it added (bare keyframe at head+1,
 * keyframe requests).  Real files in a temporary directory. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <unistd.h>
#include <cmocka.h>
#include "tests/unit/slurp.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/job_storage.h"
#include "daemon/layout/layout.h"
#include "daemon/layout/plan.h"
#include "daemon/log.h"
#include "daemon/route.h"
#include "daemon/storage/storage.h"
#include "gpu/backend.h"

/* The engine under test: the test's own instance (job.h). */
static struct dte_engine *eng;

static uv_loop_t loop;
static char *config;
static struct dte_spec spec;
static char root[256];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

static struct jcreate_args req(const char *name, const char *transport, const char *rootp,
			       const char *role)
{
	struct jcreate_args rq = { 0 };

	rq.name = name;
	rq.model_config = config;
	rq.token = "t";
	rq.coordinator = "local";
	rq.transport = transport;
	rq.storage_root = rootp;
	rq.storage_role = role;
	return rq;
}

static void parse_fields(void **state)
{
	struct jstore_cfg c;
	char err[256];
	struct jcreate_args rq = req("j", "storage", "/x/y", NULL);

	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), 0);
	assert_int_equal(c.transport, JSTORE_STORAGE);
	assert_false(c.reader);
	assert_int_equal(c.keyframe_every, 10);
	assert_int_equal(c.keep_versions, 32);
	assert_int_equal(c.keep_keyframes, 2);
	assert_string_equal(c.root, "/x/y");
	rq = req("j", NULL, NULL, NULL);
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), 0);
	assert_int_equal(c.transport, JSTORE_UCX);
	rq = req("j", "carrier-pigeon", "/x", NULL);
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unknown"));
	rq = req("j", "storage", NULL, NULL);
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "storage_root"));
	rq = req("j", "both", "relative/dir", NULL);
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), -EINVAL);
	/* Reader with transport both: the relay reader (one per cluster). */
	rq = req("j", "both", "/x", "reader");
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), 0);
	assert_true(c.reader && c.relay);
	rq = req("j", "storage", "/x", "reader");
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), 0);
	assert_true(c.reader && !c.relay);
	rq = req("j", "both", "/x", "writer");
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), 0);
	assert_true(!c.reader && !c.relay);
	rq = req("j", "storage", "/x", "spectator");
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), -EINVAL);
	rq = req("j", "storage", "/x", "reader");
	rq.storage_watch = "telepathy";
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), -EINVAL);
	rq.storage_watch = "poll";
	assert_int_equal(jstore_parse(&rq, &c, err, sizeof(err)), 0);
	assert_true(c.reader);
}

static void canonical_layout(void **state)
{
	struct dte_layout l;
	char err[256];
	int64_t off = 0;

	assert_int_equal(jstore_canonical_layout(&spec, JROLE_SINK, &l, err, sizeof(err)), 0);
	assert_int_equal(dte_layout_validate(&l, &spec, err, sizeof(err)), 0);
	assert_int_equal(l.npieces, spec.n);
	assert_int_equal(l.nbufs, 1);
	assert_int_equal(l.bufs[0].length, spec.total_elems);
	for (uint32_t t = 0; t < spec.n; t++) {
		const struct dte_piece *p = &l.pieces[t];

		assert_int_equal(p->tensor, t);
		assert_int_equal(p->offset, off);
		assert_int_equal(p->stride[p->ndim - 1], 1);
		assert_int_equal(dte_piece_volume(p), spec.t[t].numel);
		off += spec.t[t].numel;
	}
	dte_layout_fini(&l);
}

/* The relay reader's source (canonical, FP32, no optimizer state): every
 * BF16 tensor one FP32 element per element, every FP32 tensor its halves
 * as 16-bit units of its elements; valid, and planned to an engine's
 * layout exactly as a generator's source is (the same sink elements). */
static void canonical_source_layout(void **state)
{
	struct dte_spec g;
	struct dte_layout src, fsdp, sink;
	struct dte_plan p, q;
	char err[256];
	int64_t floats = 0, halves = 0;

	/* GLM-4.5's structure at small dims: its e_score_correction_bias
	 * is an FP32 tensor (carried as halves). */
	char *glm = slurp("tests/data/layout/tiny-glm4-moe.json");

	assert_int_equal(dte_spec_load_string(&g, glm, err, sizeof(err)), 0);
	free(glm);
	assert_int_equal(jstore_canonical_layout(&g, JROLE_SOURCE, &src, err, sizeof(err)), 0);
	assert_int_equal(src.role, DTE_LAYOUT_SOURCE);
	assert_int_equal(dte_layout_validate(&src, &g, err, sizeof(err)), 0);
	for (uint32_t t = 0; t < g.n; t++) {
		const struct dte_piece *pc = &src.pieces[t];

		assert_int_equal(pc->buf, 0);
		assert_int_equal(pc->buf_m, 0);	/* no optimizer state: θ's id */
		assert_int_equal(pc->buf_v, 0);
		if (dte_spec_is_halves(&g, t)) {
			halves++;
			assert_int_equal(pc->offset, 2 * floats);	/* 16-bit units */
			assert_int_equal(pc->hi[pc->ndim - 1], 2);
			floats += g.t[t].numel / 2;
		} else {
			assert_int_equal(pc->offset, floats);
			floats += g.t[t].numel;
		}
	}
	assert_true(halves > 0);	/* the spec has FP32 tensors to carry */
	assert_int_equal(src.bufs[0].length, floats);
	assert_int_equal(dte_layout_from_desc(&sink, &g, "sglang:tp=2", DTE_LAYOUT_SINK, err,
					      sizeof(err)), 0);
	assert_int_equal(dte_layout_from_desc(&fsdp, &g, "fsdp:dp=2", DTE_LAYOUT_SOURCE, err,
					      sizeof(err)), 0);
	assert_int_equal(dte_plan_build(&p, &g, &src, &sink, NULL, err, sizeof(err)), 0);
	assert_int_equal(dte_plan_build(&q, &g, &fsdp, &sink, NULL, err, sizeof(err)), 0);
	assert_int_equal(p.elements, q.elements);
	assert_int_equal(p.detect_elements, g.total_elems);
	dte_plan_fini(&p);
	dte_plan_fini(&q);
	dte_layout_fini(&src);
	dte_layout_fini(&fsdp);
	dte_layout_fini(&sink);
	dte_spec_fini(&g);
}

static void writer_and_reader_jobs(void **state)
{
	struct jcreate_args rq = req("w", "storage", root, NULL);
	struct jcreate_res rep = { 0 };
	struct jjob_info info = { 0 };
	struct job *j;
	struct jlocal *l;
	char err[512];

	assert_int_equal(job_create(eng, &rq, &rep, err, sizeof(err)), 0);
	j = job_find(eng, "w");
	assert_non_null(j);
	/* The writer's canonical sink is a participant of its own. */
	l = j->locals;
	assert_non_null(l);
	assert_string_equal(l->info.layout, JSTORE_CANON_LAYOUT);
	assert_int_equal(l->nbufs, 1);
	assert_int_equal(l->bufs[0]->length, (uint64_t)spec.total_elems);
	jstore_info(j, &info);
	assert_string_equal(info.transport, "storage");
	assert_string_equal(info.storage_role, "writer");
	assert_int_equal(info.storage_head, -1);
	assert_int_equal(jstore_attach_check(j, JROLE_SOURCE, err, sizeof(err)), 0);
	assert_int_equal(jstore_attach_check(j, JROLE_SINK, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "reader"));
	/* Same name, other storage configuration: refused. */
	rq.keyframe_every = 3;
	assert_int_equal(job_create(eng, &rq, &rep, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "storage"));
	rq = req("r", "storage", root, "reader");
	assert_int_equal(job_create(eng, &rq, &rep, err, sizeof(err)), 0);
	j = job_find(eng, "r");
	assert_null(j->locals);
	assert_int_equal(jstore_attach_check(j, JROLE_SINK, err, sizeof(err)), 0);
	assert_int_equal(jstore_attach_check(j, JROLE_SOURCE, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "sources"));
	/* A reader writes stored BF16 into its sinks' pieces: an FP8 sink's
	 * codes and scales are a source's to compute, so it is refused; the
	 * writer's job (fed over UCX) takes it. */
	assert_int_equal(jstore_fp8_check(j, err, sizeof(err)), -EOPNOTSUPP);
	assert_non_null(strstr(err, "FP8 sink"));
	assert_int_equal(jstore_fp8_check(job_find(eng, "w"), err, sizeof(err)), 0);
	/* A root that cannot be made: the job is not created. */
	rq = req("bad", "storage", "/proc/no/such/dir", "reader");
	assert_int_equal(job_create(eng, &rq, &rep, err, sizeof(err)), -EINVAL);
	assert_null(job_find(eng, "bad"));
	/* A relay reader (reader, transport both) on its coordinator: its own
	 * canonical source, FP32, detect snapshot (adamw refused); sinks and
	 * FP8 sinks welcome, sources not, nor a client's canonical layout. */
	rq = req("rr", "both", root, "reader");
	rq.detect = "adamw";
	assert_int_equal(job_create(eng, &rq, &rep, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "snapshot"));
	rq.detect = NULL;
	assert_int_equal(job_create(eng, &rq, &rep, err, sizeof(err)), 0);
	j = job_find(eng, "rr");
	assert_non_null(j);
	assert_int_equal(j->detect, JDETECT_SNAPSHOT);
	l = j->locals;
	assert_non_null(l);
	assert_null(l->next);
	assert_int_equal(l->info.role, JROLE_SOURCE);
	assert_string_equal(l->info.layout, JSTORE_CANON_LAYOUT);
	assert_int_equal(l->nbufs, 1);
	assert_int_equal(l->bufs[0]->dtype, DBUF_FP32);
	assert_int_equal(l->bufs[0]->length, (uint64_t)spec.total_elems);
	jstore_info(j, &info);
	assert_string_equal(info.transport, "both");
	assert_string_equal(info.storage_role, "relay reader");
	assert_int_equal(jstore_attach_check(j, JROLE_SINK, err, sizeof(err)), 0);
	assert_int_equal(jstore_attach_check(j, JROLE_SOURCE, err, sizeof(err)), -EINVAL);
	assert_int_equal(jstore_fp8_check(j, err, sizeof(err)), 0);
	for (int i = 0; i < 20; i++)
		uv_run(&loop, UV_RUN_NOWAIT);
}

static void bare_keyframe_and_requests(void **state)
{
	uint64_t numel[2] = { 5, 7 };
	struct dts_writer_cfg wc = { root, "lib", { 0x42, 2, numel }, 0, 0, 0 };
	struct dts_writer *w;
	struct dts_version *v;
	uint16_t val[7] = { 1, 2, 3, 4, 5, 6, 7 };
	uint64_t pos = 2;
	char err[256];

	assert_int_equal(dts_writer_open(&w, &wc, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_begin(w, 1, 0, err, sizeof(err)), 0);
	assert_true(dts_writer_needs_dense(w));
	assert_int_equal(dts_writer_put_dense(w, 0, val, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_put_dense(w, 1, val, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_commit(w, err, sizeof(err)), 0);
	/* v2 a delta, unless a request or NOBASE says otherwise. */
	assert_int_equal(dts_keyframe_take(root, "lib"), 0);
	assert_int_equal(dts_keyframe_request(root, "lib", err, sizeof(err)), 0);
	assert_int_equal(dts_keyframe_take(root, "lib"), 1);
	assert_int_equal(dts_keyframe_take(root, "lib"), 0);
	assert_int_equal(dts_writer_begin(w, 2, DTS_BEGIN_NOBASE, err, sizeof(err)), 0);
	assert_false(dts_writer_has_base(w));
	assert_true(dts_writer_needs_dense(w));
	val[0] = 9;
	assert_int_equal(dts_writer_put_dense(w, 0, val, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_put_dense(w, 1, val, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_commit(w, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_begin(w, 3, 0, err, sizeof(err)), 0);
	assert_true(dts_writer_has_base(w));
	assert_int_equal(dts_writer_put_sparse(w, 1, &pos, val, 1, err, sizeof(err)), 0);
	assert_int_equal(dts_writer_commit(w, err, sizeof(err)), 0);
	dts_writer_close(w);
	assert_int_equal(dts_version_load(root, "lib", 2, DTS_PART_KEYFRAME, NULL, &v, err,
					  sizeof(err)), 0);
	assert_int_equal(v->base, -1);
	assert_int_equal(v->t[0].val[0], 9);
	dts_version_free(v);
	assert_int_equal(dts_version_load(root, "lib", 3, DTS_PART_DELTA, NULL, &v, err,
					  sizeof(err)), 0);
	assert_int_equal(v->base, 2);
	assert_int_equal(v->t[1].count, 1);
	assert_int_equal(v->t[1].pos[0], 2);
	dts_version_free(v);
	assert_int_equal(dts_keyframe_request("/nonexistent/root", "lib", err, sizeof(err)) != 0, 1);
	assert_int_not_equal(dts_keyframe_request(root, "../x", err, sizeof(err)), 0);
}

static int setup(void **state)
{
	char err[256];

	dlog_init(DLOG_ERROR);
	snprintf(root, sizeof(root), "/tmp/test_job_storage.XXXXXX");
	if (!mkdtemp(root))
		return -1;
	config = slurp("tests/data/layout/tiny-llama-gqa.json");
	if (dte_spec_load_string(&spec, config, err, sizeof(err)) < 0)
		return -1;
	uv_loop_init(&loop);
	if (route_init(&loop, "unit", "") < 0)
		return -1;
	eng = dte_engine_new(&loop, dtc_backend_cpu(), "cpu");
	return eng ? 0 : -1;
}

static int teardown(void **state)
{
	dte_engine_free(eng);
	eng = NULL;
	route_fini();
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
	dte_spec_fini(&spec);
	free(config);
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parse_fields),
		cmocka_unit_test(canonical_layout),
		cmocka_unit_test(canonical_source_layout),
		cmocka_unit_test(writer_and_reader_jobs),
		cmocka_unit_test(bare_keyframe_and_requests),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
