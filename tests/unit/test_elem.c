/* Element math: BF16 rounding against an independent reference; the AdamW
 * inverse, the guard and the cpu detector against real optimizer steps
 * recorded by torch (tests/data/adamw/, see adamw_ref.h); then stress
 * tests over many simulated steps (the forward there is elem.h's own,
 * which the fixture test first holds bit-exact to torch); hyper-parameter
 * checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gpu/backend.h"
#include "gpu/compute.h"
#include "gpu/elem.h"
#include "adamw_ref.h"

static uint64_t rng_state = 0x1234567887654321ull;

static uint64_t rnd(void)
{
	return dtc_mix64(rng_state++);
}

static double unif(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

static double gauss(void)
{
	double u = unif(), v = unif();

	return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* Reference RNE by exact comparison of distances in double: both
 * candidates and x are exact in double and their differences too. */
static uint16_t ref_bf16(float x)
{
	uint32_t u = dtc_f32_bits(x), mag = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
	uint16_t lo, hi, r;
	double dx, dlo, dhi;

	if (isnan(x))
		return 0xffff;	/* marker: caller checks NaN-ness */
	if (isinf(x))
		return (uint16_t)(sign | 0x7f80u);
	lo = (uint16_t)(mag >> 16);
	hi = (uint16_t)(lo + 1);
	dx = (double)dtc_bits_f32(mag);
	dlo = (double)dtc_bits_f32((uint32_t)lo << 16);
	dhi = hi == 0x7f80 ? ldexp(1.0, 128) : (double)dtc_bits_f32((uint32_t)hi << 16);
	if (dx - dlo < dhi - dx)
		r = lo;
	else if (dx - dlo > dhi - dx)
		r = hi;
	else
		r = (lo & 1) ? hi : lo;
	return (uint16_t)(sign | r);
}

static void check_one(uint32_t bits)
{
	float x = dtc_bits_f32(bits);
	uint16_t got = dtc_bf16_rne(x), want = ref_bf16(x);

	if (isnan(x)) {
		/* NaN stays NaN, quiet, same sign */
		assert_true(isnan(dtc_bf16_f32(got)));
		assert_true(got & 0x0040);
		assert_int_equal(got & 0x8000, (bits >> 16) & 0x8000);
		return;
	}
	if (got != want)
		fail_msg("bf16(0x%08x) = 0x%04x, reference 0x%04x", bits, got, want);
}

static void test_bf16_edges(void **state)
{
	static const struct { uint32_t in; uint16_t out; } cases[] = {
		{ 0x00000000, 0x0000 }, { 0x80000000, 0x8000 },	/* ±0 */
		{ 0x7f800000, 0x7f80 }, { 0xff800000, 0xff80 },	/* ±Inf */
		{ 0x7f7fffff, 0x7f80 }, { 0xff7fffff, 0xff80 },	/* max finite -> Inf */
		{ 0x7f7f7fff, 0x7f7f },				/* just below half */
		{ 0x7f7f8000, 0x7f80 },				/* tie, odd -> Inf */
		{ 0x7f7e8000, 0x7f7e },				/* tie, even stays */
		{ 0x3f808000, 0x3f80 }, { 0x3f818000, 0x3f82 },	/* ties to even */
		{ 0x3f808001, 0x3f81 },				/* above tie */
		{ 0x00000001, 0x0000 }, { 0x80000001, 0x8000 },	/* min subnormal */
		{ 0x00008000, 0x0000 }, { 0x00018000, 0x0002 },	/* subnormal ties */
		{ 0x007fffff, 0x0080 },				/* subnormal -> normal */
		{ 0x00400000, 0x0040 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint16_t got = dtc_bf16_rne(dtc_bits_f32(cases[i].in));

		if (got != cases[i].out)
			fail_msg("bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].in, got, cases[i].out);
		check_one(cases[i].in);
	}
	/* NaNs, including ones whose payload sits only in the dropped half
	 * (naive rounding would turn them into Inf) and the all-ones one. */
	check_one(0x7f800001);
	check_one(0xff800001);
	check_one(0x7fc00000);
	check_one(0x7fffffff);
	check_one(0xffffffff);
	check_one(0x7f80ffff);
}

static void test_bf16_random(void **state)
{
	for (int i = 0; i < 4000000; i++)
		check_one((uint32_t)rnd());
	/* every bf16 value with a dense walk of its neighbourhood */
	for (uint32_t hi = 0; hi < 0x10000; hi++)
		for (uint32_t lo = 0x7ffe; lo <= 0x8001; lo++)
			check_one(hi << 16 | lo);
	/* round trip: a bf16 value converts to itself */
	for (uint32_t b = 0; b < 0x10000; b++)
		if (!isnan(dtc_bf16_f32((uint16_t)b)))
			assert_int_equal(dtc_bf16_rne(dtc_bf16_f32((uint16_t)b)), b);
}

static void derive(struct dtc_consts *k, int variant, double lr, double wd, int64_t step)
{
	struct dtc_hparams hp = { lr, 0.9, 0.999, 1e-8, wd, step, variant };
	char why[128];

	assert_int_equal(dtc_hparams_derive(&hp, k, why, sizeof(why)), DTC_OK);
}

/* Simulated AdamW steps with the forward from elem.h: every real BF16
 * change must be flagged, and few unchanged elements may be. */
static void run_guard(int variant, double lr, double wd, int n, int steps, double max_fp)
{
	float *th = malloc(sizeof(float) * (size_t)n), *m = calloc((size_t)n, sizeof(float));
	float *v = calloc((size_t)n, sizeof(float));
	uint64_t fn = 0, fp = 0, changed = 0, total = 0, quiet = 0;

	assert_non_null(th);
	assert_non_null(m);
	assert_non_null(v);
	for (int i = 0; i < n; i++) {
		/* most weights ~N(0, 0.02); some tiny, some zero, some subnormal */
		double s = i % 97 == 0 ? 1e-6 : i % 89 == 0 ? 1e-30 : 0.02;

		th[i] = i % 101 == 0 ? 0.0f : (float)(gauss() * s);
		if (i % 103 == 0)
			th[i] = dtc_bits_f32((uint32_t)(rnd() & 0x807fffffu));
	}
	for (int t = 1; t <= steps; t++) {
		struct dtc_consts k;

		derive(&k, variant, lr, wd, t);
		for (int i = 0; i < n; i++) {
			double g = gauss() * 1e-3 * (i % 13 == 0 ? 30 : 1);
			float gf = i % 17 == 0 ? 0.0f : (float)g;
			float prev = th[i];

			m[i] = 0.9f * m[i] + 0.1f * gf;
			v[i] = 0.999f * v[i] + 0.001f * gf * gf;
			th[i] = dtc_adamw_forward(&k, prev, m[i], v[i]);
			{
				int truth = dtc_bf16_rne(prev) != dtc_bf16_rne(th[i]);
				int flag = dtc_adamw_flag(&k, th[i], m[i], v[i]);
				int full = dtc_adamw_changed(&k, th[i], m[i], v[i]);

				/* the cheap test only ever clears, never misses */
				if (truth && !dtc_adamw_changed(&k, th[i], m[i], v[i]))
					fn++;
				quiet += (uint64_t)dtc_adamw_quiet(&k, th[i], m[i], v[i]);
				assert_true(flag <= full);

				changed += (uint64_t)truth;
				fn += (uint64_t)(truth && !flag);
				fp += (uint64_t)(!truth && flag);
				total++;
			}
		}
	}
	print_message("variant=%d lr=%g wd=%g changed=%.3f%% fn=%llu fp=%.4f%% quiet=%.2f%%\n",
		      variant, lr, wd, 100.0 * (double)changed / (double)total, (unsigned long long)fn,
		      100.0 * (double)fp / (double)total, 100.0 * (double)quiet / (double)total);
	assert_int_equal(fn, 0);
	assert_true((double)fp / (double)total <= max_fp);
	assert_true(quiet > total / 3);	/* the fast path does its job */
	assert_true(changed > 0);
	free(th);
	free(m);
	free(v);
}

/* ------------------------------------------------ torch ground truth */

/* Recorded optimizer steps (tests/data/adamw/gen_fixtures.py).  `torch`
 * marks the flavours whose θ update is torch's: ref_torch_adamw() must
 * reproduce them bit for bit from the recorded sqrt.  `exact` marks those
 * elem.h's forward claims to mirror bit for bit wherever the trainer's
 * sqrt is IEEE (te-fma is TE's kernel as nvcc contracts it by default: the
 * forward differs there, the inverse must still hold). */
static const struct {
	const char *name;
	int torch, exact;
} flavours[] = {
	{ "torch2.13-single", 1, 1 },
	{ "torch2.13-foreach", 1, 1 },
	{ "torch2.13-fused", 1, 1 },
	{ "torch1.13-single", 1, 1 },
	{ "te-order", 0, 1 },
	{ "te-fma", 0, 0 },
};

struct fx_tally {
	uint64_t elements, changed, missed, fp, bad_bound, bad_rne, bad_ref, fwd_diff;
	uint64_t sqrt_off;              /* the trainer's sqrt was not IEEE's */
	uint64_t eps_dom, eps_dom_changed, zero_grad, zero_grad_changed;
	double worst;                   /* max |θ̂ − θ_{t-1}| / bound */
};

/* One recorded step: every element's verdict from the element math and,
 * independently, from the cpu backend's scan + sparse extract, against
 * torch's BF16 before and after. */
static void fx_check_step(const struct fx_case *c, const struct fx_step *s, const float *prev,
			  const uint16_t *prevbf, int fl, struct fx_tally *t)
{
	struct dtc_hparams hp = { c->lr, c->beta1, c->beta2, c->eps, c->wd, s->step, c->variant };
	struct dtc_consts k;
	struct dte_box_map box = { .ndim = 1 };
	struct dtc_src src = { s->theta, s->m, s->v, c->n };
	uint64_t words = (c->n + 63) / 64, count = 0, nout = 0;
	uint64_t *bitmap = calloc(words, 8), *pos = calloc(c->n, 8);
	uint16_t *val = calloc(c->n, 2);
	double bc2s = sqrt(1.0 - pow(c->beta2, (double)s->step));
	char why[128];

	assert_non_null(bitmap);
	assert_non_null(pos);
	assert_non_null(val);
	assert_int_equal(dtc_hparams_derive(&hp, &k, why, sizeof(why)), DTC_OK);
	box.extent[0] = c->n;
	box.src_stride[0] = box.dst_stride[0] = 1;
	assert_int_equal(dtc_scan(dtc_backend_cpu(), &box, &k, &src, bitmap, words, DTC_SCAN_SET,
				  &count), DTC_OK);
	assert_int_equal(dtc_sparse_from_bitmap(dtc_backend_cpu(), &box, bitmap, words, s->theta,
						c->n, pos, val, c->n, &nout), DTC_OK);
	assert_int_equal(nout, count);
	for (uint64_t j = 0; j < nout; j++) {
		assert_true(pos[j] < c->n && (j == 0 || pos[j] > pos[j - 1]));
		if (val[j] != s->bf16[pos[j]])
			fail_msg("%s/%s step %lld: scan emits %04x at %llu, torch's bf16 is %04x",
				 flavours[fl].name, c->name, (long long)s->step, val[j],
				 (unsigned long long)pos[j], s->bf16[pos[j]]);
	}
	for (uint32_t i = 0; i < c->n; i++) {
		float th = s->theta[i], m = s->m[i], v = s->v[i];
		int truth = prevbf[i] != s->bf16[i];
		int flag = dtc_adamw_flag(&k, th, m, v);
		int scanned = (int)(bitmap[i / 64] >> (i % 64) & 1);
		float u = dtc_adamw_u(&k, m, v);
		float thh = dtc_adamw_prev(&k, th, u);
		double err = fabs((double)thh - (double)prev[i]);
		double bound = (double)dtc_guard_bound(thh, th, u);

		t->elements++;
		t->changed += (uint64_t)truth;
		float ieee = c->variant == DTC_VARIANT_TORCH ? sqrtf(v) : sqrtf(v / k.bc2);
		int sqrt_ok = dtc_f32_bits(ieee) == dtc_f32_bits(s->sqrt_v[i]);

		t->bad_rne += dtc_bf16_rne(th) != s->bf16[i];
		t->sqrt_off += (uint64_t)!sqrt_ok;
		if (flavours[fl].torch)
			t->bad_ref += dtc_f32_bits(ref_torch_adamw(prev[i], m, s->sqrt_v[i], c->lr,
								   c->beta1, c->beta2, c->eps, c->wd,
								   s->step)) != dtc_f32_bits(th);
		/* elem.h's forward mirrors the trainer's where its sqrt is IEEE */
		t->fwd_diff += sqrt_ok &&
			       dtc_f32_bits(dtc_adamw_forward(&k, prev[i], m, v)) != dtc_f32_bits(th);
		/* The inverse lands within its stated bound of torch's θ_{t-1}. */
		if (err > bound) {
			t->bad_bound++;
			print_message("%s/%s step %lld elem %u: θ_prev %a, inverse %a, off %g > bound %g\n",
				      flavours[fl].name, c->name, (long long)s->step, i, (double)prev[i],
				      (double)thh, err, bound);
		}
		if (bound > 0 && err / bound > t->worst)
			t->worst = err / bound;
		/* No missed change, by the element math or by the backend. */
		if (truth && (!flag || !scanned)) {
			t->missed++;
			print_message("%s/%s step %lld elem %u: bf16 %04x -> %04x missed (flag %d scan %d)\n",
				      flavours[fl].name, c->name, (long long)s->step, i, prevbf[i],
				      s->bf16[i], flag, scanned);
		}
		t->fp += (uint64_t)(!truth && scanned);
		if ((float)c->eps > sqrtf(v) / (float)bc2s) {
			t->eps_dom++;
			t->eps_dom_changed += (uint64_t)truth;
		}
		if (s->grad[i] == 0.0f) {
			t->zero_grad++;
			t->zero_grad_changed += (uint64_t)truth;
		}
	}
	free(bitmap);
	free(pos);
	free(val);
}

static void test_torch_fixtures(void **state)
{
	for (size_t fl = 0; fl < sizeof(flavours) / sizeof(flavours[0]); fl++) {
		struct fx_tally t = { 0 };
		struct fx_file f;
		char path[256];
		int wd_on = 0, wd_off = 0, fresh = 0, warm = 0, multi = 0;

		snprintf(path, sizeof(path), "tests/data/adamw/%s.bin", flavours[fl].name);
		if (fx_load(&f, path))
			fail_msg("%s: missing or malformed (run from the repo root)", path);
		for (uint32_t ci = 0; ci < f.ncases; ci++) {
			const struct fx_case *c = &f.c[ci];
			const float *prev = c->theta0;
			const uint16_t *prevbf = c->bf16_0;
			uint64_t ch0 = t.changed, n0 = t.elements;

			for (uint32_t i = 0; i < c->n; i++)
				t.bad_rne += dtc_bf16_rne(c->theta0[i]) != c->bf16_0[i];
			for (uint32_t k = 0; k < c->steps; k++) {
				assert_int_equal(c->s[k].step, c->step0 + 1 + (int64_t)k);
				fx_check_step(c, &c->s[k], prev, prevbf, (int)fl, &t);
				prev = c->s[k].theta;
				prevbf = c->s[k].bf16;
			}
			/* every case moves some BF16 values and leaves others */
			assert_true(t.changed > ch0 && t.changed < ch0 + (t.elements - n0));
			wd_on += c->wd != 0;
			wd_off += c->wd == 0;
			fresh += c->step0 == 0;
			warm += c->step0 >= 100;
			multi += c->steps >= 3;
		}
		print_message("fixture %s: cases=%u elements=%llu changed=%llu missed=%llu "
			      "false_pos=%llu eps_dominant=%llu(changed %llu) zero_grad=%llu(changed %llu) "
			      "worst_err/bound=%.3f forward_bit_diffs=%llu non_ieee_sqrt=%llu\n",
			      flavours[fl].name, f.ncases, (unsigned long long)t.elements,
			      (unsigned long long)t.changed, (unsigned long long)t.missed,
			      (unsigned long long)t.fp, (unsigned long long)t.eps_dom,
			      (unsigned long long)t.eps_dom_changed, (unsigned long long)t.zero_grad,
			      (unsigned long long)t.zero_grad_changed, t.worst,
			      (unsigned long long)t.fwd_diff, (unsigned long long)t.sqrt_off);
		/* The fixture covers what it claims: weight decay on and off, bias
		 * correction at step 1 and after a long warm-up, several steps,
		 * eps-dominated denominators and zero gradients, with changes. */
		assert_true(wd_on && wd_off && fresh && warm && multi == (int)f.ncases);
		assert_true(t.eps_dom_changed > 0 && t.zero_grad_changed > 0);
		assert_true(t.zero_grad > t.zero_grad_changed);
		/* torch's BF16 is RNE; the test's reference is torch's θ update. */
		assert_int_equal(t.bad_rne, 0);
		assert_int_equal(t.bad_ref, 0);
		if (flavours[fl].exact)
			assert_int_equal(t.fwd_diff, 0);
		assert_int_equal(t.bad_bound, 0);
		assert_int_equal(t.missed, 0);
		/* Flagging an unchanged element costs bytes, not correctness; the
		 * fixtures crowd weights near BF16 midpoints, so allow 5%. */
		assert_true(t.fp * 20 <= t.elements);
		fx_free(&f);
	}
}

static void test_guard_torch(void **state)
{
	run_guard(DTC_VARIANT_TORCH, 1e-5, 0.1, 100000, 8, 1e-3);
	run_guard(DTC_VARIANT_TORCH, 1e-7, 0.0, 100000, 8, 1e-3);
	run_guard(DTC_VARIANT_TORCH, 1e-4, 0.01, 100000, 8, 1e-3);
}

static void test_guard_fused(void **state)
{
	run_guard(DTC_VARIANT_FUSED, 1e-5, 0.1, 100000, 8, 1e-3);
	run_guard(DTC_VARIANT_FUSED, 1e-6, 0.0, 100000, 8, 1e-3);
	run_guard(DTC_VARIANT_FUSED, 1e-4, 0.01, 100000, 8, 1e-3);
}

/* The guard must fire: an element with no update whose BF16 cannot have
 * moved is quiet; NaN/Inf weights are always reported. */
static void test_guard_directed(void **state)
{
	struct dtc_consts k;

	derive(&k, DTC_VARIANT_TORCH, 1e-5, 0.0, 3);
	assert_int_equal(dtc_adamw_changed(&k, 0.015625f, 0.0f, 0.0f), 0);
	assert_int_equal(dtc_adamw_changed(&k, NAN, 0.0f, 0.0f), 1);
	assert_int_equal(dtc_adamw_changed(&k, INFINITY, 0.0f, 0.0f), 1);
	assert_int_equal(dtc_adamw_changed(&k, 0.5f, NAN, 1.0f), 1);
	/* θ_t exactly on a BF16 rounding midpoint with a tiny update: the
	 * previous value may be on either side, so it must be flagged. */
	assert_int_equal(dtc_adamw_changed(&k, dtc_bits_f32(0x3f808000), 1e-9f, 1.0f), 1);
}

/* Adversarial: previous weights a few ulps from a BF16 rounding midpoint
 * (also just below powers of two, where the ulp halves), updates of every
 * size, both signs, both variants: the reported verdict never misses. */
static void test_guard_midpoints(void **state)
{
	uint64_t fn = 0, n = 0;

	for (int variant = 0; variant < 2; variant++) {
		for (int it = 0; it < 400000; it++) {
			struct dtc_consts k;
			uint32_t hi = (uint32_t)(rnd() % 0x7f00u) | (rnd() & 1 ? 0x8000u : 0);
			uint32_t bits = it % 3 == 0 ? (hi & 0xff80u) << 16 : (hi << 16) | 0x8000u;
			float prev = dtc_bits_f32(bits + (uint32_t)(int32_t)(rnd() % 33) - 16u);
			float m = (float)(gauss() * pow(10.0, -(double)(rnd() % 12)));
			float v = (float)(m * m * (0.5 + unif() * 4)) + (rnd() % 5 == 0 ? 0.0f : 1e-30f);
			double lr = pow(10.0, -3.0 - (double)(rnd() % 6)), wd = (rnd() % 3) * 0.05;
			float theta;
			int truth;

			derive(&k, variant, lr, wd, 1 + (int64_t)(rnd() % 50));
			theta = dtc_adamw_forward(&k, prev, m, v);
			truth = dtc_bf16_rne(prev) != dtc_bf16_rne(theta);
			fn += (uint64_t)(truth && !dtc_adamw_flag(&k, theta, m, v));
			n += (uint64_t)truth;
		}
	}
	print_message("midpoints: changed=%llu missed=%llu\n", (unsigned long long)n,
		      (unsigned long long)fn);
	assert_true(n > 1000);
	assert_int_equal(fn, 0);
}

/* The inverse against its own bound where it is tightest: FusedAdam with
 * lr·wd near the 1/2 limit hparams.c admits (lr 0.1, wd 4.944:
 * c = 0.506), weights with mantissa just above 1 (where e is smallest in
 * ulps), steps from far below eps to lr.  The forward's fl(wd·θ),
 * fl(m̂/d + wd·θ) and fl(lr·update) each round at the size of lr·wd·|θ|,
 * about |θ|/2 here, and θ_t − u is divided by c: elem.h's analysis ("lr·upd
 * and the decay term add two roundings of the size of u") leaves that out,
 * and the real error reaches past half of e (0.53).  So the band cannot be
 * halved: every element must stay within it, and some must need more than
 * half of it (the planted-at-the-bound check: a narrowed DTC_GUARD_ULP
 * fails here).  The torch forward at lr·wd = 0.498 reaches 0.40 (a
 * quartered band fails).  Such steps halve θ, so the BF16 always changes
 * and the detector cannot miss them; what needs the bound here is every
 * user of the guard interval as a claim about θ_{t-1} (side_table.c's
 * prev_certain). */
static void bound_tight(int variant, double lr, double wd, double want)
{
	struct dtc_consts k;
	uint64_t bad = 0;
	double worst = 0;

	derive(&k, variant, lr, wd, 1);
	for (int i = 0; i < 1 << 20; i++) {
		float prev = (float)ldexp(1.0 + unif() / 16, (int)(rnd() % 6) - 4) *
			     (rnd() % 2 ? 1.0f : -1.0f);
		float g = (float)(gauss() * exp(unif() * 8 - 4) * 1e-8);
		float m = 0.1f * g, v = 0.001f * (g * g);	/* step 1 from zero moments */
		float th = dtc_adamw_forward(&k, prev, m, v);
		float u = dtc_adamw_u(&k, m, v), thh = dtc_adamw_prev(&k, th, u);
		double err = fabs((double)thh - (double)prev);
		double e = (double)dtc_guard_bound(thh, th, u);

		bad += err > e;
		if (err / e > worst)
			worst = err / e;
	}
	print_message("bound at its tightest: variant=%d lr=%g wd=%g worst_err/bound=%.4f beyond=%llu\n",
		      variant, lr, wd, worst, (unsigned long long)bad);
	assert_int_equal(bad, 0);
	assert_true(worst > want);
}

static void test_guard_at_bound(void **state)
{
	(void)state;
	bound_tight(DTC_VARIANT_FUSED, 0.1, 4.944, 0.5);
	bound_tight(DTC_VARIANT_TORCH, 0.1, 4.98, 0.25);
}

/* The cheap test alone, where its FP32 products over- or underflow: weights
 * from subnormal to 2^126, moments from 1e-45 to 1e38, eps 0 or tiny.  It
 * may only clear elements whose BF16 did not move.  (A huge weight with a
 * subnormal v once made r²·v overflow to Inf and cleared a real change.) */
static void test_quiet_extremes(void **state)
{
	struct dtc_consts k;
	uint64_t bad = 0, quiet = 0, changed = 0, n = 0;
	float theta;

	/* θ 1e25, v subnormal, eps 1e-8: u = 1e23 moves the BF16 */
	derive(&k, DTC_VARIANT_TORCH, 1e-6, 0.0, 1);
	theta = dtc_adamw_forward(&k, 1e25f, -1e20f, 1e-45f);
	assert_true(dtc_bf16_rne(theta) != dtc_bf16_rne(1e25f));
	assert_int_equal(dtc_adamw_quiet(&k, theta, -1e20f, 1e-45f), 0);
	for (int it = 0; it < 2000000; it++) {
		struct dtc_hparams hp = { pow(10.0, -2.0 - (double)(rnd() % 7)), 0.9, 0.999,
					  rnd() % 3 == 0 ? 0.0 : rnd() % 2 ? 1e-8 : 1e-30,
					  (rnd() % 3) * 0.05, 1 + (int64_t)(rnd() % 20),
					  (int)(rnd() % 2) };
		float prev = (float)ldexp(1.0 + unif(), (int)(rnd() % 270) - 140) *
			     (rnd() % 2 ? 1.0f : -1.0f);
		float m = (float)(pow(10.0, (double)(rnd() % 70) - 35.0) * (unif() - 0.5));
		float v = rnd() % 4 == 0 ? (float)ldexp(unif(), -126 - (int)(rnd() % 24))
					 : (float)pow(10.0, (double)(rnd() % 84) - 45.0) * (float)unif();
		int q, truth;

		assert_int_equal(dtc_hparams_derive(&hp, &k, NULL, 0), DTC_OK);
		theta = dtc_adamw_forward(&k, prev, m, v);
		truth = dtc_bf16_rne(prev) != dtc_bf16_rne(theta);
		q = dtc_adamw_quiet(&k, theta, m, v);
		bad += (uint64_t)(truth && q);
		quiet += (uint64_t)q;
		changed += (uint64_t)truth;
		n++;
	}
	print_message("quiet extremes: n=%llu changed=%llu quiet=%llu wrongly quiet=%llu\n",
		      (unsigned long long)n, (unsigned long long)changed, (unsigned long long)quiet,
		      (unsigned long long)bad);
	assert_true(changed > n / 20 && quiet > n / 20);
	assert_int_equal(bad, 0);
}

static void test_hparams(void **state)
{
	struct dtc_hparams ok = { 1e-5, 0.9, 0.999, 1e-8, 0.1, 1, DTC_VARIANT_TORCH };
	struct dtc_hparams hp;
	struct dtc_consts k;
	char why[128];

	assert_int_equal(dtc_hparams_derive(&ok, &k, why, sizeof(why)), DTC_OK);
	assert_true(k.decay == (float)(1 - 1e-5 * 0.1));
	assert_true(k.neg_step == (float)(-(1e-5 / (1 - 0.9))));
	hp = ok, hp.step = 0;
	assert_int_equal(dtc_hparams_derive(&hp, &k, why, sizeof(why)), DTC_EINVAL);
	assert_non_null(strstr(why, "step"));
	hp = ok, hp.beta1 = 1.0;
	assert_int_equal(dtc_hparams_derive(&hp, &k, why, sizeof(why)), DTC_EINVAL);
	hp = ok, hp.lr = NAN;
	assert_int_equal(dtc_hparams_derive(&hp, &k, why, sizeof(why)), DTC_EINVAL);
	hp = ok, hp.lr = 1.0, hp.weight_decay = 0.9;
	assert_int_equal(dtc_hparams_derive(&hp, &k, why, sizeof(why)), DTC_EINVAL);
	hp = ok, hp.variant = 7;
	assert_int_equal(dtc_hparams_derive(&hp, &k, NULL, 0), DTC_EINVAL);
	assert_int_equal(dtc_hparams_derive(NULL, &k, NULL, 0), DTC_EINVAL);
}

/* The element checksum's claims (gpu/elem.h, dtc_csum_term): one wrong
 * element always moves the sum; two wrong elements cancel with probability
 * about 2^-31; swapped and shifted neighbours are caught. */
static uint64_t mix_rng = 0x243f6a8885a308d3ull;

static uint64_t mix_next(void)
{
	mix_rng ^= mix_rng << 13;
	mix_rng ^= mix_rng >> 7;
	mix_rng ^= mix_rng << 17;
	return mix_rng;
}

static void test_mix(void **state)
{
	uint64_t cancelled = 0;

	(void)state;
	assert_true(dtc_csum_term(5, 0x3f80) != dtc_csum_term(5, 0x3f81));
	for (int t = 0; t < 1000000; t++) {
		uint64_t i = mix_next() >> (mix_next() % 64), j = mix_next() >> (mix_next() % 64);
		uint16_t a = (uint16_t)mix_next(), b = (uint16_t)mix_next(), c = (uint16_t)mix_next(),
			 d = (uint16_t)mix_next();
		uint64_t key = dtc_csum_key(i);

		/* odd 32-bit keys: a single change is never invisible */
		assert_true((key & 1) && key >> 32 == 0);
		if (a != b)
			assert_true(dtc_csum_term(i, a) != dtc_csum_term(i, b));
		/* two independent errors */
		if (i != j && a != b && c != d)
			cancelled += dtc_csum_term(i, b) - dtc_csum_term(i, a) +
				     dtc_csum_term(j, d) - dtc_csum_term(j, c) == 0;
	}
	/* expected 1e6 · 2^-31 ≈ 0.0005 */
	assert_true(cancelled == 0);
	/* neighbours swapped, or a run written one element off */
	for (uint64_t i = 0; i < 1000000; i++) {
		uint16_t a = (uint16_t)mix_next(), b = (uint16_t)mix_next(), c = (uint16_t)mix_next();

		if (a != b)
			assert_true(dtc_csum_term(i, a) + dtc_csum_term(i + 1, b) !=
				    dtc_csum_term(i, b) + dtc_csum_term(i + 1, a));
		if (a != b || b != c)
			assert_true(dtc_csum_term(i, a) + dtc_csum_term(i + 1, b) + dtc_csum_term(i + 2, c) !=
				    dtc_csum_term(i, 0) + dtc_csum_term(i + 1, a) + dtc_csum_term(i + 2, b) ||
				    (a == 0 && b == a && c == b));
	}
	assert_string_equal(dtc_strerror(DTC_ERANGE), "position outside the entry's box");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16_edges),
		cmocka_unit_test(test_bf16_random),
		cmocka_unit_test(test_torch_fixtures),
		cmocka_unit_test(test_guard_torch),
		cmocka_unit_test(test_guard_fused),
		cmocka_unit_test(test_guard_directed),
		cmocka_unit_test(test_guard_midpoints),
		cmocka_unit_test(test_guard_at_bound),
		cmocka_unit_test(test_quiet_extremes),
		cmocka_unit_test(test_hparams),
		cmocka_unit_test(test_mix),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
