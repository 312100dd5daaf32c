/* daemon/relay_plan.h — who feeds whom when sink replicas relay a version
 * (issue 34; docs/SYNC.md "Relay between sink daemons").
 *
 * Replicas of one sink layout need the same bytes, part for part, so the
 * sources need send each part only to a few roots; every other replica
 * gets it from a replica that has verified it, pipelined part by part.
 * This is the coordinator's choice of that forest for one sink rank (all
 * replicas' rank r: one NIC each) and the model it is chosen by, plus a
 * deterministic simulation of the pipelined forwarding the design
 * describes.  The engine's relay data path (daemon/job_sink_intake.c)
 * agrees with the model within a few per cent on the engine fixture's
 * timed links (tests/bench/bench_fanout_fixture.c, tests/system/
 * fanout_fixture.py), given the parts' real size: a part holds whole
 * plan entries, so it can exceed part_bytes.
 *
 * The forest: replicas 0..roots-1 are fed by the sources; replica i >=
 * roots by parent (i - roots) / fanout, so a parent precedes its children
 * and the forest has depth ceil(log_fanout) levels (fanout 1: a chain per
 * root).  Each parent forwards a part to its children in order, once it
 * has the part and has verified it.
 */
#ifndef DTE_RELAY_PLAN_H
#define DTE_RELAY_PLAN_H

#include <stddef.h>
#include <stdint.h>

/* One sink rank's version as the planner sees it.  Rates are bytes per
 * second, times seconds. */
struct relay_in {
	uint32_t replicas;     /* R >= 1: replicas of one layout (this rank of each) */
	double   bytes;        /* what one replica's rank receives of a version */
	double   part_bytes;   /* a PAYLOAD part (the capture's part size) */
	double   src_rate;     /* the sources' uplinks toward this rank, together */
	double   sink_rate;    /* each replica's NIC, each direction */
	double   latency;      /* per hop */
	double   verify_s;     /* a relay's check of one part before forwarding it */
	uint32_t verify_lanes; /* parts a relay checks at once (cores); 0 means 1 */
	uint32_t max_fanout;   /* 0: no bound */
};

struct relay_plan {
	uint32_t replicas, roots, fanout;
	int32_t *parent;       /* [replicas]: -1 fed by the sources, else the replica */
	uint32_t depth;        /* relay hops below the roots */
	double   model_s;      /* the model's time for the chosen forest */
	double   direct_s;     /* the model's time with every replica a root */
};

/* The model's time of a version through the forest (roots, fanout): the
 * slowest uplink per part times the parts, plus the pipeline's fill, one
 * part's trip per level.  roots == replicas is the direct transfer. */
double relay_model_s(const struct relay_in *in, uint32_t roots, uint32_t fanout);

/* The forest of least model time (ties: fewer roots, then smaller
 * fanout); relay_plan_fini frees it.  -1 on bad input or no memory. */
int  relay_plan_build(const struct relay_in *in, struct relay_plan *out);
/* The same forest shape, given. */
int  relay_plan_shape(const struct relay_in *in, uint32_t roots, uint32_t fanout,
		      struct relay_plan *out);
void relay_plan_fini(struct relay_plan *p);

/* The shape from measured rates ([peer] relay_shape = measured;
 * docs/SYNC.md, "Relay shape from measured links").  rate[i] is replica
 * i's measured send rate (0: not measured); a replica under
 * RELAY_SLOW_FRACTION of the median of the measured ones is slow (its
 * tree plans it as a leaf, after the others).  With the sources' rate,
 * the median and a version's bytes known, the roots and fanout are the
 * model's best (relay_plan_build, fanout at most max_fanout) when its
 * time is under RELAY_RESHAPE_GAIN of the configured shape's (roots,
 * fanout): the configured one otherwise, so equal links keep it. */
#define RELAY_SLOW_FRACTION (1.0 / 3.0)
#define RELAY_RESHAPE_GAIN  0.8

struct relay_measured {
	uint32_t replicas;
	const double *rate;     /* [replicas] */
	double src_rate;        /* the sources' send rate; 0: not measured */
	double bytes;           /* a version's bytes for one replica's rank; 0: unknown */
	double part_bytes, latency, verify_s;
	uint32_t roots, fanout; /* configured (relay_roots, relay_fanout) */
	uint32_t max_fanout;    /* 0: fanout */
};

struct relay_choice {
	uint32_t roots, fanout;
	double median;          /* of the measured rates (0: none) */
	double model_s, fixed_s;/* the model's time of the chosen and the configured shape (modelled) */
	int modelled;           /* roots and fanout came from the model */
	uint32_t nslow;
};

/* slow: the caller's [replicas], set to 1 for each slow replica.  -1 on
 * bad input. */
int relay_choose_measured(const struct relay_measured *in, struct relay_choice *out,
			  uint8_t *slow);

/* A deterministic part-by-part simulation of the forest: the sources'
 * uplink sends each part to the roots in order; a replica's part arrives
 * a serialization (part / the slower of the two NICs) plus a latency after
 * its sender's uplink is free and the part ready there; a relay checks
 * parts on verify_lanes lanes (part q on lane q mod lanes, each lane one
 * part at a time) and forwards each, checked, to its children in order,
 * uplink FIFO over parts; every replica, a leaf too, is done when it has
 * checked its last part (the data path checks every PAYLOAD it takes:
 * tests/bench/bench_fanout_fixture.c showed a model without the leaves'
 * check 2.8x short of the engine's time when checks bound it).  Every arrival time is a function of the input
 * alone. */
struct relay_sim {
	double   last_s;       /* the last part at the last replica */
	double   first_done_s; /* the first replica complete */
	uint64_t parts;        /* per replica */
	uint64_t sends;        /* part transfers in all, the sources' included */
	uint64_t source_sends; /* of those, from the sources */
	double   max_uplink_busy_s;  /* the busiest relay's uplink */
};
int relay_simulate(const struct relay_in *in, const struct relay_plan *p, struct relay_sim *out);

#endif
