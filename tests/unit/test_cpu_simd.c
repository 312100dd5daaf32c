/* The scan's SIMD kernels (gpu/cpu_avx512.c) against the portable one and
 * against the element math itself, bit for bit: realistic AdamW states,
 * weights on and next to BF16 rounding midpoints and binade edges, NaN,
 * Inf, zeros, subnormals, raw random bit patterns, eps = 0, both
 * variants, every block length.  A kernel this CPU cannot run is skipped
 * (and says so). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gpu/compute.h"
#include "gpu/cpu.h"
#include "gpu/elem.h"

#define BLOCK (64 * DTC_CPU_BLOCK_WORDS)

static uint64_t seed = 11;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

static double unif(void)
{
	return (double)(rnd() >> 11) / 9007199254740992.0;
}

/* A weight of some kind: ordinary, on/next to a BF16 midpoint, just
 * below a power of two, special, or raw bits. */
static float weight(void)
{
	uint32_t hi = (uint32_t)(rnd() % 0x7f80u) | (rnd() & 1 ? 0x8000u : 0);

	switch (rnd() % 10) {
	case 0:
		return dtc_bits_f32(hi << 16 | 0x8000u);
	case 1:
		return dtc_bits_f32((hi << 16 | 0x8000u) + (uint32_t)(int32_t)(rnd() % 9) - 4u);
	case 2:
		return dtc_bits_f32(((hi & 0xff80u) << 16) - (uint32_t)(rnd() % 0x10000u));
	case 3: {
		static const uint32_t special[] = {
			0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
			0xffc00001u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu,
			0x7f000000u, 0x7effffffu, 0x007f8000u, 0x007f7fffu,
		};
		return dtc_bits_f32(special[rnd() % (sizeof(special) / sizeof(special[0]))]);
	}
	case 4:
		return dtc_bits_f32((uint32_t)rnd());
	default:
		return (float)((unif() - 0.5) * 0.08);
	}
}

/* Moments: mostly realistic, sometimes zero, huge, negative v or NaN. */
static void moments(float *m, float *v)
{
	double g = (unif() - 0.5) * 2e-3 * (rnd() % 4 == 0 ? 1e-4 : 1.0);

	*m = (float)(0.1 * g);
	*v = (float)(0.001 * g * g + (rnd() % 7 == 0 ? 0.0 : 1e-30));
	switch (rnd() % 40) {
	case 0: *m = 0.0f; break;
	case 1: *v = 0.0f; break;
	case 2: *m = dtc_bits_f32((uint32_t)rnd()); break;
	case 3: *v = dtc_bits_f32((uint32_t)rnd()); break;
	case 4: *m = 1e30f; *v = 1e-30f; break;
	default: break;
	}
}

static void derive(struct dtc_consts *k, int variant, double lr, double wd, double eps,
		   int64_t step)
{
	struct dtc_hparams hp = { lr, 0.9, 0.999, eps, wd, step, variant };

	assert_int_equal(dtc_hparams_derive(&hp, k, NULL, 0), DTC_OK);
}

/* One block through kernel f: equal to the portable kernel and to
 * dtc_adamw_flag() element by element. */
static void check_block(dtc_cpu_flags_fn f, const struct dtc_consts *k, const float *p,
			const float *m, const float *v, int nw, uint64_t *flagged)
{
	uint64_t want[DTC_CPU_BLOCK_WORDS], got[DTC_CPU_BLOCK_WORDS];

	memset(got, 0x5a, sizeof(got));
	dtc_cpu_flags(k, p, m, v, nw, want);
	f(k, p, m, v, nw, got);
	for (int j = 0; j < nw; j++) {
		if (got[j] == want[j])
			continue;
		for (int i = 0; i < 64; i++) {
			int e = 64 * j + i;

			if (((got[j] ^ want[j]) >> i) & 1)
				fail_msg("word %d lane %d: theta %08x m %08x v %08x: simd %d, portable %d",
					 j, i, dtc_f32_bits(p[e]), dtc_f32_bits(m[e]),
					 dtc_f32_bits(v[e]), (int)((got[j] >> i) & 1),
					 (int)((want[j] >> i) & 1));
		}
	}
	for (int e = 0; e < 64 * nw; e++)
		assert_int_equal((want[e / 64] >> (e % 64)) & 1,
				 (uint64_t)dtc_adamw_flag(k, p[e], m[e], v[e]));
	for (int j = 0; j < nw; j++)
		*flagged += (uint64_t)__builtin_popcountll(got[j]);
}

static void run_kernel(dtc_cpu_flags_fn f)
{
	static const double lrs[] = { 1e-7, 1e-6, 1e-5, 1e-4, 1e-3 };
	float *p = malloc(BLOCK * sizeof(float)), *m = malloc(BLOCK * sizeof(float)),
	      *v = malloc(BLOCK * sizeof(float));
	uint64_t flagged = 0, total = 0;

	assert_non_null(p);
	assert_non_null(m);
	assert_non_null(v);
	for (int it = 0; it < 600; it++) {
		struct dtc_consts k;
		int nw = 1 + it % DTC_CPU_BLOCK_WORDS;

		derive(&k, it % 2, lrs[it % 5], (it / 2) % 3 * 0.05, it % 7 == 0 ? 0.0 : 1e-8,
		       1 + it % 13);
		for (int e = 0; e < BLOCK; e++) {
			p[e] = weight();
			moments(&m[e], &v[e]);
		}
		/* Some blocks all quiet, some all flagged: the list's bounds. */
		if (it % 50 == 1)
			for (int e = 0; e < BLOCK; e++)
				p[e] = 0.25f, m[e] = 0.0f, v[e] = 1.0f;
		if (it % 50 == 2)
			for (int e = 0; e < BLOCK; e++)
				p[e] = dtc_bits_f32(0x3f808000u);
		check_block(f, &k, p, m, v, nw, &flagged);
		total += 64 * (uint64_t)nw;
	}
	print_message("simd: elements=%llu flagged=%llu\n", (unsigned long long)total,
		      (unsigned long long)flagged);
	assert_true(flagged > total / 100 && flagged < total);
	free(p);
	free(m);
	free(v);
}

static void test_avx512(void **state)
{
	dtc_cpu_flags_fn f = dtc_cpu_flags_avx512();

	if (!f) {
		print_message("avx512 kernel unavailable here (build or CPU): skipped\n");
		skip();
	}
	run_kernel(f);
}

/* Whatever the scan picks must agree too (the portable kernel trivially). */
static void test_best(void **state)
{
	run_kernel(dtc_cpu_flags_best());
}

/* ---- the checksum's row kernels (struct dtc_cpu_runs) ----------------
 * Each against the element math written out here (dtc_bf16_rne,
 * dtc_csum_term per element), not against gpu/cpu.c's loops: lengths
 * around the 16-lane vectors, destination strides of either sign, bases
 * far apart (the keys are carried as Weyl states), every kind of weight. */
static uint64_t ref_term(int64_t base, int64_t dstride, uint64_t i, uint16_t b)
{
	return dtc_csum_term((uint64_t)(base + (int64_t)i * dstride), b);
}

static void run_runs(const struct dtc_cpu_runs *r)
{
	enum { N = 300 };
	static const uint64_t lens[] = { 0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129, 250, N };
	static const int64_t strides[] = { 1, 2, 3, -1, -5, 1024, 151936 };
	static const int64_t bases[] = { 0, 1, 12345, (int64_t)1 << 33, 276836607 };
	float src[N];
	uint16_t bits[N], out[N + 8], v[N], d[N], v0[N], d0[N];
	uint64_t cases = 0;

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (size_t si = 0; si < sizeof(strides) / sizeof(strides[0]); si++)
			for (size_t bi = 0; bi < sizeof(bases) / sizeof(bases[0]); bi++) {
				uint64_t n = lens[li], want_b = 0, want_f = 0, want_s = 0;
				int64_t ds = strides[si], base = bases[bi];

				for (uint64_t i = 0; i < N; i++) {
					src[i] = weight();
					bits[i] = (uint16_t)rnd();
					v[i] = v0[i] = (uint16_t)rnd();
					d[i] = d0[i] = (uint16_t)rnd();
				}
				for (uint64_t i = 0; i < n; i++) {
					want_b += ref_term(base, ds, i, bits[i]);
					want_f += ref_term(base, ds, i, dtc_bf16_rne(src[i]));
					want_s += ref_term(base, 1, i, v0[i]);
				}
				assert_int_equal(r->csum_bits(bits, base, ds, n), want_b);
				assert_int_equal(r->csum_fp32(src, base, ds, n), want_f);
				memset(out, 0xa5, sizeof(out));
				assert_int_equal(r->extract_csum(src, out, base, ds, n), want_f);
				for (uint64_t i = 0; i < n; i++)
					assert_int_equal(out[i], dtc_bf16_rne(src[i]));
				for (uint64_t i = n; i < N + 8; i++)
					assert_int_equal(out[i], 0xa5a5);	/* nothing past the run */
				assert_int_equal(r->swap_csum(v, d, base, n), want_s);
				for (uint64_t i = 0; i < N; i++) {
					assert_int_equal(d[i], i < n ? v0[i] : d0[i]);
					assert_int_equal(v[i], i < n ? d0[i] : v0[i]);
				}
				cases++;
			}
	print_message("runs: cases=%llu\n", (unsigned long long)cases);
	assert_int_equal(cases, 15 * 7 * 5);
}

static void test_runs_generic(void **state)
{
	run_runs(&dtc_cpu_runs_generic);
}

static void test_runs_avx512(void **state)
{
	const struct dtc_cpu_runs *r = dtc_cpu_runs_avx512();

	if (!r) {
		print_message("avx512 row kernels unavailable here (build or CPU): skipped\n");
		skip();
	}
	run_runs(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_avx512),
		cmocka_unit_test(test_best),
		cmocka_unit_test(test_runs_generic),
		cmocka_unit_test(test_runs_avx512),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
