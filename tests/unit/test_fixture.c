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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "tests/unit/fixture.h"
#include "tests/unit/fixture_sync.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "gpu/backend.h"

#define NODES 3	/* node0: coordinator and source; every other node: a sink */
#define NODES_MAX 5	/* the relay schedules: four sinks in a chain */
#define SCHEDULES_DEFAULT 100
#define VERSIONS 3
#define MAX_STEPS 2000000ull
#define STAGE_STEPS 20000ull	/* a version staged, or given up (refused) */
/* Each node's control connection: an owner of its own in the registry. */
#define CONN(node) ((uint64_t)(node) * 100 + 1)
#define SRC_CONN CONN(0)

static struct side src, sinks[NODES_MAX];	/* sinks[k]: node k's (k >= 1) */

struct run {
	struct fx *fx;
	unsigned n;
	struct dte_engine *eng[NODES_MAX];
};

static struct run *cur;
static uint64_t want_staged;

static int sink_staged(void *arg)
{
	for (unsigned k = 1; k < cur->n; k++) {
		uint64_t staged = 0, applied = 0;

		if (fxs_query(cur->eng[k], CONN(k), &sinks[k], &staged, &applied) ||
		    staged < want_staged)
			return 0;
	}
	return 1;
}

static int job_ready(void *arg)
{
	return fxs_pairs_ready(cur->eng, cur->n, &src, sinks);
}

static void attach(struct run *r, unsigned node, struct side *sd, uint64_t conn, uint32_t id,
		   const char *role, const char *desc, uint32_t replica)
{
	char err[512];

	if (fxs_attach(r->fx, r->eng[node], sd, conn, id, role, desc, replica, MAX_STEPS, err,
		       sizeof(err)))
		fail_msg("attach %s: %s", role, err);
}

static void publish(struct run *r, uint32_t id, uint64_t version, int64_t step)
{
	char err[512];

	if (fxs_publish(r->fx, r->eng[0], &src, SRC_CONN, id, version, step, MAX_STEPS, err,
			sizeof(err)))
		fail_msg("publish v%llu: %s", (unsigned long long)version, err);
}

static void apply(struct run *r, unsigned node, uint32_t id, uint64_t version)
{
	struct japply_res rep;
	char err[256];

	if (fxs_apply(r->fx, r->eng[node], &sinks[node], CONN(node), id, version, &rep, MAX_STEPS,
		      err, sizeof(err)))
		fail_msg("apply v%llu: %s", (unsigned long long)version, err);
	assert_int_equal(rep.version, version);
	assert_true(rep.checksum_ok);
}

/* One schedule: the whole sync under seed on nodes engines (relay: the
 * sinks in a chain, relay_fanout 1); its steps, its violations, and
 * (relayed) the records the sinks forwarded. */
static uint64_t schedule_on(unsigned nodes, int relay, uint64_t seed, const struct fx_faults *faults,
			    uint64_t *steps, uint64_t *refused, struct fix_stats *io,
			    uint64_t *relayed)
{
	struct run r = { .n = nodes };
	struct fix_stats st;
	uint64_t bad, v;

	memset(&ans, 0, sizeof(ans));
	cur = &r;
	assert_non_null(r.fx = fix_new(nodes, seed, faults));
	for (unsigned i = 0; i < nodes; i++)
		r.eng[i] = fxs_engine(r.fx, i);
	if (relay)
		job_set_relay(r.eng[0], 1, 1, 0);
	side_register(&src, SRC_CONN, "megatron:tp=1", DTE_LAYOUT_SOURCE);
	attach(&r, 0, &src, SRC_CONN, 1, "source", "megatron:tp=1", 0);
	for (unsigned k = 1; k < nodes; k++) {
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
		adamw_step(&src, (int64_t)v, (unsigned)(seed * 31 + v));
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
	for (unsigned k = 1; k < nodes; k++) {
		apply(&r, k, 100 + k, v);
		bad += sink_violations(&src, &sinks[k]);
	}
	for (unsigned k = 1; relayed && k < nodes; k++) {
		struct job *jk = job_find(r.eng[k], "fx");

		*relayed += jk ? jk->relayed_records : 0;
	}
	if (bad)
		print_message("seed %llu: %llu sink elements differ from RNE(theta)\n",
			      (unsigned long long)seed, (unsigned long long)bad);
	/* The buffer registry is the process's and dte_engine_free ends it
	 * (dbuf_fini): every participant goes first, on every node. */
	for (unsigned k = nodes; k-- > 0;)
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
	for (unsigned i = 0; i < nodes; i++)
		if (r.eng[i]->sink_sm_bugs)
			fail_msg("seed %llu: node%u: %llu sink versions not where the table said",
				 (unsigned long long)seed, i,
				 (unsigned long long)r.eng[i]->sink_sm_bugs);
	/* ...and every pair's stored state is the one its fields give
	 * (pair_sm.h): the pairs freed, and those still planned. */
	for (unsigned i = 0; i < nodes; i++) {
		uint64_t bugs = r.eng[i]->pair_sm_bugs;

		for (struct job *j = r.eng[i]->jobs; j; j = j->next)
			for (size_t q = 0; q < j->npairs; q++)
				bugs += j->pairs[q].sm.state_bugs;
		if (bugs)
			fail_msg("seed %llu: node%u: %llu pair events left a state its fields do not "
				 "give", (unsigned long long)seed, i, (unsigned long long)bugs);
	}
	for (unsigned i = nodes; i-- > 0;)
		dte_engine_free(r.eng[i]);
	fix_free(r.fx);
	side_unmap(&src);
	for (unsigned k = 1; k < nodes; k++)
		side_unmap(&sinks[k]);
	cur = NULL;
	return bad;
}

static uint64_t one_schedule(uint64_t seed, const struct fx_faults *faults, uint64_t *steps,
			     uint64_t *refused, struct fix_stats *io)
{
	return schedule_on(NODES, 0, seed, faults, steps, refused, io, NULL);
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

/* Relay (issue 34) on the same I/O: four sinks in a chain, each
 * forwarding what it verified to the next, records duplicated and
 * reordered; every sink exact, and the chain really relayed (the sinks'
 * forwarded records counted).  A tenth of FX_SCHEDULES (at least 10). */
static void test_fixture_relay(void **state)
{
	const char *env = getenv("FX_SCHEDULES");
	uint64_t schedules = (env && *env ? strtoull(env, NULL, 10) : SCHEDULES_DEFAULT) / 10;
	uint64_t steps = 0, violations = 0, refused = 0, relayed = 0;
	struct fix_stats io = { 0 };
	struct fx_faults f = { .drop_pct = 0, .dup_pct = env_pct("FX_DUP", 10),
			       .reorder_pct = env_pct("FX_REORDER", 30) };

	if (schedules < 10)
		schedules = 10;
	for (uint64_t s = 0; s < schedules; s++) {
		uint64_t k = 0;

		violations += schedule_on(NODES_MAX, 1, 0x7e1a0000ull + s, &f, &k, &refused, &io,
					  &relayed);
		steps += k;
	}
	print_message("fixture-relay: nodes=%d schedules=%llu steps=%llu relayed=%llu "
		      "duplicated=%llu reordered=%llu violations=%llu\n", NODES_MAX,
		      (unsigned long long)schedules, (unsigned long long)steps,
		      (unsigned long long)relayed, (unsigned long long)io.duplicated,
		      (unsigned long long)io.reordered, (unsigned long long)violations);
	assert_int_equal(violations, 0);
	assert_int_equal(refused, 0);
	/* every schedule: three relays forward each version's records */
	assert_true(relayed >= schedules * 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_sync),
		cmocka_unit_test(test_fixture_relay),
	};

	return cmocka_run_group_tests(tests, fxs_setup, fxs_teardown);
}
