/* tests/unit/fixture_sync.c — what the fixture's sync tests share
 * (tests/unit/fixture_sync.h). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>
#include <xxhash.h>
#include "tests/unit/slurp.h"
#include "tests/unit/fixture_sync.h"
#include "daemon/buf.h"
#include "daemon/job_state.h"
#include "daemon/log.h"
#include "gpu/backend.h"
#include "adamw_ref.h"
/* Expected sink contents: the same independent mapping as test_job.c. */
#include "tiny_llama_ref.h"

char *fxs_config;
struct dte_spec fxs_spec;
struct fxs_answers ans;
void (*fxs_each_step)(void);

int fxs_setup(void **state)
{
	const char *d = getenv("FX_DEBUG");
	char err[256];

	/* FX_DEBUG=1: every line; FX_DEBUG=warn (a level's name): that level. */
	dlog_init(!d ? DLOG_ERROR : dlog_level_parse(d) >= 0 ? dlog_level_parse(d) : DLOG_DEBUG);
	fxs_config = slurp("tests/data/layout/tiny-llama-gqa.json");
	if (dte_spec_load_string(&fxs_spec, fxs_config, err, sizeof(err)) < 0)
		return -1;
	return 0;
}

static void smap_free(void);

int fxs_teardown(void **state)
{
	smap_free();
	dte_spec_fini(&fxs_spec);
	free(fxs_config);
	return 0;
}

/* ------------------------------------------------------------------ nodes */

struct dte_engine *fxs_engine(struct fx *fx, unsigned i)
{
	struct jcreate_args jc = { .name = "fx", .model_config = fxs_config, .token = "tok" };
	struct jcreate_res jr = { 0 };
	struct dte_engine_io eio;
	struct dte_engine *e;
	char err[512];

	fix_io(fx, i, &eio);
	assert_non_null(e = dte_engine_new_io(&eio, dtc_backend_cpu(), "cpu"));
	jc.coordinator = fix_node_address(fx, 0);
	if (job_create(e, &jc, &jr, err, sizeof(err)))
		fail_msg("job_create on node%u: %s", i, err);
	assert_int_equal(jr.coordinator, i == 0);
	return e;
}

int fxs_pairs_ready(struct dte_engine *const *eng, unsigned n, const struct side *src,
		    const struct side *sinks)
{
	struct job *j0 = job_find(eng[0], "fx");

	if (!j0 || !j0->complete)
		return 0;
	for (unsigned k = 1; k < n; k++) {
		struct job *jk = job_find(eng[k], "fx");

		if (!jk || !jk->complete || !job_pair(j0, src->participant, sinks[k].participant) ||
		    !job_pair(jk, src->participant, sinks[k].participant))
			return 0;
	}
	return 1;
}

/* ------------------------------------------------------------------ sides */

static void side_add(struct side *sd, size_t i, uint64_t conn, uint64_t length)
{
	char err[256];
	int fd = dup(sd->fds[i]);

	assert_true(fd >= 0);
	assert_int_equal(dbuf_register_fd(conn, fd, 0, length,
					  sd->role == DTE_LAYOUT_SOURCE ? DBUF_FP32 : DBUF_BF16,
					  sd->names[i], &sd->ids[i], err, sizeof(err)), 0);
}

void side_register(struct side *sd, uint64_t conn, const char *desc, int role)
{
	struct dte_layout l;
	char err[256];

	assert_int_equal(dte_layout_from_desc(&l, &fxs_spec, desc, role, err, sizeof(err)), 0);
	memset(sd, 0, sizeof(*sd));
	sd->role = role;
	for (size_t i = 0; i < l.nbufs; i++) {
		size_t es = role == DTE_LAYOUT_SOURCE ? 4 : 2, bytes;
		int fd;

		if (l.bufs[i].rank != 0)
			continue;
		bytes = (size_t)l.bufs[i].length * es;
		fd = memfd_create("fx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
		sd->mem[sd->n] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		assert_true(sd->mem[sd->n] != MAP_FAILED);
		sd->bytes[sd->n] = bytes;
		sd->fds[sd->n] = fd;
		sd->layout_ids[sd->n] = l.bufs[i].id;
		snprintf(sd->names[sd->n], sizeof(sd->names[sd->n]), "%s", l.bufs[i].name);
		side_add(sd, sd->n, conn, (uint64_t)l.bufs[i].length);
		sd->n++;
	}
	dte_layout_fini(&l);
}

void side_reregister(struct side *sd, uint64_t conn)
{
	for (size_t i = 0; i < sd->n; i++)
		side_add(sd, i, conn, sd->bytes[i] / (sd->role == DTE_LAYOUT_SOURCE ? 4 : 2));
}

void side_unmap(struct side *sd)
{
	for (size_t i = 0; i < sd->n; i++) {
		munmap(sd->mem[i], sd->bytes[i]);
		close(sd->fds[i]);
	}
	sd->n = 0;
}

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 65536.0f;
}

double fxs_lr = 1e-3;

struct dtc_hparams hp_of(int64_t step)
{
	struct dtc_hparams hp = { .lr = fxs_lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
				  .weight_decay = 0.0, .step = step, .variant = DTC_VARIANT_TORCH };
	return hp;
}

void adamw_step(struct side *src, int64_t step, unsigned seed)
{
	struct dtc_hparams hp = hp_of(step);
	float *p = src->mem[0], *m = src->mem[1], *v = src->mem[2];
	size_t n = src->bytes[0] / 4;

	for (size_t i = 0; i < n; i++) {
		float g = (frand(&seed) - 0.5f) * 0.02f;

		if (step == 1)
			p[i] = (frand(&seed) - 0.5f) * 0.2f;
		m[i] = m[i] + (float)(1 - hp.beta1) * (g - m[i]);
		v[i] = v[i] * (float)hp.beta2 + (float)(1 - hp.beta2) * g * g;
		p[i] = ref_torch_adamw(p[i], m[i], sqrtf(v[i]), hp.lr, hp.beta1, hp.beta2, hp.eps,
				       hp.weight_decay, step);
	}
}

/* ------------------------------------------------------------------ expected sinks */

/* Where the trainer holds a Megatron parameter element: its buffer
 * (index into src) and element, packed as MAP_AT(b, off). */
#define MAP_AT(b, off) ((uint64_t)(b) << 48 | (uint64_t)(off))
#define MAP_OFF(at) ((at) & ((1ull << 48) - 1))
#define MAP_NONE UINT64_MAX

static uint64_t mg_at(const struct side *src, const struct dte_layout *sl, const struct elref *mg)
{
	static size_t hint;

	for (size_t k = 0; k < sl->ntensors; k++) {
		const struct dte_layout_tensor *t = &sl->tensors[(hint + k) % sl->ntensors];

		if (t->rank || strcmp(t->name, mg->name))
			continue;
		hint = (hint + k) % sl->ntensors;
		for (size_t b = 0; b < src->n; b++)
			if (src->layout_ids[b] == t->buf) {
				int64_t cols = t->ndim > 1 ? t->shape[1] : 1;

				assert_true(mg->r < t->shape[0] && mg->c < cols);
				return MAP_AT(b, t->offset + mg->r * cols + mg->c);
			}
	}
	fail_msg("Megatron parameter %s not in the source layout", mg->name);
	return MAP_NONE;
}

/* Per element of every buffer of an SGLang TP=1 sink, where its value is
 * in the trainer's buffers (MAP_NONE: padding, never written), from the
 * runtimes' own layout rules (tiny_llama_ref.h), not the product's plan.
 * The same for every sink and schedule: made once (the rules read names
 * with sscanf, element by element). */
static struct {
	size_t n;
	uint64_t *at[FXS_MAXB];
	size_t len[FXS_MAXB];
	uint64_t mapped;
} smap;

static void smap_make(const struct side *src, const struct side *k)
{
	struct dte_layout sl;
	char err[256];

	if (smap.n) {
		assert_int_equal(smap.n, k->n);
		return;
	}
	assert_int_equal(dte_layout_from_desc(&sl, &fxs_spec, "megatron:tp=1", DTE_LAYOUT_SOURCE,
					      err, sizeof(err)), 0);
	for (size_t b = 0; b < k->n; b++) {
		int64_t rows = 0, cols = 0;

		if (sg_shape(k->names[b], &rows, &cols))
			fail_msg("sink buffer %s is no SGLang parameter", k->names[b]);
		assert_int_equal(k->bytes[b], (size_t)(rows * cols) * 2);
		smap.len[b] = (size_t)(rows * cols);
		assert_non_null(smap.at[b] = malloc(smap.len[b] * sizeof(uint64_t)));
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = 0; c < cols; c++) {
				struct elref hf, mg;
				uint64_t *at = &smap.at[b][r * cols + c];

				*at = MAP_NONE;
				if (sg_to_hf(k->names[b], r, c, &hf)) {
					hf_to_mg(&hf, &mg);
					*at = mg_at(src, &sl, &mg);
					smap.mapped++;
				}
			}
	}
	smap.n = k->n;
	dte_layout_fini(&sl);
}

static void smap_free(void)
{
	for (size_t b = 0; b < smap.n; b++)
		free(smap.at[b]);
	memset(&smap, 0, sizeof(smap));
}

/* What buffer b of sink k must hold, into want (k->bytes[b] bytes): RNE
 * of the trainer's θ where SGLang holds a model element, zero in the
 * padding. */
static void sink_want(const struct side *src, const struct side *k, size_t b, uint16_t *want)
{
	smap_make(src, k);
	assert_int_equal(smap.len[b] * 2, k->bytes[b]);
	for (size_t i = 0; i < smap.len[b]; i++) {
		uint64_t at = smap.at[b][i];

		want[i] = at == MAP_NONE ? 0 :
			  dtc_bf16_rne(((const float *)src->mem[at >> 48])[MAP_OFF(at)]);
	}
}

uint64_t sink_violations(const struct side *src, const struct side *k)
{
	uint64_t bad = 0, hf_total;

	for (size_t b = 0; b < k->n; b++) {
		const uint16_t *d = k->mem[b];
		uint16_t *want = malloc(k->bytes[b]);

		assert_non_null(want);
		sink_want(src, k, b, want);
		for (size_t i = 0; i < k->bytes[b] / 2; i++)
			if (d[i] != want[i] && bad++ < 3)
				print_message("%s[%zu]: sink %04x want %04x\n", k->names[b], i, d[i],
					      want[i]);
		free(want);
	}
	hf_total = 2ull * M_V * M_H + M_H +
		   M_L * (2ull * M_H + (uint64_t)(M_NQ + 2 * M_NKV) * M_HD * M_H +
			  (uint64_t)M_H * M_NQ * M_HD + 3ull * M_I * M_H);
	assert_int_equal(smap.mapped, hf_total);
	return bad;
}

uint64_t sink_expected_hash(const struct side *src, const struct side *k)
{
	uint64_t h = 0;

	for (size_t b = 0; b < k->n; b++) {
		uint16_t *want = malloc(k->bytes[b]);

		assert_non_null(want);
		sink_want(src, k, b, want);
		h = XXH3_64bits_withSeed(want, k->bytes[b], h);
		free(want);
	}
	return h;
}

uint64_t side_hash(const struct side *k)
{
	uint64_t h = 0;

	for (size_t b = 0; b < k->n; b++)
		h = XXH3_64bits_withSeed(k->mem[b], k->bytes[b], h);
	return h;
}

/* ------------------------------------------------------------------ requests */

void catch_done(const struct jreq *rq, int rc, const char *err, const struct jres *res)
{
	uint32_t id = rq->id & 255;

	ans.seen[id]++;
	ans.rc[id] = rc;
	snprintf(ans.msg[id], sizeof(ans.msg[id]), "%s", err ? err : "");
	if (rc == 0 && res && res->op == JOP_APPLY) {
		ans.apply_version = res->apply.version;
		ans.apply_checksum_ok = res->apply.checksum_ok;
	}
}

static int answered(void *arg)
{
	if (fxs_each_step)
		fxs_each_step();
	return ans.seen[(uintptr_t)arg & 255] > 0;
}

int fxs_await(struct fx *fx, uint32_t id, uint64_t max_steps)
{
	return fix_run_until(fx, answered, (void *)(uintptr_t)id, max_steps);
}

/* A request about to go out: its answer slot cleared. */
static void ans_clear(uint32_t id)
{
	ans.seen[id & 255] = 0;
	ans.rc[id & 255] = 0;
	ans.msg[id & 255][0] = '\0';
}

/* A deferred request's answer: its rc, its reason in err. */
static int deferred_rc(struct fx *fx, uint32_t id, uint64_t max_steps, char *err, size_t errlen)
{
	if (fxs_await(fx, id, max_steps)) {
		snprintf(err, errlen, "request %u not answered in %llu steps", id,
			 (unsigned long long)max_steps);
		return FXS_NOANSWER;
	}
	if (ans.rc[id & 255])
		snprintf(err, errlen, "%s", ans.msg[id & 255]);
	return ans.rc[id & 255];
}

int fxs_attach(struct fx *fx, struct dte_engine *e, struct side *sd, uint64_t conn, uint32_t id,
	       const char *role, const char *desc, uint32_t replica, uint64_t max_steps,
	       char *err, size_t errlen)
{
	struct jattach_args rq = { 0 };
	struct job *j = job_find(e, "fx");
	int deferred = 0, rc;

	rq.job = "fx";
	rq.token = "tok";
	rq.role = role;
	rq.layout = desc;
	rq.n_buffers = sd->n;
	rq.buffers = sd->ids;
	rq.replica = replica;
	ans_clear(id);
	sd->participant = 0;
	if ((rc = job_attach(e, RQ(conn, id), &rq, &deferred, err, errlen)))
		return rc;
	if (deferred && (rc = deferred_rc(fx, id, max_steps, err, errlen)))
		return rc;
	/* The job may have gone meanwhile (its engine restarted): look it up
	 * again. */
	for (struct jlocal *l = (j = job_find(e, "fx")) ? j->locals : NULL; l; l = l->next)
		if (l->owner == conn)
			sd->participant = l->info.id;
	if (!sd->participant) {
		snprintf(err, errlen, "attached, but no participant of connection %llu",
			 (unsigned long long)conn);
		return -ENOENT;
	}
	return 0;
}

int fxs_publish(struct fx *fx, struct dte_engine *e, const struct side *src, uint64_t conn,
		uint32_t id, uint64_t version, int64_t step, uint64_t max_steps, char *err,
		size_t errlen)
{
	struct jpublish_args rq = { 0 };
	struct jpublish_res rep = { 0 };
	struct jhparams g[2];
	struct dtc_hparams hp = hp_of(step);
	int deferred = 0, rc;

	for (int i = 0; i < 2; i++) {
		g[i] = (struct jhparams){ 0 };
		g[i].lr = hp.lr;
		g[i].beta1 = hp.beta1;
		g[i].beta2 = hp.beta2;
		g[i].eps = hp.eps;
		g[i].weight_decay = 0.0;
	}
	rq.job = "fx";
	rq.participant = src->participant;
	rq.version = version;
	rq.step = step;
	rq.n_groups = 2;
	rq.groups = g;
	ans_clear(id);
	if ((rc = job_publish(e, RQ(conn, id), &rq, &rep, &deferred, err, errlen)))
		return rc;
	return deferred ? deferred_rc(fx, id, max_steps, err, errlen) : 0;
}

int fxs_apply(struct fx *fx, struct dte_engine *e, const struct side *k, uint64_t conn, uint32_t id,
	      uint64_t version, struct japply_res *rep, uint64_t max_steps, char *err,
	      size_t errlen)
{
	struct japply_args rq = { 0 };
	int deferred = 0, rc;

	rq.job = "fx";
	rq.participant = k->participant;
	rq.version = version;
	memset(rep, 0, sizeof(*rep));
	ans_clear(id);
	if ((rc = job_apply(e, RQ(conn, id), &rq, rep, &deferred, err, errlen)))
		return rc;
	if (deferred) {
		if ((rc = deferred_rc(fx, id, max_steps, err, errlen)))
			return rc;
		rep->version = ans.apply_version;
		rep->checksum_ok = ans.apply_checksum_ok;
	}
	return 0;
}

int fxs_query(struct dte_engine *e, uint64_t conn, const struct side *k, uint64_t *staged,
	      uint64_t *applied)
{
	struct jquery_res rep = { 0 };
	char err[256];

	if (job_query_version(e, conn, "fx", k->participant, &rep, err, sizeof(err)))
		return -1;
	*staged = rep.staged;
	*applied = rep.applied;
	return 0;
}
