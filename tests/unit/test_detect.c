/* dtc_detect(): the cpu backend's one-pass op against dtc_detect_ref()
 * (scan + sparse + encode + checksum_entry), byte for byte, over AdamW-like
 * data and boxes of every kind (rows not a multiple of 64, strided,
 * transposed and negative sources, dst-only sub-boxes, a scalar, boxes
 * large enough to split over threads), with and without mark and csum;
 * the payload decodes to the flagged positions and their BF16 values; bad
 * arguments and entries are refused.  The whole group runs in a child per
 * kernel and thread count (DTC_CPU_SIMD, DTC_CPU_THREADS are read once). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/cpu.h"
#include "gpu/detect.h"
#include "gpu/elem.h"
#include "tests/unit/adamw_ref.h"

static uint64_t seed = 23;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

static float unif(void)	/* (-1, 1) */
{
	return (float)((double)(rnd() >> 11) / 4503599627370496.0 - 1.0);
}

static void derive(struct dtc_consts *k, int variant, double lr)
{
	struct dtc_hparams hp = { lr, 0.9, 0.999, 1e-8, 0.1, 3, variant };

	assert_int_equal(dtc_hparams_derive(&hp, k, NULL, 0), DTC_OK);
}

enum fill { FILL_ADAMW, FILL_SPARSE, FILL_QUIET, FILL_NAN };

/* One simulated AdamW step over len elements: a few percent change; a
 * sprinkle of specials (NaN, Inf, subnormal, zero) for the odd paths.
 * SPARSE is the same step at a tenth of the learning rate (gaps of a
 * hundred or more, so short and long gap codes mix); QUIET: m = 0 and θ on
 * a BF16 value, nothing changes; NAN: all do. */
static void fill(const struct dtc_consts *k, float *p, float *m, float *v, uint64_t len,
		 enum fill how)
{
	/* qNaN, −Inf, denormals (which vcvtneps2bf16 would flush), −0, the
	 * largest finite (rounds to Inf), ties to even both ways, signalling
	 * and negative NaNs with payloads (quieted, payload kept) */
	static const uint32_t special[] = { 0x7fc00000u, 0xff800000u, 0x00000001u, 0x80000000u,
					    0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x807fffffu,
					    0x7f800001u, 0xffbf1234u, 0x00400000u, 0xff7fffffu };

	for (uint64_t i = 0; i < len; i++) {
		float g = unif() * 1e-3f, g0 = unif() * 1e-3f, prev = unif() * 0.02f;

		m[i] = 0.9f * (0.1f * g0) + 0.1f * g;
		v[i] = 0.999f * (0.001f * g0 * g0) + 0.001f * g * g;
		p[i] = dtc_adamw_forward(k, prev, m[i], v[i]);
		if (rnd() % 500 == 0)
			p[i] = dtc_bits_f32(special[rnd() % (sizeof(special) / sizeof(special[0]))]);
		if (how == FILL_QUIET) {
			m[i] = 0.0f;
			p[i] = dtc_bf16_f32(dtc_bf16_rne(prev + 0.5f));
		} else if (how == FILL_NAN) {
			p[i] = dtc_bits_f32(0x7fc00000u | (uint32_t)(rnd() & 0xffff));
		}
	}
}

/* Naive mapping: decompose p row-major. */
static int64_t ref_index(const struct dte_box_map *e, uint64_t p, int dst)
{
	int64_t idx = dst ? e->dst_offset : e->src_offset;

	for (int d = (int)e->ndim - 1; d >= 0; d--) {
		idx += (int64_t)(p % (uint64_t)e->extent[d]) * (dst ? e->dst_stride[d] : e->src_stride[d]);
		p /= (uint64_t)e->extent[d];
	}
	return idx;
}

struct shape {
	const char *name;
	struct dte_box_map e;
	uint64_t src_len;
};

/* Sources hold SRC_LEN elements; "big" shapes pass PAR_MIN_ELEMS (2^20) so
 * they split over the configured threads. */
#define SRC_LEN ((uint64_t)1300000)

static const struct shape shapes[] = {
	{ "one", { 1, { 1 }, 5, { 1 }, 9, { 1 } }, 16 },
	{ "63", { 1, { 63 }, 0, { 1 }, 0, { 1 } }, 63 },
	{ "64", { 1, { 64 }, 1, { 1 }, 0, { 1 } }, 65 },
	{ "65", { 1, { 65 }, 0, { 1 }, 3, { 1 } }, 65 },
	{ "3 blocks+17", { 1, { 3 * 1024 + 17 }, 7, { 1 }, 0, { 1 } }, 4000 },
	{ "rows of 100", { 2, { 37, 100 }, 13, { 130, 1 }, 0, { 100, 1 } }, 5000 },
	{ "rows of 1285", { 2, { 9, 1285 }, 0, { 1300, 1 }, 50, { 1290, 1 } }, 12000 },
	{ "transposed", { 2, { 40, 70 }, 0, { 1, 40 }, 0, { 70, 1 } }, 2800 },
	{ "negative", { 2, { 30, 90 }, 2699, { -90, -1 }, 2699, { -90, -1 } }, 2700 },
	{ "strided", { 2, { 20, 300 }, 1, { 600, 2 }, 0, { 300, 1 } }, 12000 },
	{ "dst transposed", { 3, { 4, 6, 200 }, 0, { 1200, 200, 1 }, 0, { 1, 4, 24 } }, 4800 },
	{ "dst reversed", { 1, { 5000 }, 0, { 1 }, 4999, { -1 } }, 5000 },
	/* destination indices past 2^32: the checksum key's high Weyl bits */
	{ "dst far", { 1, { 3000 }, 0, { 1 }, ((int64_t)1 << 34) + 3, { 1 } }, 3000 },
	{ "scalar", { 0, { 0 }, 17, { 0 }, 3, { 0 } }, 20 },
	{ "big", { 1, { (1 << 20) + 4097 }, 11, { 1 }, 0, { 1 } }, SRC_LEN },
	{ "big rows", { 2, { 1000, 1250 }, 0, { 1250, 1 }, 7, { 1300, 1 } }, SRC_LEN },
	{ "big odd rows", { 2, { 1033, 1017 }, 5, { 1200, 1 }, 0, { 1017, 1 } }, SRC_LEN },
};

#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

struct data {
	float *p, *m, *v;
	uint64_t *mark;
};

static int setup(void **state)
{
	struct data *d = calloc(1, sizeof(*d));

	d->p = malloc(SRC_LEN * sizeof(float));
	d->m = malloc(SRC_LEN * sizeof(float));
	d->v = malloc(SRC_LEN * sizeof(float));
	d->mark = malloc((SRC_LEN / 64 + 1) * sizeof(uint64_t));
	if (!d->p || !d->m || !d->v || !d->mark)
		return -1;
	*state = d;
	return 0;
}

static int teardown(void **state)
{
	struct data *d = *state;

	free(d->p);
	free(d->m);
	free(d->v);
	free(d->mark);
	free(d);
	return 0;
}

/* Mark: random sparse bits (gaps of every code size, across thread
 * boundaries), a dense run, and garbage past the box end. */
static void fill_mark(uint64_t *mark, uint64_t words, int dense)
{
	memset(mark, 0, words * sizeof(*mark));
	for (uint64_t b = rnd() % 300; b < words * 64; b += 1 + rnd() % (dense ? 40 : 40000))
		mark[b / 64] |= (uint64_t)1 << (b % 64);
	if (words > 4)
		mark[words / 2] = ~(uint64_t)0;
	mark[words - 1] |= (uint64_t)1 << 63;
}

/* Prefix bytes already in out: detect appends after them. */
#define PREFIX 5

static void init_out(struct dtc_bytes *o)
{
	o->p = malloc(PREFIX);
	assert_non_null(o->p);
	memset(o->p, 0xee, PREFIX);
	o->n = o->cap = PREFIX;
}

/* Fused against the reference, then the payload against the data. */
static void check_one(const struct dtc_backend *be, const struct shape *sh,
		      const struct dtc_consts *k, const struct data *d, const uint64_t *mark,
		      int want_csum, uint64_t *total)
{
	struct dtc_src src = { d->p, d->m, d->v, sh->src_len };
	const struct dte_box_map *e = &sh->e;
	uint64_t size = dtc_box_size(e), words = dtc_bitmap_words(e);
	struct dtc_bytes got, want;
	uint64_t cg = ~0ull, cw = ~1ull, sg = 1, sw = 2, n = 0, naive = 0, *pos, *bm;
	uint16_t *val;
	int rc;

	init_out(&got);
	init_out(&want);
	rc = dtc_detect(be, e, k, &src, mark, words, &got, &cg, want_csum ? &sg : NULL);
	assert_int_equal(rc, DTC_OK);
	assert_int_equal(dtc_detect_ref(be, e, k, &src, mark, words, &want, &cw,
					want_csum ? &sw : NULL), DTC_OK);
	if (got.n != want.n || memcmp(got.p, want.p, got.n) != 0)
		fail_msg("%s: payload differs (%zu vs %zu bytes, count %llu vs %llu)", sh->name,
			 got.n, want.n, (unsigned long long)cg, (unsigned long long)cw);
	assert_int_equal(cg, cw);
	assert_memory_equal(got.p, "\xee\xee\xee\xee\xee", PREFIX);
	if (want_csum)
		assert_int_equal(sg, sw);
	else
		assert_int_equal(sg, 1);

	/* decode: the positions are the scan's (| mark) bits, the values
	 * bf16(θ) at their sources; the checksum the naive sum */
	pos = malloc((cg + 1) * sizeof(*pos));
	val = malloc((cg + 1) * sizeof(*val));
	bm = calloc(words, sizeof(*bm));
	assert_true(pos && val && bm);
	assert_int_equal(dtc_sparse_decode(got.p + PREFIX, got.n - PREFIX, size, pos, val, cg,
					   &n), DTC_OK);
	assert_int_equal(n, cg);
	for (uint64_t i = 0; i < n; i++) {
		int64_t s = ref_index(e, pos[i], 0);

		assert_int_equal(val[i], dtc_bf16_rne(d->p[s]));
		bm[pos[i] / 64] |= (uint64_t)1 << (pos[i] % 64);
	}
	for (uint64_t q = 0; q < size; q++) {
		int64_t s = ref_index(e, q, 0);
		int flag = dtc_adamw_flag(k, d->p[s], d->m[s], d->v[s]) ||
			   (mark && (mark[q / 64] >> (q % 64)) & 1);

		if (flag != (int)((bm[q / 64] >> (q % 64)) & 1))
			fail_msg("%s: position %llu flag %d not in payload", sh->name,
				 (unsigned long long)q, flag);
		naive += dtc_csum_term((uint64_t)ref_index(e, q, 1), dtc_bf16_rne(d->p[s]));
	}
	if (want_csum)
		assert_int_equal(sg, naive);
	*total += n;
	free(pos);
	free(val);
	free(bm);
	free(got.p);
	free(want.p);
}

static void run_shapes(void **state, enum fill how, int with_mark, int dense_mark)
{
	struct data *d = *state;
	const struct dtc_backend *be = dtc_backend_cpu();
	uint64_t total = 0, elems = 0;

	for (size_t i = 0; i < NSHAPES; i++) {
		for (int variant = 0; variant < 2; variant++) {
			struct dtc_consts k;

			derive(&k, variant, (variant ? 3e-6 : 1e-6) * (how == FILL_SPARSE ? 0.1 : 1));
			fill(&k, d->p, d->m, d->v, shapes[i].src_len, how);
			if (with_mark)
				fill_mark(d->mark, dtc_bitmap_words(&shapes[i].e), dense_mark);
			check_one(be, &shapes[i], &k, d, with_mark ? d->mark : NULL, variant, &total);
			elems += dtc_box_size(&shapes[i].e);
		}
	}
	print_message("detect: elements=%llu emitted=%llu\n", (unsigned long long)elems,
		      (unsigned long long)total);
	if (how == FILL_NAN)
		assert_int_equal(total, elems);
	else if (how == FILL_QUIET && !with_mark)
		assert_int_equal(total, 0);
	else if (how == FILL_QUIET)
		assert_true(total > 64 * NSHAPES && total < elems / 500);
	else if (how == FILL_SPARSE)
		assert_true(total > elems / 2000 && total < elems / 50);
	else
		assert_true(total > elems / 200 && total < elems);
}

static void test_adamw(void **state)
{
	run_shapes(state, FILL_ADAMW, 0, 0);
}

static void test_sparse(void **state)
{
	run_shapes(state, FILL_SPARSE, 0, 0);
}

static void test_adamw_mark(void **state)
{
	run_shapes(state, FILL_ADAMW, 1, 1);
}

static void test_quiet(void **state)
{
	run_shapes(state, FILL_QUIET, 0, 0);
}

static void test_mark_only(void **state)
{
	run_shapes(state, FILL_QUIET, 1, 0);
}

static void test_all_changed(void **state)
{
	run_shapes(state, FILL_NAN, 0, 0);
}

/* A backend without the op runs the reference: same bytes. */
static void test_fallback(void **state)
{
	struct data *d = *state;
	struct dtc_backend_ops ops = *dtc_backend_cpu()->ops;
	struct dtc_backend be = { "cpu-noop", &ops, "" };
	const struct shape *sh = &shapes[NSHAPES - 1];
	struct dtc_src src = { d->p, d->m, d->v, sh->src_len };
	struct dtc_bytes a = { 0 }, b = { 0 };
	struct dtc_consts k;
	uint64_t ca, cb, sa, sb;

	ops.detect = NULL;
	derive(&k, 0, 1e-6);
	fill(&k, d->p, d->m, d->v, sh->src_len, FILL_ADAMW);
	assert_int_equal(dtc_detect(&be, &sh->e, &k, &src, NULL, 0, &a, &ca, &sa), DTC_OK);
	assert_int_equal(dtc_detect(dtc_backend_cpu(), &sh->e, &k, &src, NULL, 0, &b, &cb, &sb),
			 DTC_OK);
	assert_int_equal(a.n, b.n);
	assert_memory_equal(a.p, b.p, a.n);
	assert_int_equal(ca, cb);
	assert_int_equal(sa, sb);
	free(a.p);
	free(b.p);
}

static void *fake_alloc(uint64_t bytes)
{
	return NULL;
}

/* The block kernels' checksums, portable and AVX-512, against the
 * definition (Σ dtc_csum_term(dbase + i·dstride, dtc_bf16_rne(p[i])))
 * directly: every special float (NaNs with payloads and signs, Infs,
 * denormals, ±0, the largest finite, ties both ways) at every lane of
 * every block length, destination bases below and past 2^32 and
 * destination strides of either sign. */
static void test_csum_block(void **state)
{
	static const uint32_t special[] = { 0x7fc00000u, 0xff800000u, 0x7f800000u, 0x00000001u,
					    0x80000000u, 0x00000000u, 0x7f7fffffu, 0xff7fffffu,
					    0x3f808000u, 0x3f818000u, 0x807fffffu, 0x7f800001u,
					    0xffbf1234u, 0x00400000u, 0x7fffffffu, 0xffffffffu,
					    0x3f7fffffu, 0x0000ffffu, 0x8000ffffu, 0x7f7f8000u };
	static const int64_t strides[] = { 1, -1, 7, -1290, 1 << 20 };
	static const int64_t bases[] = { 0, 12345, ((int64_t)1 << 32) - 5, ((int64_t)1 << 40) + 77,
					  INT64_MAX / 2 };
	dtc_cpu_detect_fn fns[2] = { dtc_cpu_detect_block, dtc_cpu_detect_avx512() };
	struct dtc_consts k;
	float *p = malloc(1024 * 4), *m = malloc(1024 * 4), *v = malloc(1024 * 4);
	struct dtc_cpu_emit s = { 0 };
	uint64_t checked = 0;

	(void)state;
	assert_true(p && m && v);
	s.gcap = DTC_CPU_GAP_ROOM(16);
	s.gap = malloc(s.gcap);
	s.val = malloc(DTC_CPU_VAL_ROOM(16) * sizeof(uint16_t));
	assert_true(s.gap && s.val);
	derive(&k, 0, 1e-6);
	for (size_t f = 0; f < 2; f++) {
		if (!fns[f]) {
			print_message("csum block: no AVX-512 kernel on this CPU, portable only\n");
			continue;
		}
		for (int round = 0; round < 40; round++) {
			int nw = 1 + round % 16;
			int64_t db = bases[round % 5], ds = strides[(round / 5) % 5];
			uint64_t want = 0, got;

			for (int i = 0; i < 64 * nw; i++) {
				p[i] = unif() * 0.02f;
				m[i] = unif() * 1e-4f;
				v[i] = 1e-8f;
				/* each special at a lane that moves with the round */
				if ((i + round) % 3 == 0)
					p[i] = dtc_bits_f32(special[(size_t)(i / 3 + round) %
								    (sizeof(special) / sizeof(special[0]))]);
				want += dtc_csum_term((uint64_t)(db + i * ds), dtc_bf16_rne(p[i]));
			}
			s.ngap = s.nval = 0;
			s.start = s.next = 0;
			got = fns[f](&k, p, m, v, nw, NULL, 0, db, ds, 1, &s);
			if (got != want)
				fail_msg("csum block: %s kernel, nw=%d dbase=%lld dstride=%lld: %llx, "
					 "definition %llx", f ? "avx512" : "portable", nw, (long long)db,
					 (long long)ds, (unsigned long long)got, (unsigned long long)want);
			assert_int_equal(fns[f](&k, p, m, v, nw, NULL, 0, db, ds, 0, &s), 0);
			checked += 64 * (uint64_t)nw;
		}
	}
	print_message("csum block: elements=%llu avx512=%s\n", (unsigned long long)checked,
		      fns[1] ? "yes" : "no");
	free(p);
	free(m);
	free(v);
	free(s.gap);
	free(s.val);
}

/* ---- exact verdicts where the step is zero (gpu/elem.h dtc_adamw_still)
 * One step of a real forward from known previous weights (torch's update as
 * adamw_ref.h writes it from torch's source; FusedAdam's from Apex
 * csrc/multi_tensor_adam.cu AdamFunctor, ADAM_MODE_1, the order
 * tests/data/adamw/gen_fixtures.py records for TE), then dtc_detect() on
 * the result: every element whose BF16 truly changed must be in the
 * payload, and the counts of flagged elements in the zero-step groups are
 * returned. */
static float ref_fused_adamw(float p, float m, float v, double lr, double b1, double b2,
			     double eps, double wd, int64_t step)
{
	volatile float bc1 = (float)(1.0 - pow(b1, (double)step));
	volatile float bc2 = (float)(1.0 - pow(b2, (double)step));
	volatile float mh = m / bc1, vh = v / bc2, denom, q, dec, upd, y;

	denom = sqrtf(vh);
	denom = denom + (float)eps;
	q = mh / denom;
	dec = (float)wd * p;
	upd = q + dec;
	y = (float)lr * upd;
	return p - y;
}

struct zstep {
	uint64_t changed, missed, flagged, flagged_zero_step, zero_step;
};

/* prev, m, v: n elements; group[i] != 0 marks the zero-step elements the
 * caller counts separately. */
static void zstep_run(int variant, double lr, double wd, const float *prev, const float *m,
		      const float *v, const uint8_t *group, uint64_t n, struct zstep *z)
{
	const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
	const int64_t step = 3;
	struct dtc_hparams hp = { lr, b1, b2, eps, wd, step, variant };
	struct dtc_consts k;
	struct dte_box_map e = { 1, { (int64_t)n }, 0, { 1 }, 0, { 1 } };
	float *p = malloc(n * sizeof(*p));
	uint64_t *pos = malloc((n + 1) * sizeof(*pos)), cnt = 0, got = 0, sum = 0;
	uint16_t *val = malloc((n + 1) * sizeof(*val));
	uint8_t *flag = calloc(n, 1);
	struct dtc_bytes out = { 0 };
	struct dtc_src src;

	assert_true(p && pos && val && flag);
	assert_int_equal(dtc_hparams_derive(&hp, &k, NULL, 0), DTC_OK);
	for (uint64_t i = 0; i < n; i++)
		p[i] = variant == DTC_VARIANT_FUSED
			       ? ref_fused_adamw(prev[i], m[i], v[i], lr, b1, b2, eps, wd, step)
			       : ref_torch_adamw(prev[i], m[i], sqrtf(v[i]), lr, b1, b2, eps, wd, step);
	src = (struct dtc_src){ p, m, v, n };
	assert_int_equal(dtc_detect(dtc_backend_cpu(), &e, &k, &src, NULL, 0, &out, &cnt, &sum),
			 DTC_OK);
	assert_int_equal(dtc_sparse_decode(out.p, out.n, n, pos, val, cnt, &got), DTC_OK);
	assert_int_equal(got, cnt);
	for (uint64_t i = 0; i < got; i++)
		flag[pos[i]] = 1;
	memset(z, 0, sizeof(*z));
	for (uint64_t i = 0; i < n; i++) {
		int truth = dtc_bf16_rne(p[i]) != dtc_bf16_rne(prev[i]);

		z->changed += (uint64_t)truth;
		z->missed += (uint64_t)(truth && !flag[i]);
		z->flagged += flag[i];
		z->zero_step += group[i] != 0;
		z->flagged_zero_step += (uint64_t)(group[i] && flag[i]);
	}
	free(out.p);
	free(p);
	free(pos);
	free(val);
	free(flag);
}

/* (a) Exactly ±0 weights without gradient (m = +0, so u = −0) in a tensor
 * that otherwise trains: the guard band's lower end used to round to −0,
 * so every one of them was flagged every version.  Both variants, weight
 * decay on; previous weights +0, −0 and the smallest subnormals of both
 * signs (which decay to ±0 or stay).  Then FusedAdam with lr·wd near the
 * 1/2 limit, where −2^-149 cancels exactly to +0 (a true BF16 change
 * from −0 to +0): it must still be sent. */
static void test_zero_weight_zero_step(void **state)
{
	const uint64_t n = 8192;
	float *prev = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
	uint8_t *group = malloc(n);
	struct zstep z;

	(void)state;
	assert_true(prev && m && v && group);
	for (int variant = 0; variant < 2; variant++) {
		for (uint64_t i = 0; i < n; i++) {
			static const uint32_t zeros[] = { 0x00000000u, 0x80000000u, 0x00000001u,
							  0x80000001u, 0x00000003u, 0x80000002u };
			float g = unif() * 1e-3f, g0 = unif() * 1e-3f;

			group[i] = i % 2 == 0;
			if (group[i]) {
				prev[i] = dtc_bits_f32(zeros[(i / 2) % 6]);
				m[i] = 0.0f;
				v[i] = i % 4 == 0 ? 0.0f : 1e-6f * (1.0f + unif());
			} else {
				prev[i] = unif() * 0.02f;
				m[i] = 0.9f * (0.1f * g0) + 0.1f * g;
				v[i] = 0.999f * (0.001f * g0 * g0) + 0.001f * g * g;
			}
		}
		zstep_run(variant, variant ? 3e-6 : 1e-6, 0.1, prev, m, v, group, n, &z);
		print_message("zero weights variant=%d: zero_step=%llu flagged_zero_step=%llu "
			      "changed=%llu flagged=%llu missed=%llu\n", variant,
			      (unsigned long long)z.zero_step, (unsigned long long)z.flagged_zero_step,
			      (unsigned long long)z.changed, (unsigned long long)z.flagged,
			      (unsigned long long)z.missed);
		assert_int_equal(z.missed, 0);
		assert_true(z.changed > n / 200);	/* the other half trains */
		/* subnormal ±2^-149·k decay to themselves (c close to 1) and are
		 * not on the zero path: only the ±0 ones must go unflagged */
		assert_true(z.flagged_zero_step <= z.zero_step * 2 / 3);
		{
			uint64_t zero_flagged = 0, zeros = 0;
			struct zstep only;

			for (uint64_t i = 0; i < n; i++) {
				uint32_t b = dtc_f32_bits(prev[i]);

				group[i] = (b & 0x7fffffffu) == 0;
				zeros += group[i];
			}
			zstep_run(variant, variant ? 3e-6 : 1e-6, 0.1, prev, m, v, group, n, &only);
			zero_flagged = only.flagged_zero_step;
			print_message("zero weights variant=%d: exact_zeros=%llu flagged=%llu\n",
				      variant, (unsigned long long)zeros,
				      (unsigned long long)zero_flagged);
			assert_true(zeros >= n / 8);
			assert_int_equal(zero_flagged, 0);
		}
	}
	/* FusedAdam, lr·wd = 0.495: −2^-149 → +0 exactly (a change). */
	for (uint64_t i = 0; i < n; i++) {
		prev[i] = dtc_bits_f32(i % 2 ? 0x80000001u : 0x00000000u);
		m[i] = 0.0f;
		v[i] = 0.0f;
		group[i] = 1;
	}
	zstep_run(DTC_VARIANT_FUSED, 0.33, 1.5, prev, m, v, group, n, &z);
	print_message("zero weights fused lr=0.33 wd=1.5: changed=%llu flagged=%llu missed=%llu\n",
		      (unsigned long long)z.changed, (unsigned long long)z.flagged,
		      (unsigned long long)z.missed);
	assert_int_equal(z.changed, n / 2);	/* the fault this case guards against landed */
	assert_int_equal(z.missed, 0);
	free(prev);
	free(m);
	free(v);
	free(group);
}

/* (b) A tensor without gradient (m = 0) and without weight decay keeps θ
 * exactly: nothing in it may be flagged, also where θ sits within the
 * guard band of a BF16 rounding midpoint (which the band flagged every
 * version).  Next to it in the same buffer: a trained part (weight decay
 * 0 too) and, in the frozen part, weights below 2^-125, which keep the
 * guard band (dtc_adamw_still); every true change must still be sent. */
static void test_frozen_no_decay(void **state)
{
	const uint64_t n = 16384;
	float *prev = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
	uint8_t *group = malloc(n);
	struct zstep z;

	(void)state;
	assert_true(prev && m && v && group);
	for (int variant = 0; variant < 2; variant++) {
		uint64_t near = 0;

		for (uint64_t i = 0; i < n; i++) {
			float g = unif() * 1e-3f, g0 = unif() * 1e-3f;

			group[i] = i < n / 2;
			if (group[i]) {
				/* a third near a BF16 midpoint, a few FP32 ulps off */
				if (i % 3 == 0) {
					uint32_t hi = 0x3a00u + (uint32_t)(rnd() % 0x580u);

					prev[i] = dtc_bits_f32((hi << 16) + 0x8000u +
							       (uint32_t)(int32_t)(rnd() % 49) - 24u);
					near++;
				} else {
					prev[i] = unif() * 0.02f;
				}
				if (rnd() % 2)
					prev[i] = -prev[i];
				m[i] = i % 5 == 0 ? -0.0f : 0.0f;
				v[i] = i % 4 == 0 ? 0.0f : 1e-6f * (1.0f + unif());
			} else {
				prev[i] = i % 64 == 0 ? dtc_bits_f32(0x00400000u + (uint32_t)(rnd() % 1000))
						      : unif() * 0.02f;
				m[i] = 0.9f * (0.1f * g0) + 0.1f * g;
				v[i] = 0.999f * (0.001f * g0 * g0) + 0.001f * g * g;
			}
		}
		zstep_run(variant, variant ? 3e-6 : 1e-6, 0.0, prev, m, v, group, n, &z);
		print_message("frozen no decay variant=%d: zero_step=%llu near_midpoint=%llu "
			      "flagged_zero_step=%llu changed=%llu flagged=%llu missed=%llu\n",
			      variant, (unsigned long long)z.zero_step, (unsigned long long)near,
			      (unsigned long long)z.flagged_zero_step, (unsigned long long)z.changed,
			      (unsigned long long)z.flagged, (unsigned long long)z.missed);
		assert_int_equal(z.missed, 0);
		assert_true(z.changed > n / 400);
		assert_int_equal(z.flagged_zero_step, 0);
		/* with weight decay the same frozen part is not exact: the band
		 * flags the near-midpoint weights as before */
		zstep_run(variant, variant ? 3e-6 : 1e-6, 0.01, prev, m, v, group, n, &z);
		assert_int_equal(z.missed, 0);
		assert_true(z.flagged_zero_step > 0);
	}
	free(prev);
	free(m);
	free(v);
	free(group);
}

static void test_bad_args(void **state)
{
	struct data *d = *state;
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dtc_backend_ops ops = *cpu->ops;
	struct dtc_backend dev = { "dev", &ops, "" };
	struct dte_box_map e = { 2, { 10, 100 }, 0, { 100, 1 }, 0, { 100, 1 } }, bad;
	struct dtc_src src = { d->p, d->m, d->v, 1000 }, s2;
	struct dtc_bytes out = { 0 };
	struct dtc_consts k, k2;
	uint64_t c = 77, sum = 78;

	derive(&k, 0, 1e-6);
	fill(&k, d->p, d->m, d->v, 1000, FILL_ADAMW);
	ops.mem_alloc = fake_alloc;
	assert_int_equal(dtc_detect(NULL, &e, &k, &src, NULL, 0, &out, &c, &sum), DTC_EINVAL);
	assert_int_equal(dtc_detect(&dev, &e, &k, &src, NULL, 0, &out, &c, &sum), DTC_EINVAL);
	assert_int_equal(dtc_detect(cpu, &e, NULL, &src, NULL, 0, &out, &c, &sum), DTC_EINVAL);
	assert_int_equal(dtc_detect(cpu, &e, &k, NULL, NULL, 0, &out, &c, &sum), DTC_EINVAL);
	assert_int_equal(dtc_detect(cpu, &e, &k, &src, NULL, 0, NULL, &c, &sum), DTC_EINVAL);
	assert_int_equal(dtc_detect(cpu, &e, &k, &src, NULL, 0, &out, NULL, &sum), DTC_EINVAL);
	s2 = src;
	s2.exp_avg_sq = NULL;
	assert_int_equal(dtc_detect(cpu, &e, &k, &s2, NULL, 0, &out, &c, &sum), DTC_EINVAL);
	k2 = k;
	k2.variant = 7;
	assert_int_equal(dtc_detect(cpu, &e, &k2, &src, NULL, 0, &out, &c, &sum), DTC_EINVAL);
	/* a mark shorter than the box's bitmap */
	assert_int_equal(dtc_detect(cpu, &e, &k, &src, d->mark, 15, &out, &c, &sum), DTC_EINVAL);
	/* source past its buffer, negative source, negative destination */
	s2 = src;
	s2.len = 999;
	assert_int_equal(dtc_detect(cpu, &e, &k, &s2, NULL, 0, &out, &c, &sum), DTC_EBOX);
	bad = e;
	bad.src_stride[1] = -1;
	assert_int_equal(dtc_detect(cpu, &bad, &k, &src, NULL, 0, &out, &c, &sum), DTC_EBOX);
	bad = e;
	bad.dst_offset = -1;
	assert_int_equal(dtc_detect(cpu, &bad, &k, &src, NULL, 0, &out, &c, &sum), DTC_EBOX);
	bad = e;
	bad.dst_stride[0] = (int64_t)1 << 47;
	assert_int_equal(dtc_detect(cpu, &bad, &k, &src, NULL, 0, &out, &c, &sum), DTC_EBOX);
	bad = e;
	bad.extent[1] = 0;
	assert_int_equal(dtc_detect(cpu, &bad, &k, &src, NULL, 0, &out, &c, &sum), DTC_EBOX);
	/* nothing written on any of them */
	assert_int_equal(c, 77);
	assert_int_equal(sum, 78);
	assert_int_equal(out.n, 0);
	assert_null(out.p);
	/* and the good call works, with mark words exactly enough */
	assert_int_equal(dtc_detect(cpu, &e, &k, &src, d->mark, 16, &out, &c, NULL), DTC_OK);
	assert_true(out.n > 0);
	free(out.p);
}

/* The gap coder against the codec's, across the code-size edges. */
static void test_gap_codes(void **state)
{
	static const uint64_t gaps[] = { 0, 1, 127, 128, 129, 16511, 16512, 16513,
					 (uint64_t)1 << 21, ((uint64_t)1 << 35) + 3 };
	uint64_t pos[2];
	uint16_t val[2] = { 1, 2 };

	for (size_t i = 0; i < sizeof(gaps) / sizeof(gaps[0]); i++) {
		uint8_t a[64], b[64];
		size_t la, lb;

		pos[0] = 3;
		pos[1] = 4 + gaps[i];
		assert_int_equal(dtc_sparse_encode(pos, val, 2, pos[1] + 1, a, sizeof(a), &la),
				 DTC_OK);
		b[0] = 2;
		lb = 1 + dtc_cpu_put_gap(b + 1, 3);
		lb += dtc_cpu_put_gap(b + lb, gaps[i]);
		memcpy(b + lb, "\x01\x00\x02\x00", 4);
		lb += 4;
		assert_int_equal(la, lb);
		assert_memory_equal(a, b, la);
	}
}

int main(void)
{
	static const struct {
		const char *simd, *threads;
	} cfg[] = { { "", "1" }, { "", "2" }, { "", "3" }, { "generic", "1" }, { "generic", "2" } };
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gap_codes),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_csum_block),
		cmocka_unit_test(test_zero_weight_zero_step),
		cmocka_unit_test(test_frozen_no_decay),
		cmocka_unit_test(test_adamw),
		cmocka_unit_test(test_sparse),
		cmocka_unit_test(test_adamw_mark),
		cmocka_unit_test(test_quiet),
		cmocka_unit_test(test_mark_only),
		cmocka_unit_test(test_all_changed),
		cmocka_unit_test(test_fallback),
	};
	int failed = 0;

	/* each configuration in a fresh child: the kernel choice and thread
	 * count are read once per process */
	for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++) {
		char name[64];
		pid_t pid;
		int st;

		fflush(NULL);
		if ((pid = fork()) < 0)
			return 1;
		if (pid == 0) {
			if (*cfg[i].simd)
				setenv("DTC_CPU_SIMD", cfg[i].simd, 1);
			else
				unsetenv("DTC_CPU_SIMD");
			setenv("DTC_CPU_THREADS", cfg[i].threads, 1);
			snprintf(name, sizeof(name), "detect simd=%s threads=%s",
				 *cfg[i].simd ? cfg[i].simd : "best", cfg[i].threads);
			_exit(cmocka_run_group_tests_name(name, tests, setup, teardown) ? 1 : 0);
		}
		if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed++;
	}
	return failed;
}
