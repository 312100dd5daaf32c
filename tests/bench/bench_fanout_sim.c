/* tests/bench/bench_fanout_sim.c — relay fan-out at internet scale, modelled
 * (issue 34): the relay planner (daemon/relay_plan.h) and its deterministic
 * part-by-part simulation, with the per-hop check measured here in the same
 * run: what a relay does to a 256 KiB PAYLOAD part before forwarding it,
 * as the data path does it (daemon/job_sink_intake.c, relay_forward): the
 * record's MAC checked where it comes in (proto/peer_auth.h), the raw
 * chunk's XXH3; the record goes on with its source's MAC, not sealed
 * again (a RELAYED's own MAC covers its small header).  Both on the
 * daemon's loop thread: one lane.
 *
 * The deployment: 1000 nodes, 128 trainer nodes and 896 inference nodes,
 * 8 ranks a node each behind its own 400 Gbit/s NIC, 2 us a hop; a
 * 1T-parameter model at 1 % changed elements, 3.01 wire bytes per changed
 * element (docs/BENCHMARKS.md, the codec's default at lr 1e-6), each
 * inference replica one node at TP 8, so each rank's forest spans the 896
 * replicas and the trainers' 1024 NICs feed the 8 ranks' forests together.
 * Direct: every (source, replica) pair its own transfer (dted today).
 *
 *   bench fanout-verify part_bytes=.. xxh3_us=.. mac_us=.. verify_us=..
 *   bench fanout-model version=sparse|dense verify_lanes=L sinks=N direct_s=..
 *       relay_s=.. ratio_to_one_sink=..   (10 Gbit/s links, as the namespace
 *       measurement the issue asks for would shape them)
 *   bench fanout-model-1024 nodes=1024 version_s=.. relay_s=.. ratio=.. verify_us=..
 *       verify_lanes=14 relay_plan_ms=.. roots=.. fanout=.. depth=..
 *   bench fanout-model-1024-needed ... verify_lanes=L   (lanes for the NIC's rate)
 *
 * The same deployment with the real engine code (1 + 896 engines on the
 * fixture's timed links, against this model in the same run):
 * tests/bench/bench_fanout_fixture.c's `bench fanout-sim` line.
 *
 * A model of the relay (docs/SYNC.md, "Relay between sink daemons"); the
 * data path itself is measured by tests/bench/bench_fanout.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/relay_plan.h"
#include "tests/bench/fanout_check.h"

#define GB 1e9

static int run(const struct relay_in *in, struct relay_plan *p, struct relay_sim *relay,
	       struct relay_sim *direct, double *plan_s)
{
	struct relay_plan d;
	double t0 = now();
	int rc;

	if (relay_plan_build(in, p) < 0)
		return -1;
	*plan_s = now() - t0;
	if (relay_simulate(in, p, relay) < 0 || relay_plan_shape(in, in->replicas, 1, &d) < 0)
		return -1;
	rc = relay_simulate(in, &d, direct);
	relay_plan_fini(&d);
	return rc;
}

int main(void)
{
	const double nic = 400e9 / 8, part = 256 * 1024, lat = 2e-6;
	const double changed = 1e12 * 0.01, wire = 3.01, ranks = 8;
	const unsigned src_nodes = 128, sink_nodes = 896;
	unsigned lanes[2];
	/* the namespace measurement's setup (docs/BENCHMARKS.md e2e): the
	 * bench_scan model's sparse version at lr 1e-6 (payload 40635090 B)
	 * and its dense one (2 B x 276836608), 10 Gbit/s links */
	const double versions[] = { 40635090.0, 2.0 * 276836608 }, link = 10e9 / 8;
	double xxh3_s, mac_s, mac8_s, verify, plan_s;
	struct relay_in in;
	struct relay_plan p;
	struct relay_sim s, d;

	if (verify_cost((size_t)part, &xxh3_s, &mac_s, &mac8_s) < 0)
		return 1;
	verify = xxh3_s + mac_s;
	printf("bench fanout-verify part_bytes=%.0f xxh3_us=%.1f mac_us=%.1f verify_us=%.1f "
	       "verify_GBps=%.2f mac_blake2b_us=%.1f mac_speedup=%.2f (Poly1305, protocol 9, "
	       "against keyed BLAKE2b, 5..8)\n", part, xxh3_s * 1e6, mac_s * 1e6, verify * 1e6,
	       part / verify / 1e9, mac8_s * 1e6, mac8_s / mac_s);
	/* lanes: 1 (the data path checks on its loop thread), then as many
	 * as keep the check at the link's rate */
	for (int v = 0; v < 4; v++) {
		double one = 0;
		unsigned need = (unsigned)ceil(verify * link / part);

		memset(&in, 0, sizeof(in));
		in.bytes = versions[v % 2];
		in.part_bytes = part;
		in.src_rate = in.sink_rate = link;
		in.latency = 50e-6;
		in.verify_s = verify;
		in.verify_lanes = v < 2 ? 1 : need;
		for (unsigned n = 1; n <= 16; n *= 2) {
			in.replicas = n;
			if (run(&in, &p, &s, &d, &plan_s) < 0)
				return 1;
			if (n == 1)
				one = s.last_s;
			printf("bench fanout-model version=%s verify_lanes=%u sinks=%u direct_s=%.4f "
			       "relay_s=%.4f ratio_to_one_sink=%.3f direct_ratio=%.3f roots=%u "
			       "fanout=%u\n", v % 2 ? "dense" : "sparse", in.verify_lanes, n, d.last_s,
			       s.last_s, s.last_s / one, d.last_s / one, p.roots, p.fanout);
			relay_plan_fini(&p);
		}
	}
	/* 14: a 112-core node's cores shared by its 8 NICs; then as many as
	 * keep the check at the NIC's rate */
	lanes[0] = 14;
	lanes[1] = (unsigned)ceil(verify * nic / part);
	for (int l = 0; l < 2; l++) {
		double one;

		memset(&in, 0, sizeof(in));
		in.bytes = changed * wire / ranks;
		in.part_bytes = part;
		/* every trainer NIC holds a share of every inference rank's bytes */
		in.src_rate = src_nodes * ranks * nic / ranks;
		in.sink_rate = nic;
		in.latency = lat;
		in.verify_s = verify;
		in.verify_lanes = lanes[l];
		in.replicas = 1;
		if (run(&in, &p, &s, &d, &plan_s) < 0)
			return 1;
		one = s.last_s;
		relay_plan_fini(&p);
		in.replicas = sink_nodes;
		if (run(&in, &p, &s, &d, &plan_s) < 0)
			return 1;
		printf("bench fanout-model-1024%s nodes=%u sources=%u sinks=%u version_s=%.4f relay_s=%.4f "
		       "ratio=%.1f ratio_to_one_sink=%.3f verify_us=%.1f verify_lanes=%u "
		       "relay_plan_ms=%.2f roots=%u fanout=%u depth=%u source_sends=%llu "
		       "max_uplink_busy_s=%.4f\n", l ? "-needed" : "",
		       src_nodes + sink_nodes, src_nodes, sink_nodes, d.last_s, s.last_s,
		       d.last_s / s.last_s, s.last_s / one, verify * 1e6, lanes[l], plan_s * 1e3,
		       p.roots, p.fanout, p.depth, (unsigned long long)s.source_sends,
		       s.max_uplink_busy_s);
		relay_plan_fini(&p);
	}
	return 0;
}
