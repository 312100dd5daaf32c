/* tests/unit/test_fixture.c — a real sync between engines in ONE process
 * on deterministic I/O (tests/unit/fixture.h; issue 31).
 *
 * Three engines (node0: coordinator and a Megatron TP=1 source stepping
 * AdamW as torch does, adamw_ref.h; node1 and node2: an SGLang TP=1 sink
 * each, replicas 0 and 1), each on the fixture's stub I/O: a fake clock,
 * timers fired in time order, workers run inline when a step picks them,
 * and a transport that queues every record between the engines with
 * seeded duplicates and reorders (drops too, with FX_DROP).  Buffers are
 * memfds in the process's buffer registry (daemon/buf.h), each node's
 * under an owner of its own.  Every schedule runs the control API as
 * tests/unit/test_job.c does (job_create on every node, attach, publish
 * dense then sparse versions, apply) and checks every element of every
 * sink against RNE(θ) exactly, through the mapping test_job.c writes
 * from Megatron's and SGLang's own layout rules (copied below), not
 * through the product's plan.
 *
 * FX_SCHEDULES (environment) sets how many seeded schedules run (default
 * below), FX_SEED the first seed, FX_DROP/FX_DUP/FX_REORDER the faults'
 * percentages, FX_DEBUG the engines' debug log; it prints
 * "fixture: nodes=N schedules=S steps=K violations=V". */
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
#include "tests/unit/slurp.h"
#include "tests/unit/fixture.h"
#include "daemon/buf.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/layout/layout.h"
#include "daemon/log.h"
#include "gpu/backend.h"
#include "gpu/compute.h"
#include "adamw_ref.h"

#define NODES 3	/* node0: coordinator and source; every other node: a sink */
#define SCHEDULES_DEFAULT 100
#define VERSIONS 3
#define MAXB 64
#define MAX_STEPS 2000000ull
#define STAGE_STEPS 20000ull	/* a version staged, or given up (refused) */
/* Each node's control connection: an owner of its own in the registry. */
#define CONN(node) ((uint64_t)(node) * 100 + 1)
#define SRC_CONN CONN(0)

static char *config;
static struct dte_spec spec;

struct side {
	size_t n;
	uint64_t ids[MAXB];
	uint32_t layout_ids[MAXB];
	void *mem[MAXB];
	size_t bytes[MAXB];
	char names[MAXB][DTE_LAYOUT_NAME_MAX];
	uint64_t participant;
};

static struct side src, sinks[NODES];	/* sinks[k]: node k's (k >= 1) */

/* Expected sink contents: the same independent mapping as test_job.c. */
#include "tiny_llama_ref.h"

/* θ of a Megatron parameter element, where the trainer put it. */
static float mg_theta(const struct dte_layout *sl, const struct elref *mg)
{
	static size_t hint;

	for (size_t k = 0; k < sl->ntensors; k++) {
		const struct dte_layout_tensor *t = &sl->tensors[(hint + k) % sl->ntensors];

		if (t->rank || strcmp(t->name, mg->name))
			continue;
		hint = (hint + k) % sl->ntensors;
		for (size_t b = 0; b < src.n; b++)
			if (src.layout_ids[b] == t->buf) {
				int64_t cols = t->ndim > 1 ? t->shape[1] : 1;

				assert_true(mg->r < t->shape[0] && mg->c < cols);
				return ((const float *)src.mem[b])[t->offset + mg->r * cols + mg->c];
			}
	}
	fail_msg("Megatron parameter %s not in the source layout", mg->name);
	return 0;
}


/* ------------------------------------------------------------------ sides */

static void side_register(struct side *sd, uint64_t conn, const char *desc, int role)
{
	struct dte_layout l;
	char err[256];

	assert_int_equal(dte_layout_from_desc(&l, &spec, desc, role, err, sizeof(err)), 0);
	memset(sd, 0, sizeof(*sd));
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
		sd->layout_ids[sd->n] = l.bufs[i].id;
		snprintf(sd->names[sd->n], sizeof(sd->names[sd->n]), "%s", l.bufs[i].name);
		assert_int_equal(dbuf_register_fd(conn, fd, 0, (uint64_t)l.bufs[i].length,
						  role == DTE_LAYOUT_SOURCE ? DBUF_FP32 : DBUF_BF16,
						  l.bufs[i].name, &sd->ids[sd->n], err, sizeof(err)), 0);
		sd->n++;
	}
	dte_layout_fini(&l);
}

static void side_unmap(struct side *sd)
{
	for (size_t i = 0; i < sd->n; i++)
		munmap(sd->mem[i], sd->bytes[i]);
	sd->n = 0;
}

static float frand(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 65536.0f;
}

static struct dtc_hparams hp_of(int64_t step)
{
	struct dtc_hparams hp = { .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
				  .weight_decay = 0.0, .step = step, .variant = DTC_VARIANT_TORCH };
	return hp;
}

/* One AdamW step over every element of the source, as test_job.c takes
 * it (torch's single-tensor AdamW; θ by ref_torch_adamw). */
static void adamw_step(int64_t step, unsigned seed)
{
	struct dtc_hparams hp = hp_of(step);
	float *p = src.mem[0], *m = src.mem[1], *v = src.mem[2];
	size_t n = src.bytes[0] / 4;

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

/* Every element of every sink buffer: RNE of the trainer's θ where SGLang
 * holds a model element, untouched zero in the padding.  The number of
 * elements that differ. */
static uint64_t sink_violations(const struct side *k)
{
	struct dte_layout sl;
	char err[256];
	uint64_t bad = 0, checked = 0, hf_total;

	assert_int_equal(dte_layout_from_desc(&sl, &spec, "megatron:tp=1", DTE_LAYOUT_SOURCE, err,
					      sizeof(err)), 0);
	for (size_t b = 0; b < k->n; b++) {
		const uint16_t *d = k->mem[b];
		int64_t rows = 0, cols = 0;

		if (sg_shape(k->names[b], &rows, &cols))
			fail_msg("sink buffer %s is no SGLang parameter", k->names[b]);
		assert_int_equal(k->bytes[b], (size_t)(rows * cols) * 2);
		for (int64_t r = 0; r < rows; r++)
			for (int64_t c = 0; c < cols; c++) {
				struct elref hf, mg;
				uint16_t want = 0;

				if (sg_to_hf(k->names[b], r, c, &hf)) {
					hf_to_mg(&hf, &mg);
					want = dtc_bf16_rne(mg_theta(&sl, &mg));
					checked++;
				}
				if (d[r * cols + c] != want && bad++ < 3)
					print_message("%s[%lld,%lld]: sink %04x want %04x\n",
						      k->names[b], (long long)r, (long long)c,
						      d[r * cols + c], want);
			}
	}
	hf_total = 2ull * M_V * M_H + M_H +
		   M_L * (2ull * M_H + (uint64_t)(M_NQ + 2 * M_NKV) * M_HD * M_H +
			  (uint64_t)M_H * M_NQ * M_HD + 3ull * M_I * M_H);
	assert_int_equal(checked, hf_total);
	dte_layout_fini(&sl);
	return bad;
}

/* ------------------------------------------------------------------ answers */

/* Deferred answers (attach, publish, apply), by request id. */
static struct {
	int seen[256];
	Dte__Status code[256];
	char msg[256][256];
	uint64_t apply_version;
	int apply_checksum_ok;
} ans;

static void catch_done(const struct jreq *rq, int rc, const char *err, const struct jres *res)
{
	uint32_t id = rq->id & 255;

	ans.seen[id]++;
	ans.code[id] = derr_status(rc);
	snprintf(ans.msg[id], sizeof(ans.msg[id]), "%s", err ? err : "");
	if (rc == 0 && res && res->op == JOP_APPLY) {
		ans.apply_version = res->apply.version;
		ans.apply_checksum_ok = res->apply.checksum_ok;
	}
}

/* A request of connection c with id i, answered in catch_done. */
#define RQ(c, i) (&(struct jreq){ .conn = (c), .id = (i), .done = catch_done })

static int answered(void *arg)
{
	return ans.seen[(uintptr_t)arg & 255] > 0;
}

struct run {
	struct fx *fx;
	struct dte_engine *eng[NODES];
};

static uint64_t staged_of(struct dte_engine *e, uint64_t conn, const struct side *k)
{
	struct jquery_res rep = { 0 };
	char err[256];

	if (job_query_version(e, conn, "fx", k->participant, &rep, err, sizeof(err)))
		return 0;
	return rep.staged;
}

static struct run *cur;
static uint64_t want_staged;

static int sink_staged(void *arg)
{
	for (unsigned k = 1; k < NODES; k++)
		if (staged_of(cur->eng[k], CONN(k), &sinks[k]) < want_staged)
			return 0;
	return 1;
}

static int job_ready(void *arg)
{
	struct job *j0 = job_find(cur->eng[0], "fx");

	if (!j0 || !j0->complete)
		return 0;
	for (unsigned k = 1; k < NODES; k++) {
		struct job *jk = job_find(cur->eng[k], "fx");

		if (!jk || !jk->complete || !job_pair(j0, src.participant, sinks[k].participant) ||
		    !job_pair(jk, src.participant, sinks[k].participant))
			return 0;
	}
	return 1;
}

/* Run until request id is answered; its status. */
static Dte__Status await(struct run *r, uint32_t id)
{
	if (fix_run_until(r->fx, answered, (void *)(uintptr_t)id, MAX_STEPS))
		fail_msg("request %u not answered", id);
	return ans.code[id & 255];
}

static uint64_t attach(struct run *r, unsigned node, struct side *sd, uint64_t conn, uint32_t id,
		       const char *role, const char *desc, uint32_t replica)
{
	struct jattach_args rq = { 0 };
	struct job *j = job_find(r->eng[node], "fx");
	char err[512];
	int deferred = 0;

	rq.job = "fx";
	rq.token = "tok";
	rq.role = role;
	rq.layout = desc;
	rq.n_buffers = sd->n;
	rq.buffers = sd->ids;
	rq.replica = replica;
	assert_int_equal(job_attach(r->eng[node], RQ(conn, id), &rq, &deferred, err, sizeof(err)), 0);
	if (deferred && await(r, id) != DTE__STATUS__STATUS_OK)
		fail_msg("attach %s: %s", role, ans.msg[id]);
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (l->owner == conn)
			sd->participant = l->info.id;
	assert_int_not_equal(sd->participant, 0);
	return sd->participant;
}

static void publish(struct run *r, uint32_t id, uint64_t version, int64_t step)
{
	struct jpublish_args rq = { 0 };
	struct jpublish_res rep = { 0 };
	struct jhparams g[2];
	struct dtc_hparams hp = hp_of(step);
	char err[512];
	int deferred = 0, st;

	for (int i = 0; i < 2; i++) {
		g[i] = (struct jhparams){ 0 };
		g[i].lr = hp.lr;
		g[i].beta1 = hp.beta1;
		g[i].beta2 = hp.beta2;
		g[i].eps = hp.eps;
		g[i].weight_decay = 0.0;
	}
	rq.job = "fx";
	rq.participant = src.participant;
	rq.version = version;
	rq.step = step;
	rq.n_groups = 2;
	rq.groups = g;
	st = job_publish(r->eng[0], RQ(SRC_CONN, id), &rq, &rep, &deferred, err, sizeof(err));
	if (st == 0 && deferred)
		st = await(r, id) == DTE__STATUS__STATUS_OK ? 0 : -1;
	if (st)
		fail_msg("publish v%llu: %s", (unsigned long long)version,
			 deferred ? ans.msg[id] : err);
}

static void apply(struct run *r, unsigned node, uint32_t id, uint64_t version)
{
	struct japply_args rq = { 0 };
	struct japply_res rep = { 0 };
	char err[256];
	int deferred = 0;

	rq.job = "fx";
	rq.participant = sinks[node].participant;
	rq.version = version;
	assert_int_equal(job_apply(r->eng[node], RQ(CONN(node), id), &rq, &rep, &deferred, err,
				   sizeof(err)), 0);
	if (deferred) {
		if (await(r, id) != DTE__STATUS__STATUS_OK)
			fail_msg("apply v%llu: %s", (unsigned long long)version, ans.msg[id]);
		rep.version = ans.apply_version;
		rep.checksum_ok = ans.apply_checksum_ok;
	}
	assert_int_equal(rep.version, version);
	assert_true(rep.checksum_ok);
}

/* One schedule: the whole sync under seed; its steps, its violations. */
static uint64_t one_schedule(uint64_t seed, const struct fx_faults *faults, uint64_t *steps,
			     uint64_t *refused, struct fix_stats *io)
{
	struct jcreate_args jc = { 0 };
	struct run r = { 0 };
	struct fix_stats st;
	char err[512];
	uint64_t bad, v;

	memset(&ans, 0, sizeof(ans));
	cur = &r;
	assert_non_null(r.fx = fix_new(NODES, seed, faults));
	for (unsigned i = 0; i < NODES; i++) {
		struct dte_engine_io eio;
		struct jcreate_res jr = { 0 };

		fix_io(r.fx, i, &eio);
		assert_non_null(r.eng[i] = dte_engine_new_io(&eio, dtc_backend_cpu(), "cpu"));
		jc.name = "fx";
		jc.model_config = config;
		jc.token = "tok";
		jc.coordinator = fix_node_address(r.fx, 0);
		if (job_create(r.eng[i], &jc, &jr, err, sizeof(err)))
			fail_msg("job_create on node%u: %s", i, err);
		assert_int_equal(jr.coordinator, i == 0);
	}
	side_register(&src, SRC_CONN, "megatron:tp=1", DTE_LAYOUT_SOURCE);
	attach(&r, 0, &src, SRC_CONN, 1, "source", "megatron:tp=1", 0);
	for (unsigned k = 1; k < NODES; k++) {
		side_register(&sinks[k], CONN(k), "sglang:tp=1", DTE_LAYOUT_SINK);
		attach(&r, k, &sinks[k], CONN(k), 1 + k, "sink", "sglang:tp=1", k - 1);
	}
	if (fix_run_until(r.fx, job_ready, NULL, MAX_STEPS))
		fail_msg("seed %llu: the job never became complete on both nodes",
			 (unsigned long long)seed);
	/* VERSIONS versions (dense, then sparse), and more until the last
	 * one published is staged: a version a sink could not stage (a
	 * record lost, with FX_DROP) is repaired by the next one, as a
	 * trainer's next step would.  A record delivered twice is not such a
	 * loss: the sink drops the copy (test_fixture_sync asserts that no
	 * version goes unstaged without drops). */
	for (v = 1;; v++) {
		adamw_step((int64_t)v, (unsigned)(seed * 31 + v));
		publish(&r, (uint32_t)(10 + v), v, (int64_t)v);
		want_staged = v;
		if (!fix_run_until(r.fx, sink_staged, NULL, STAGE_STEPS)) {
			if (v >= VERSIONS)
				break;
			continue;
		}
		(*refused)++;
		if (v >= VERSIONS + 32)
			fail_msg("seed %llu: v%llu never staged at every sink",
				 (unsigned long long)seed, (unsigned long long)v);
	}
	bad = 0;
	for (unsigned k = 1; k < NODES; k++) {
		apply(&r, k, 100 + k, v);
		bad += sink_violations(&sinks[k]);
	}
	if (bad)
		print_message("seed %llu: %llu sink elements differ from RNE(theta)\n",
			      (unsigned long long)seed, (unsigned long long)bad);
	/* The buffer registry is the process's and dte_engine_free ends it
	 * (dbuf_fini): every participant goes first, on every node. */
	for (unsigned k = NODES; k-- > 0;)
		job_conn_gone(r.eng[k], CONN(k));
	fix_settle(r.fx, MAX_STEPS);
	fix_stats(r.fx, &st);
	*steps = st.steps;
	io->records += st.records;
	io->duplicated += st.duplicated;
	io->reordered += st.reordered;
	io->timers += st.timers;
	io->works += st.works;
	/* Every sink version went where its table said (jsink_step_check). */
	for (unsigned i = 0; i < NODES; i++)
		if (r.eng[i]->sink_sm_bugs)
			fail_msg("seed %llu: node%u: %llu sink versions not where the table said",
				 (unsigned long long)seed, i,
				 (unsigned long long)r.eng[i]->sink_sm_bugs);
	for (unsigned i = NODES; i-- > 0;)
		dte_engine_free(r.eng[i]);
	fix_free(r.fx);
	side_unmap(&src);
	for (unsigned k = 1; k < NODES; k++)
		side_unmap(&sinks[k]);
	cur = NULL;
	return bad;
}

static unsigned env_pct(const char *name, unsigned dflt)
{
	const char *v = getenv(name);

	return v && *v ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

static void test_fixture_sync(void **state)
{
	const char *env = getenv("FX_SCHEDULES"), *first = getenv("FX_SEED");
	uint64_t schedules = env && *env ? strtoull(env, NULL, 10) : SCHEDULES_DEFAULT;
	uint64_t seed0 = first && *first ? strtoull(first, NULL, 0) : 0x5eed0000ull;
	uint64_t steps = 0, violations = 0, refused = 0, s;
	struct fix_stats io = { 0 };
	/* Every record may come twice and out of order; none is lost
	 * (FX_DROP, FX_DUP, FX_REORDER: other percentages). */
	struct fx_faults f = { .drop_pct = env_pct("FX_DROP", 0), .dup_pct = env_pct("FX_DUP", 10),
			       .reorder_pct = env_pct("FX_REORDER", 30) };

	for (s = 0; s < schedules; s++) {
		uint64_t k = 0;

		violations += one_schedule(seed0 + s, &f, &k, &refused, &io);
		steps += k;
	}
	/* The same seed, the same schedule. */
	{
		uint64_t a = 0, b = 0, ra = 0, rb = 0;
		struct fix_stats sa = { 0 }, sb = { 0 };

		one_schedule(seed0, &f, &a, &ra, &sa);
		one_schedule(seed0, &f, &b, &rb, &sb);
		assert_int_equal(a, b);
		assert_int_equal(ra, rb);
		assert_int_equal(sa.records, sb.records);
		assert_int_equal(sa.duplicated, sb.duplicated);
	}
	print_message("fixture: records=%llu duplicated=%llu reordered=%llu timers=%llu works=%llu "
		      "versions_unstaged=%llu (repaired by the next)\n",
		      (unsigned long long)io.records, (unsigned long long)io.duplicated,
		      (unsigned long long)io.reordered, (unsigned long long)io.timers,
		      (unsigned long long)io.works, (unsigned long long)refused);
	print_message("fixture: nodes=%d schedules=%llu steps=%llu violations=%llu\n", NODES,
		      (unsigned long long)schedules, (unsigned long long)steps,
		      (unsigned long long)violations);
	assert_int_equal(violations, 0);
	/* Duplicates and reorders lose nothing: every version stages. */
	if (!f.drop_pct)
		assert_int_equal(refused, 0);
}

static int setup(void **state)
{
	char err[256];

	dlog_init(getenv("FX_DEBUG") ? DLOG_DEBUG : DLOG_ERROR);
	config = slurp("tests/data/layout/tiny-llama-gqa.json");
	if (dte_spec_load_string(&spec, config, err, sizeof(err)) < 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	dte_spec_fini(&spec);
	free(config);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_sync),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
