/* daemon/relay_plan.c — the relay forest of one sink rank's replicas, its
 * time model and a deterministic simulation of it (relay_plan.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/relay_plan.h"

static int in_ok(const struct relay_in *in)
{
	return in && in->replicas >= 1 && in->bytes > 0 && in->part_bytes > 0 &&
	       in->src_rate > 0 && in->sink_rate > 0 && in->latency >= 0 && in->verify_s >= 0 &&
	       isfinite(in->bytes) && isfinite(in->part_bytes);
}

static uint64_t parts_of(const struct relay_in *in)
{
	double p = ceil(in->bytes / in->part_bytes);

	return p < 1 ? 1 : p > 1e12 ? (uint64_t)1e12 : (uint64_t)p;
}

/* Relay levels below the roots when each node feeds `fanout`. */
static uint32_t depth_of(uint32_t replicas, uint32_t roots, uint32_t fanout)
{
	uint64_t rem = replicas - roots, level = roots;
	uint32_t d = 0;

	while (rem > 0) {
		if (fanout > 1 && level < (uint64_t)1 << 40)
			level *= fanout;
		rem = rem > level ? rem - level : 0;
		d++;
	}
	return d;
}

double relay_model_s(const struct relay_in *in, uint32_t roots, uint32_t fanout)
{
	uint64_t P;
	double part, src, sink, b, fill;
	uint32_t depth;

	if (!in_ok(in) || roots < 1 || roots > in->replicas || fanout < 1)
		return INFINITY;
	P = parts_of(in);
	part = in->bytes / (double)P;
	src = part / in->src_rate;          /* the sources' uplink, one copy */
	sink = part / in->sink_rate;        /* one replica NIC, one copy */
	depth = depth_of(in->replicas, roots, fanout);
	/* per part: the sources send `roots` copies, a relay `fanout`, a
	 * replica's NIC takes one in, and every replica checks it (a relay
	 * before it forwards it, every replica before it stages it) */
	b = fmax(fmax(roots * src, sink), in->verify_s / (in->verify_lanes ? in->verify_lanes : 1));
	if (depth)
		b = fmax(b, fanout * sink);
	/* the first part's trip: to the last root, then each level's last
	 * child, each after a verify; the last replica's check of it */
	fill = roots * src + fmax(sink - src, 0) + in->latency + in->verify_s;
	if (depth)
		fill += depth * (in->verify_s + fanout * sink + in->latency);
	return (double)(P - 1) * b + fill;
}

int relay_plan_shape(const struct relay_in *in, uint32_t roots, uint32_t fanout,
		     struct relay_plan *out)
{
	memset(out, 0, sizeof(*out));
	if (!in_ok(in) || roots < 1 || roots > in->replicas || fanout < 1)
		return -1;
	out->parent = malloc(in->replicas * sizeof(*out->parent));
	if (!out->parent)
		return -1;
	out->replicas = in->replicas;
	out->roots = roots;
	out->fanout = roots == in->replicas ? 1 : fanout;
	for (uint32_t i = 0; i < in->replicas; i++)
		out->parent[i] = i < roots ? -1 : (int32_t)((i - roots) / out->fanout);
	out->depth = depth_of(in->replicas, roots, out->fanout);
	out->model_s = relay_model_s(in, roots, out->fanout);
	out->direct_s = relay_model_s(in, in->replicas, 1);
	return 0;
}

int relay_plan_build(const struct relay_in *in, struct relay_plan *out)
{
	uint32_t best_k = 0, best_f = 1, maxf;
	double best = INFINITY;

	memset(out, 0, sizeof(*out));
	if (!in_ok(in))
		return -1;
	maxf = in->max_fanout ? in->max_fanout : in->replicas;
	for (uint32_t k = 1; k <= in->replicas; k++) {
		uint32_t fmax_k = k == in->replicas ? 1 : in->replicas - k < maxf ? in->replicas - k : maxf;

		for (uint32_t f = 1; f <= fmax_k; f++) {
			double t = relay_model_s(in, k, f);

			if (t < best) {
				best = t;
				best_k = k;
				best_f = f;
			}
		}
	}
	return relay_plan_shape(in, best_k, best_f, out);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int relay_choose_measured(const struct relay_measured *in, struct relay_choice *out,
			  uint8_t *slow)
{
	double *known;
	uint32_t n = 0, roots, fanout;

	memset(out, 0, sizeof(*out));
	if (!in || !in->rate || !slow || in->replicas < 1 || in->roots < 1 || in->fanout < 1)
		return -1;
	roots = in->roots < in->replicas ? in->roots : in->replicas;
	fanout = in->fanout;
	out->roots = roots;
	out->fanout = fanout;
	memset(slow, 0, in->replicas);
	if (!(known = malloc(in->replicas * sizeof(*known))))
		return -1;
	for (uint32_t i = 0; i < in->replicas; i++)
		if (in->rate[i] > 0 && isfinite(in->rate[i]))
			known[n++] = in->rate[i];
	if (n) {
		qsort(known, n, sizeof(*known), cmp_double);
		out->median = n % 2 ? known[n / 2] : 0.5 * (known[n / 2 - 1] + known[n / 2]);
	}
	free(known);
	for (uint32_t i = 0; i < in->replicas && n >= 2; i++)
		if (in->rate[i] > 0 && in->rate[i] < RELAY_SLOW_FRACTION * out->median) {
			slow[i] = 1;
			out->nslow++;
		}
	if (out->median > 0 && in->src_rate > 0 && in->bytes > 0 && in->part_bytes > 0) {
		struct relay_in m = {
			.replicas = in->replicas, .bytes = in->bytes, .part_bytes = in->part_bytes,
			.src_rate = in->src_rate, .sink_rate = out->median, .latency = in->latency,
			.verify_s = in->verify_s, .verify_lanes = 1,
			.max_fanout = in->max_fanout ? in->max_fanout : in->fanout,
		};
		struct relay_plan best;

		if (relay_plan_build(&m, &best) < 0)
			return -1;
		out->fixed_s = relay_model_s(&m, roots, roots == in->replicas ? 1 : fanout);
		out->model_s = best.model_s;
		if (best.model_s < RELAY_RESHAPE_GAIN * out->fixed_s) {
			out->roots = best.roots;
			out->fanout = best.fanout;
			out->modelled = 1;
		} else {
			out->model_s = out->fixed_s;
		}
		relay_plan_fini(&best);
	}
	return 0;
}

void relay_plan_fini(struct relay_plan *p)
{
	free(p->parent);
	memset(p, 0, sizeof(*p));
}

/* Part p's transfer from a sender whose uplink is free at *up (rate
 * `rate`) to a receiver whose downlink is free at *down, the part ready at
 * `ready`: returns its arrival. */
static double send_part(double *up, double *down, double ready, double part, double rate,
			double down_rate, double latency)
{
	double t0 = fmax(fmax(*up, *down), ready);

	*up = t0 + part / rate;
	*down = t0 + part / fmin(rate, down_rate);
	return *down + latency;
}

static void sim_done(struct relay_sim *out, double t)
{
	out->first_done_s = fmin(out->first_done_s, t);
	out->last_s = fmax(out->last_s, t);
}

/* A leaf replica's check of part q, arrived at t, on its lanes (part q
 * on lane q mod L, each lane one part at a time, parts in order); done
 * once it has checked the last. */
static void leaf_check(const struct relay_in *in, struct relay_sim *out, double *lanes,
		       double *done, uint32_t L, uint64_t q, uint64_t P, double t)
{
	double *ln = &lanes[q % L];

	*ln = fmax(*ln, t) + in->verify_s;
	*done = fmax(*done, *ln);
	if (q == P - 1)
		sim_done(out, *done);
}

int relay_simulate(const struct relay_in *in, const struct relay_plan *p, struct relay_sim *out)
{
	uint32_t R, f, k, L = in && in->verify_lanes ? in->verify_lanes : 1;
	uint64_t P;
	double part, up, *down = NULL, **vec = NULL, *lane = NULL, *llanes = NULL, *ldone = NULL;
	int rc = -1;

	memset(out, 0, sizeof(*out));
	if (!in_ok(in) || !p || !p->parent || p->replicas != in->replicas || p->roots < 1 ||
	    p->roots > p->replicas || p->fanout < 1)
		return -1;
	R = p->replicas;
	k = p->roots;
	f = p->fanout;
	P = parts_of(in);
	part = in->bytes / (double)P;
	out->parts = P;
	out->first_done_s = INFINITY;
	/* Arrival times per part are kept only for replicas that feed others,
	 * from when their parent sent them until they have fed their
	 * children; replicas are visited in index order, parents first. */
	vec = calloc(R, sizeof(*vec));
	down = calloc(R, sizeof(*down));
	lane = malloc(L * sizeof(*lane));
	/* every leaf's own check lanes (a relay's are `lane`, in its turn) */
	llanes = calloc((size_t)R * L, sizeof(*llanes));
	ldone = calloc(R, sizeof(*ldone));
	if (!vec || !down || !lane || !llanes || !ldone)
		goto out;
#define FEEDS(i) ((uint64_t)k + (uint64_t)(i) * f < R)
	for (uint32_t r = 0; r < k; r++)
		if (FEEDS(r) && !(vec[r] = malloc(P * sizeof(double))))
			goto out;
	/* the sources: part-major over the roots */
	up = 0;
	for (uint64_t q = 0; q < P; q++)
		for (uint32_t r = 0; r < k; r++) {
			double t = send_part(&up, &down[r], 0, part, in->src_rate, in->sink_rate,
					     in->latency);
			if (vec[r])
				vec[r][q] = t;
			else
				leaf_check(in, out, &llanes[(size_t)r * L], &ldone[r], L, q, P, t);
		}
	out->source_sends = out->sends = P * k;
	for (uint32_t i = 0; i < R; i++) {
		uint32_t c0, c1;

		if (!FEEDS(i))
			continue;
		c0 = k + i * f;
		c1 = c0 + f < R ? c0 + f : R;
		for (uint32_t c = c0; c < c1; c++)
			if (FEEDS(c) && !(vec[c] = malloc(P * sizeof(double))))
				goto out;
		/* this relay's uplink: part-major over its children, each part
		 * forwarded once it is here and verified */
		up = 0;
		for (uint32_t l = 0; l < L; l++)
			lane[l] = 0;
		for (uint64_t q = 0; q < P; q++) {
			double *ln = &lane[q % L];
			double ready = (*ln = fmax(*ln, vec[i][q]) + in->verify_s);

			ldone[i] = fmax(ldone[i], ready);	/* its own check */
			for (uint32_t c = c0; c < c1; c++) {
				double t = send_part(&up, &down[c], ready, part, in->sink_rate,
						     in->sink_rate, in->latency);
				if (vec[c])
					vec[c][q] = t;
				else
					leaf_check(in, out, &llanes[(size_t)c * L], &ldone[c], L, q,
						   P, t);
			}
		}
		sim_done(out, ldone[i]);
		out->sends += P * (c1 - c0);
		out->max_uplink_busy_s = fmax(out->max_uplink_busy_s,
					      (double)P * (c1 - c0) * part / in->sink_rate);
		free(vec[i]);
		vec[i] = NULL;
	}
#undef FEEDS
	rc = 0;
out:
	for (uint32_t i = 0; vec && i < R; i++)
		free(vec[i]);
	free(vec);
	free(down);
	free(lane);
	free(llanes);
	free(ldone);
	return rc;
}
