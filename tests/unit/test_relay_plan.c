/* tests/unit/test_relay_plan.c — the relay forest (daemon/relay_plan.h):
 * its shape, the planner's choice, and the simulation against hand-worked
 * cases and against the model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include "daemon/relay_plan.h"

#define GB 1e9

/* One sink rank of a replica behind a 400 Gbit/s NIC, 2 us a hop, 256 KiB
 * parts, the sources' NICs toward it 8 x 400 Gbit/s. */
static struct relay_in base(uint32_t replicas, double bytes)
{
	struct relay_in in = {
		.replicas = replicas, .bytes = bytes, .part_bytes = 256 * 1024,
		.src_rate = 8 * 50 * GB, .sink_rate = 50 * GB, .latency = 2e-6,
		.verify_s = 1e-6, .max_fanout = 0,
	};
	return in;
}

/* Every replica reaches a root through parents of smaller index, the
 * roots and fan-outs as asked. */
static void check_forest(const struct relay_plan *p)
{
	for (uint32_t i = 0; i < p->replicas; i++) {
		uint32_t hops = 0, kids = 0;
		int32_t j = (int32_t)i;

		if (i < p->roots)
			assert_int_equal(p->parent[i], -1);
		else
			assert_true(p->parent[i] >= 0 && (uint32_t)p->parent[i] < i);
		while (p->parent[j] >= 0) {
			j = p->parent[j];
			hops++;
		}
		assert_true(hops <= p->depth);
		for (uint32_t c = 0; c < p->replicas; c++)
			kids += p->parent[c] == (int32_t)i;
		assert_true(kids <= p->fanout);
	}
}

static void test_shapes(void **state)
{
	struct relay_in in = base(13, 64 * 1024 * 1024);
	struct relay_plan p;

	(void)state;
	/* a chain per root */
	assert_int_equal(relay_plan_shape(&in, 2, 1, &p), 0);
	check_forest(&p);
	assert_int_equal(p.depth, 6);           /* 11 more replicas over 2 chains */
	assert_int_equal(p.parent[12], 10);
	relay_plan_fini(&p);
	/* a binary tree under one root: 1 + 2 + 4 + 8 covers 13 */
	assert_int_equal(relay_plan_shape(&in, 1, 2, &p), 0);
	check_forest(&p);
	assert_int_equal(p.depth, 3);
	assert_int_equal(p.parent[1], 0);
	assert_int_equal(p.parent[3], 1);
	relay_plan_fini(&p);
	/* direct: every replica a root */
	assert_int_equal(relay_plan_shape(&in, 13, 4, &p), 0);
	check_forest(&p);
	assert_int_equal(p.depth, 0);
	assert_true(p.model_s == p.direct_s);
	relay_plan_fini(&p);
	assert_int_equal(relay_plan_shape(&in, 0, 1, &p), -1);
	assert_int_equal(relay_plan_shape(&in, 14, 1, &p), -1);
	in.bytes = 0;
	assert_int_equal(relay_plan_build(&in, &p), -1);
}

/* Worked by hand: 2 replicas, 4 parts of 1 MB, the sources at 1 MB/s, a
 * replica NIC at 2 MB/s, no latency, no verify.  Direct: the sources send
 * 8 copies back to back, the last done at 8 s.  A chain: the root gets
 * part q at q + 1 s (the sources' uplink is the slower), forwards it in
 * 0.5 s: the second replica's last part at 4.5 s. */
static void test_simulation_by_hand(void **state)
{
	struct relay_in in = { .replicas = 2, .bytes = 4e6, .part_bytes = 1e6, .src_rate = 1e6,
			       .sink_rate = 2e6 };
	struct relay_plan p;
	struct relay_sim s;

	(void)state;
	assert_int_equal(relay_plan_shape(&in, 2, 1, &p), 0);
	assert_int_equal(relay_simulate(&in, &p, &s), 0);
	assert_true(fabs(s.last_s - 8.0) < 1e-9);
	assert_true(fabs(s.first_done_s - 7.0) < 1e-9);
	assert_int_equal(s.source_sends, 8);
	assert_true(fabs(relay_model_s(&in, 2, 1) - s.last_s) < 1e-9);
	relay_plan_fini(&p);
	assert_int_equal(relay_plan_shape(&in, 1, 1, &p), 0);
	assert_int_equal(relay_simulate(&in, &p, &s), 0);
	assert_true(fabs(s.last_s - 4.5) < 1e-9);
	assert_true(fabs(s.first_done_s - 4.0) < 1e-9);
	assert_int_equal(s.sends, 8);
	assert_int_equal(s.source_sends, 4);
	assert_true(fabs(s.max_uplink_busy_s - 2.0) < 1e-9);
	assert_true(fabs(relay_model_s(&in, 1, 1) - s.last_s) < 1e-9);
	relay_plan_fini(&p);
	/* the planner picks the chain */
	assert_int_equal(relay_plan_build(&in, &p), 0);
	assert_int_equal(p.roots, 1);
	assert_true(p.model_s < p.direct_s);
	relay_plan_fini(&p);
	/* A relay's check takes 2 s a part: on one lane parts are ready at
	 * 3, 5, 7, 9 s and reach the child 1 s later (both NICs 1 MB/s),
	 * at 4, 6, 8, 10 s, and the child checks them too: its last at 12 s.
	 * On two lanes the root's are ready at 3, 4, 5, 6 s, reach the child
	 * at 4, 5, 6, 7 s, checked there by 6, 7, 8, 9 s. */
	in.src_rate = in.sink_rate = 1e6;
	in.verify_s = 2;
	assert_int_equal(relay_plan_shape(&in, 1, 1, &p), 0);
	assert_int_equal(relay_simulate(&in, &p, &s), 0);
	assert_true(fabs(s.last_s - 12.0) < 1e-9);
	assert_true(fabs(s.first_done_s - 9.0) < 1e-9);	/* the root's own last check */
	in.verify_lanes = 2;
	assert_int_equal(relay_simulate(&in, &p, &s), 0);
	assert_true(fabs(s.last_s - 9.0) < 1e-9);
	relay_plan_fini(&p);
	/* checks slower than the NIC make the planner send direct */
	in.verify_lanes = 1;
	assert_int_equal(relay_plan_build(&in, &p), 0);
	assert_int_equal(p.roots, 2);
	relay_plan_fini(&p);
}

/* At scale the planner's forest, simulated, stays within 1.25x of one
 * replica's time where direct grows with the replicas; the model agrees
 * with the simulation within 5 %. */
static void test_fanout_scales(void **state)
{
	static const uint32_t ns[] = { 1, 2, 4, 8, 16, 112, 896 };
	double one = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		struct relay_in in = base(ns[i], 3.75 * GB);
		struct relay_plan p, d;
		struct relay_sim s, sd;

		assert_int_equal(relay_plan_build(&in, &p), 0);
		check_forest(&p);
		assert_int_equal(relay_simulate(&in, &p, &s), 0);
		assert_int_equal(relay_plan_shape(&in, ns[i], 1, &d), 0);
		assert_int_equal(relay_simulate(&in, &d, &sd), 0);
		if (ns[i] == 1)
			one = s.last_s;
		print_message("relay R=%u roots=%u fanout=%u depth=%u relay_s=%.4f direct_s=%.4f "
			      "model_s=%.4f ratio_to_one=%.3f\n", ns[i], p.roots, p.fanout, p.depth,
			      s.last_s, sd.last_s, p.model_s, s.last_s / one);
		assert_true(s.last_s <= 1.25 * one);
		assert_true(s.last_s <= sd.last_s * (1 + 1e-9));
		assert_true(fabs(p.model_s - s.last_s) <= 0.05 * s.last_s);
		assert_true(fabs(d.model_s - sd.last_s) <= 0.05 * sd.last_s);
		if (ns[i] >= 16)
			assert_true(sd.last_s > 1.5 * one);   /* direct does not scale */
		relay_plan_fini(&p);
		relay_plan_fini(&d);
	}
}

/* relay_choose_measured: a replica under half the median of the measured
 * send rates is slow (a leaf); unmeasured ones are neither; roots and
 * fanout move off the configured shape only when the model gains more
 * than RELAY_RESHAPE_GAIN. */
static void test_measured_shape(void **state)
{
	double rate[5] = { 1e9, 1.1e9, 2e7, 0.9e9, 0 };
	uint8_t slow[5];
	struct relay_measured in = {
		.replicas = 5, .rate = rate, .roots = 1, .fanout = 1, .part_bytes = 256 << 10,
		.latency = 50e-6, .verify_s = 1e-4,
	};
	struct relay_choice ch;

	/* no source rate or bytes: the configured shape, the slow one found */
	assert_int_equal(relay_choose_measured(&in, &ch, slow), 0);
	assert_int_equal(ch.roots, 1);
	assert_int_equal(ch.fanout, 1);
	assert_int_equal(ch.modelled, 0);
	assert_int_equal(ch.nslow, 1);
	assert_int_equal(slow[2], 1);
	assert_int_equal(slow[0] + slow[1] + slow[3] + slow[4], 0);
	assert_true(ch.median > 0.89e9 && ch.median < 1.01e9);	/* of the 4 measured */

	/* at half the median exactly: not slow */
	rate[2] = 0.5 * ch.median;
	assert_int_equal(relay_choose_measured(&in, &ch, slow), 0);
	assert_int_equal(ch.nslow, 0);

	/* one measured rate: nothing to compare it with */
	{
		double one[3] = { 0, 1e6, 0 };
		struct relay_measured o = in;

		o.replicas = 3;
		o.rate = one;
		assert_int_equal(relay_choose_measured(&o, &ch, slow), 0);
		assert_int_equal(ch.nslow, 0);
	}

	/* equal links, a chain configured, a large version: the chain is
	 * within the gain of the model's best, so it stays */
	for (int i = 0; i < 5; i++)
		rate[i] = 1.25e9;
	in.src_rate = 1.25e9;
	in.bytes = 64e6;
	assert_int_equal(relay_choose_measured(&in, &ch, slow), 0);
	assert_int_equal(ch.roots, 1);
	assert_int_equal(ch.fanout, 1);
	assert_int_equal(ch.modelled, 0);
	assert_true(ch.model_s > 0 && ch.model_s == ch.fixed_s);

	/* every replica a root (direct) configured, a source link 10x
	 * slower than the replicas': the model relays (fewer roots) */
	in.roots = 5;
	in.fanout = 4;
	in.src_rate = 1.25e8;
	assert_int_equal(relay_choose_measured(&in, &ch, slow), 0);
	assert_int_equal(ch.modelled, 1);
	assert_true(ch.roots < 5);
	assert_true(ch.fanout >= 1 && ch.fanout <= 4);
	assert_true(ch.model_s < RELAY_RESHAPE_GAIN * ch.fixed_s);

	/* bad input */
	in.rate = NULL;
	assert_int_equal(relay_choose_measured(&in, &ch, slow), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shapes),
		cmocka_unit_test(test_simulation_by_hand),
		cmocka_unit_test(test_fanout_scales),
		cmocka_unit_test(test_measured_shape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
