/* tests/bench/bench_fanout_fixture.c — relay fan-out with the real engine
 * code (issue 34: "If the engine-instance fixture exists, run the real
 * engine code in it rather than a separate model").
 *
 * One process, 1 + N engines on the fixture's I/O (tests/unit/fixture.h)
 * with timed links: node0 is the coordinator and a Megatron TP=1 source
 * stepping AdamW (tests/unit/fixture_sync.c), nodes 1..N an SGLang TP=1
 * sink replica each.  Everything the daemons do runs: JOINs and the
 * coordinator's plans and relay trees, the source's detect and capture,
 * COUNTS and PAYLOAD parts sealed and checked, the relays' checks and
 * forwards, staging, the apply and its verify; only the transport is
 * modelled.  Each node's NIC sends and takes one record after another at
 * its rate, a hop costs a latency, and a receiver's loop checks a
 * record's data at the per-byte cost of the data path's check, measured
 * here in this run (fanout_check.h).  The model is tiny (an engine and
 * its replica about 3 MB of memory; 128 KiB of BF16) and its capture's parts are
 * PART_BYTES: each payload byte stands for SCALE bytes (a part for a
 * 256 KiB one) on the links and in the checks, so a version's parts
 * pipeline through the trees as full-size parts would (COUNTS and
 * control records count as they are).  The scaled bytes are what
 * the lines report.  Every replica is applied and checked exact against
 * RNE(theta) (the fixture's independent mapping) after every version.
 *
 * A version's time: the fixture's clock from the publish until the last
 * replica staged it.  Direct: every replica fed by the source
 * (relay_fanout 0).  Relay: the coordinator's relay trees with the roots
 * and fanout daemon/relay_plan.c's planner picks for these links.
 *
 *   bench fanout-fixture sinks=N gbit=G version=dense|sparse direct_s=..
 *       relay_s=.. ratio_to_one_sink=.. direct_ratio=.. model_relay_s=..
 *   bench fanout-sim engine=fixture nodes=.. sources=1 sinks=.. version_s=..
 *       relay_s=.. plan_s=.. replan_ms=.. peak_mb=..
 *
 * plan_s is the coordinator engine's own time (wall clock of this
 * process in its callbacks) for every JOIN's re-plan up to the complete
 * plan; replan_ms, for one sink's LEAVE; peak_mb the process's resident
 * peak with every engine in it.
 *
 * usage: bench_fanout_fixture [--sinks 1,2,4,8,16] [--gbit 10] [--big N]
 *                             [--big-gbit 400] [--versions V] [--lr LR]
 *                             [--entry-max E] [--big-entry-max E]
 *                             [--shape ROOTS,FANOUT]
 * (--big 0: no large run; --entry-max: the plan's entry cut for the
 * small runs, 128 elements, so that a part holds about PART_BYTES as a
 * real model's do; the large run's, 1024, to keep it at 2.5 GB; --shape:
 * this forest instead of the planner's, to hold the engine against the
 * model shape by shape). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <cmocka.h>
#include "tests/unit/fixture.h"
#include "tests/unit/fixture_sync.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/layout/plan.h"
#include "daemon/relay_plan.h"
#include "gpu/backend.h"
#include "tests/bench/fanout_check.h"
#include "tests/bench/peak_rss.h"

#define PART_BYTES 256
#define PART_MODEL (256.0 * 1024)	/* what a part stands for */
#define SCALE (PART_MODEL / PART_BYTES)
#define MAX_STEPS 400000000ull
#define CONN(node) ((uint64_t)(node) * 100 + 1)
#define VMAX 8

static struct {
	unsigned sinks[16], nsinks, big, versions;
	double gbit, big_gbit, lr, big_src_nics;
	double check_ns_per_byte;	/* one lane: the data path checks on its loop */
	double lanes;			/* check lanes this run models (the cost / lanes) */
	int64_t entry_max, big_entry_max;
	unsigned roots, fanout;		/* --shape R,F: this forest, not the planner's */
} O = { { 1, 2, 4, 8, 16 }, 5, 896, 3, 10, 400, 1e-6, 128, 0, 1, 128, 1024, 0, 0 };

struct run {
	struct fx *fx;
	unsigned n;		/* nodes: 1 + sinks */
	struct dte_engine **eng;
	struct side src, *sinks;	/* sinks[k]: node k's (k >= 1) */
	unsigned cursor;	/* sinks below it have staged want */
	uint64_t want;
};

struct result {
	double version_s[VMAX], wire_mb[VMAX], part_mb[VMAX];
	double plan_s, last_join_ms, replan_ms, peak_mb, wall_s;
	uint64_t violations, records;
	unsigned roots, fanout;
};

/* A payload's data stands for SCALE times its bytes; a COUNTS' (a count
 * per entry) and the control records' are as they are. */
static uint64_t payload_records;	/* PAYLOAD parts from the source */

static size_t scaled(Dtep__PeerMsgType type, const ProtobufCMessage *msg, size_t len)
{
	const Dtep__Relayed *r = (const Dtep__Relayed *)msg;

	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD) {
		payload_records++;
		return len;
	}
	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED &&
	    r->type == DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD && r->record_len <= len)
		return len - r->record_len;
	return 0;
}

/* Every sink staged want (a sink, once staged, stays: the cursor only
 * moves on). */
static int all_staged(void *arg)
{
	struct run *r = arg;

	while (r->cursor < r->n) {
		uint64_t staged = 0, applied = 0;

		if (fxs_query(r->eng[r->cursor], CONN(r->cursor), &r->sinks[r->cursor], &staged,
			      &applied) || staged < r->want)
			return 0;
		r->cursor++;
	}
	return 1;
}

static int job_ready(void *arg)
{
	struct run *r = arg;

	return fxs_pairs_ready(r->eng, r->n, &r->src, r->sinks);
}

/* Steps until pred, checked every `every` steps and whenever nothing but
 * timers is left (the check is O(nodes) here). */
static int run_until(struct fx *fx, int (*pred)(void *), void *arg, unsigned every)
{
	for (uint64_t i = 0; i < MAX_STEPS; i++) {
		if (i % every == 0 && pred(arg))
			return 0;
		if (fix_step(fx) < 0)
			return pred(arg) ? 0 : -1;
	}
	return -1;
}

/* One configuration: sinks replicas behind sink_Bps NICs, the source's
 * NIC src_Bps; relay: roots and fanout (0 roots: direct). */
static int run_one(unsigned sinks, double src_Bps, double sink_Bps, uint64_t lat_ns,
		   unsigned roots, unsigned fanout, struct result *res)
{
	struct fx_links lk = { .up_Bps = sink_Bps, .down_Bps = sink_Bps, .latency_ns = lat_ns,
			       .byte_scale = SCALE, .scaled = scaled,
			       .check_ns_per_byte = O.check_ns_per_byte / O.lanes };
	struct run r = { 0 };
	struct fix_stats st;
	char err[512];
	double w0 = now();
	uint64_t b0, blast = 0;

	memset(res, 0, sizeof(*res));
	memset(&ans, 0, sizeof(ans));
	r.n = 1 + sinks;
	r.eng = calloc(r.n, sizeof(*r.eng));
	r.sinks = calloc(r.n, sizeof(*r.sinks));
	if (!r.eng || !r.sinks || !(r.fx = fix_new(r.n, 0xfa0a7ull, NULL)) ||
	    fix_set_links(r.fx, &lk))
		return -ENOMEM;
	fix_set_node_link(r.fx, 0, src_Bps, src_Bps);
	for (unsigned i = 0; i < r.n; i++)
		r.eng[i] = fxs_engine(r.fx, i);
	job_set_part_bytes(r.eng[0], PART_BYTES);
	if (roots)
		job_set_relay(r.eng[0], fanout, roots, 0);
	res->roots = roots;
	res->fanout = fanout;
	side_register(&r.src, CONN(0), "megatron:tp=1", DTE_LAYOUT_SOURCE);
	if (fxs_attach(r.fx, r.eng[0], &r.src, CONN(0), 1, "source", "megatron:tp=1", 0, MAX_STEPS,
		       err, sizeof(err))) {
		fprintf(stderr, "attach source: %s\n", err);
		return -EINVAL;
	}
	b0 = fix_node_busy_ns(r.fx, 0);
	for (unsigned k = 1; k < r.n; k++) {
		if (k == r.n - 1) {	/* the last JOIN: the first complete plan */
			fix_settle(r.fx, MAX_STEPS);
			blast = fix_node_busy_ns(r.fx, 0);
		}
		side_register(&r.sinks[k], CONN(k), "sglang:tp=1", DTE_LAYOUT_SINK);
		if (fxs_attach(r.fx, r.eng[k], &r.sinks[k], CONN(k), 1 + k, "sink", "sglang:tp=1",
			       k - 1, MAX_STEPS, err, sizeof(err))) {
			fprintf(stderr, "attach sink %u: %s\n", k, err);
			return -EINVAL;
		}
	}
	if (run_until(r.fx, job_ready, &r, 4096)) {
		fprintf(stderr, "the job never became complete\n");
		return -ETIMEDOUT;
	}
	res->plan_s = (double)(fix_node_busy_ns(r.fx, 0) - b0) * 1e-9;
	res->last_join_ms = (double)(fix_node_busy_ns(r.fx, 0) - blast) * 1e-6;
	for (unsigned v = 1; v <= O.versions; v++) {
		uint64_t t0, bytes0, parts0, id = 1000 + v * 10000;
		struct japply_res rep;

		fix_stats(r.fx, &st);
		bytes0 = st.data_bytes;
		parts0 = payload_records;
		adamw_step(&r.src, (int64_t)v, 77u + v);
		t0 = fix_now(r.fx);
		if (fxs_publish(r.fx, r.eng[0], &r.src, CONN(0), (uint32_t)id, v, (int64_t)v,
				MAX_STEPS, err, sizeof(err))) {
			fprintf(stderr, "publish v%u: %s\n", v, err);
			return -EINVAL;
		}
		r.want = v;
		r.cursor = 1;
		if (run_until(r.fx, all_staged, &r, 1)) {
			fprintf(stderr, "v%u never staged at every sink (sink %u behind)\n", v,
				r.cursor);
			return -ETIMEDOUT;
		}
		res->version_s[v - 1] = (double)(fix_now(r.fx) - t0) * 1e-9;
		fix_stats(r.fx, &st);
		/* what one replica received, scaled (direct: every copy from the source) */
		res->wire_mb[v - 1] = (double)(st.data_bytes - bytes0) * SCALE / sinks / 1e6;
		/* a part's mean size (parts hold whole plan entries: a part
		 * can be larger than PART_BYTES) */
		if (payload_records > parts0)
			res->part_mb[v - 1] = (double)(st.data_bytes - bytes0) * SCALE /
					      (double)(payload_records - parts0) / 1e6;
		for (unsigned k = 1; k < r.n; k++) {
			if (fxs_apply(r.fx, r.eng[k], &r.sinks[k], CONN(k), (uint32_t)(id + k), v, &rep,
				      MAX_STEPS, err, sizeof(err)) || rep.version != v ||
			    !rep.checksum_ok) {
				fprintf(stderr, "apply v%u at sink %u: %s\n", v, k, err);
				return -EINVAL;
			}
			res->violations += sink_violations(&r.src, &r.sinks[k]);
		}
	}
	/* One sink leaves: the coordinator's re-plan. */
	b0 = fix_node_busy_ns(r.fx, 0);
	job_conn_gone(r.eng[r.n - 1], CONN(r.n - 1));
	fix_settle(r.fx, MAX_STEPS);
	res->replan_ms = (double)(fix_node_busy_ns(r.fx, 0) - b0) * 1e-6;
	res->peak_mb = peak_mb();
	fix_stats(r.fx, &st);
	res->records = st.records;
	for (unsigned k = r.n; k-- > 0;)
		job_conn_gone(r.eng[k], CONN(k));
	fix_settle(r.fx, MAX_STEPS);
	for (unsigned i = r.n; i-- > 0;)
		dte_engine_free(r.eng[i]);
	fix_free(r.fx);
	side_unmap(&r.src);
	for (unsigned k = 1; k < r.n; k++)
		side_unmap(&r.sinks[k]);
	free(r.sinks);
	free(r.eng);
	res->wall_s = now() - w0;
	return 0;
}

/* The planner's forest for these links (daemon/relay_plan.c), the
 * version's bytes as the first run measured them. */
/* The planner's model (relay_model_s) of a forest for these links. */
static double model_of(unsigned sinks, double bytes, double part, double src_Bps,
		       double sink_Bps, double lat, unsigned roots, unsigned fanout)
{
	struct relay_in in = { .replicas = sinks, .bytes = bytes, .part_bytes = part,
			       .src_rate = src_Bps, .sink_rate = sink_Bps, .latency = lat,
			       .verify_s = O.check_ns_per_byte * part * 1e-9 / O.lanes,
			       .verify_lanes = 1 };

	return bytes > 0 ? relay_model_s(&in, roots, fanout) : 0;
}

static void plan_for(unsigned sinks, double bytes, double part, double src_Bps, double sink_Bps,
		     double lat, unsigned *roots, unsigned *fanout, double *model_s)
{
	struct relay_in in = { .replicas = sinks, .bytes = bytes, .part_bytes = part,
			       .src_rate = src_Bps, .sink_rate = sink_Bps, .latency = lat,
			       .verify_s = O.check_ns_per_byte * part * 1e-9 / O.lanes,
			       .verify_lanes = 1 };
	struct relay_plan p;

	*roots = sinks;
	*fanout = 1;
	*model_s = 0;
	if (O.roots && O.fanout) {
		*roots = O.roots < sinks ? O.roots : sinks;
		*fanout = O.fanout;
		return;
	}
	if (relay_plan_build(&in, &p) < 0)
		return;
	*roots = p.roots;
	*fanout = p.fanout ? p.fanout : 1;
	*model_s = p.model_s;
	relay_plan_fini(&p);
}

static void parse_list(const char *s, unsigned *out, unsigned *n)
{
	char *end;

	*n = 0;
	while (*s && *n < 16) {
		out[(*n)++] = (unsigned)strtoul(s, &end, 10);
		s = *end == ',' ? end + 1 : end;
		if (end == s && *s)
			break;
	}
}

static void bench_fanout(void **state)
{
	const char *vname[VMAX] = { "dense", "sparse", "sparse", "sparse", "sparse", "sparse",
				    "sparse", "sparse" };
	double xxh3_s = 0, mac_s = 0, mac8_s = 0, one[VMAX] = { 0 };
	struct result d, rl;
	struct rlimit rl_nofile;

	/* memfds: a replica's buffers twice (its memory and its registration) */
	if (!getrlimit(RLIMIT_NOFILE, &rl_nofile)) {
		rl_nofile.rlim_cur = rl_nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl_nofile);
	}
	fxs_lr = O.lr;
	if (O.entry_max > 0)
		dte_plan_entry_max = O.entry_max;
	assert_int_equal(verify_cost((size_t)PART_MODEL, &xxh3_s, &mac_s, &mac8_s), 0);
	O.check_ns_per_byte = (xxh3_s + mac_s) * 1e9 / PART_MODEL;
	printf("bench fanout-fixture check_ns_per_byte=%.4f part_bytes=%d stands_for=%.0f "
	       "lr=%g versions=%u entry_max=%lld\n", O.check_ns_per_byte, PART_BYTES, PART_MODEL, O.lr,
	       O.versions, (long long)dte_plan_entry_max);
	for (unsigned i = 0; i < O.nsinks; i++) {
		unsigned n = O.sinks[i], roots, fanout;
		double link = O.gbit * 1e9 / 8, model_s;

		assert_int_equal(run_one(n, link, link, 50000, 0, 0, &d), 0);
		/* the heaviest sparse version's bytes, as the planner would know them */
		plan_for(n, d.wire_mb[1] * 1e6, d.part_mb[1] * 1e6, link, link, 50e-6, &roots, &fanout, &model_s);
		if (roots >= n && n > 1) {
			roots = 1;	/* the planner's direct: show the chain anyway */
			fanout = 1;
		}
		assert_int_equal(run_one(n, link, link, 50000, n > 1 ? roots : 0, fanout, &rl), 0);
		assert_int_equal(d.violations + rl.violations, 0);
		for (unsigned v = 0; v < O.versions; v++) {
			unsigned ro = rl.roots ? rl.roots : n, fo = rl.fanout ? rl.fanout : 1;

			if (n == O.sinks[0])
				one[v] = rl.version_s[v];
			printf("bench fanout-fixture sinks=%u gbit=%g version=%s v=%u direct_s=%.4f "
			       "relay_s=%.4f ratio_to_one_sink=%.3f direct_ratio=%.3f roots=%u "
			       "fanout=%u mb=%.1f part_mb=%.2f model_direct_s=%.4f model_relay_s=%.4f "
			       "exact=yes\n",
			       n, O.gbit, vname[v], v + 1, d.version_s[v], rl.version_s[v],
			       rl.version_s[v] / one[v], d.version_s[v] / one[v], ro, fo, d.wire_mb[v],
			       d.part_mb[v],
			       model_of(n, d.wire_mb[v] * 1e6, d.part_mb[v] * 1e6, link, link, 50e-6,
					n, 1),
			       model_of(n, d.wire_mb[v] * 1e6, d.part_mb[v] * 1e6, link, link, 50e-6,
					ro, fo));
		}
		fflush(stdout);
	}
	/* The large run: one check lane (the data path's loop, as built),
	 * then as many lanes as keep the check at the NIC's rate. */
	for (int l = 0; O.big && l < 2; l++) {
		double nic = O.big_gbit * 1e9 / 8, src = O.big_src_nics * nic, model_s, err = 0;
		unsigned roots, fanout;

		O.lanes = l ? ceil(O.check_ns_per_byte * 1e-9 * nic) : 1;
		if (O.big_entry_max > 0)
			dte_plan_entry_max = O.big_entry_max;
		assert_int_equal(run_one(O.big, src, nic, 2000, 0, 0, &d), 0);
		plan_for(O.big, d.wire_mb[1] * 1e6, d.part_mb[1] * 1e6, src, nic, 2e-6, &roots,
			 &fanout, &model_s);
		/* the planner keeps direct: that run is the relay's too */
		if (roots < O.big)
			assert_int_equal(run_one(O.big, src, nic, 2000, roots, fanout, &rl), 0);
		else
			rl = d;
		assert_int_equal(d.violations + rl.violations, 0);
		for (unsigned v = 0; v < O.versions; v++) {
			double md = model_of(O.big, d.wire_mb[v] * 1e6, d.part_mb[v] * 1e6, src, nic,
					     2e-6, O.big, 1);
			double mr = model_of(O.big, d.wire_mb[v] * 1e6, d.part_mb[v] * 1e6, src, nic,
					     2e-6, roots, fanout);

			err = fmax(err, fmax(fabs(md - d.version_s[v]) / d.version_s[v],
					     fabs(mr - rl.version_s[v]) / rl.version_s[v]));
			printf("bench fanout-fixture-large nodes=%u sources=1 sinks=%u check_lanes=%.0f "
			       "version=%s v=%u direct_s=%.5f relay_s=%.5f ratio=%.2f roots=%u "
			       "fanout=%u mb=%.1f part_mb=%.2f model_direct_s=%.5f model_relay_s=%.5f "
			       "exact=yes\n", O.big + 1, O.big, O.lanes, vname[v], v + 1,
			       d.version_s[v], rl.version_s[v], d.version_s[v] / rl.version_s[v], roots,
			       fanout, d.wire_mb[v], d.part_mb[v], md, mr);
		}
		/* The deployment (bench_fanout_sim.c's): a 1T model at
		 * 1 % changed, 3.01 wire bytes a change, 8 ranks a node, 256 KiB
		 * parts, by the model the engine was just measured against;
		 * the plan's cost is the engine's own, at this size. */
		{
			double bytes = 1e12 * 0.01 * 3.01 / 8, part = 256.0 * 1024, dm;
			unsigned r1, f1;

			plan_for(O.big, bytes, part, src, nic, 2e-6, &r1, &f1, &dm);
			printf("bench fanout-sim nodes=%u sources=%u sinks=%u model=1T changed=1%% "
			       "check_lanes=%.0f version_s=%.4f relay_s=%.4f ratio=%.2f roots=%u "
			       "fanout=%u plan_s=%.3f joins_s=%.1f replan_ms=%.1f peak_mb=%.0f "
			       "engine_nodes=%u model_err=%.3f wall_s=%.0f\n",
			       (unsigned)O.big_src_nics + O.big, (unsigned)O.big_src_nics, O.big, O.lanes,
			       model_of(O.big, bytes, part, src, nic, 2e-6, O.big, 1), dm,
			       model_of(O.big, bytes, part, src, nic, 2e-6, O.big, 1) / dm, r1, f1,
			       rl.last_join_ms * 1e-3, rl.plan_s, rl.replan_ms, rl.peak_mb, O.big + 1,
			       err, d.wall_s + (rl.wall_s == d.wall_s ? 0 : rl.wall_s));
		}
		fflush(stdout);
	}
	O.lanes = 1;
	dte_plan_entry_max = O.entry_max > 0 ? O.entry_max : DTE_PLAN_ENTRY_MAX;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bench_fanout),
	};

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--sinks"))
			parse_list(argv[i + 1], O.sinks, &O.nsinks);
		else if (!strcmp(argv[i], "--gbit"))
			O.gbit = strtod(argv[i + 1], NULL);
		else if (!strcmp(argv[i], "--big"))
			O.big = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--big-gbit"))
			O.big_gbit = strtod(argv[i + 1], NULL);
		else if (!strcmp(argv[i], "--versions"))
			O.versions = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--shape"))
			sscanf(argv[i + 1], "%u,%u", &O.roots, &O.fanout);
		else if (!strcmp(argv[i], "--big-entry-max"))
			O.big_entry_max = strtoll(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--entry-max"))
			O.entry_max = strtoll(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--lr"))
			O.lr = strtod(argv[i + 1], NULL);
		else {
			fprintf(stderr, "usage: %s [--sinks 1,2,4,8,16] [--gbit G] [--big N] "
				"[--big-gbit G] [--versions V] [--lr LR]\n", argv[0]);
			return 2;
		}
	}
	if (O.versions < 2 || O.versions > VMAX || !O.nsinks) {
		fprintf(stderr, "--versions in [2, %d], --sinks a list\n", VMAX);
		return 2;
	}
	return cmocka_run_group_tests(tests, fxs_setup, fxs_teardown);
}
