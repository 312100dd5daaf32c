/* test-gpu: every kernel on the cuda backend against the cpu backend, bit
 * for bit, over random data (special values included) and simulated AdamW
 * steps, through entries with transposed, negative and interleaved strides.
 * Usage: test_cuda <path to dte-cuda.so>.  Exits 2 with "no CUDA device"
 * when the plugin cannot open a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

static uint64_t seed = 99;
static int failures, cases;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

static float gaussf(void)
{
	double s = 0;

	for (int i = 0; i < 4; i++)
		s += (double)(rnd() >> 11) / 9007199254740992.0 - 0.5;
	return (float)(s * 1.7);
}

#define CHECK(cond, ...) do { \
	cases++; \
	if (!(cond)) { failures++; fprintf(stderr, "MISMATCH: " __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

struct dev {
	const struct dtc_backend_ops *ops;
};

static void *up(const struct dtc_backend_ops *o, const void *h, uint64_t bytes)
{
	void *d = o->mem_alloc(bytes);

	if (!d || o->mem_copy(d, h, bytes, 0) != DTC_OK) {
		fprintf(stderr, "test-gpu: device allocation/copy of %llu bytes failed\n",
			(unsigned long long)bytes);
		exit(1);
	}
	return d;
}

static void down(const struct dtc_backend_ops *o, void *h, const void *d, uint64_t bytes)
{
	if (o->mem_copy(h, d, bytes, 1) != DTC_OK) {
		fprintf(stderr, "test-gpu: copy back failed\n");
		exit(1);
	}
}

static void compare_entry(const struct dtc_backend *cpu, const struct dtc_backend *gpu,
			  const struct dte_box_map *e, const float *p, const float *m, const float *v,
			  uint64_t len, const struct dtc_consts *k, const char *what)
{
	const struct dtc_backend_ops *o = gpu->ops;
	uint64_t size = dtc_box_size(e), words = dtc_bitmap_words(e), cc, gc, cn, gn, cs, gs;
	uint64_t *cbm = calloc(words, 8), *gbm = calloc(words, 8), *cpos = malloc(size * 8),
		 *gpos = malloc(size * 8);
	uint16_t *cval = malloc(size * 2), *gval = malloc(size * 2), *cdst = calloc(len, 2),
		 *gdst = calloc(len, 2);
	float *dp = up(o, p, len * 4), *dm = up(o, m, len * 4), *dv = up(o, v, len * 4);
	uint64_t *dbm = up(o, cbm, words * 8), *dpos = o->mem_alloc(size * 8);
	uint16_t *dval = o->mem_alloc(size * 2), *ddst = up(o, cdst, len * 2);
	struct dtc_src cs_src = { p, m, v, len }, gs_src = { dp, dm, dv, len };
	int rc1, rc2;

	for (int mode = 0; mode < 2; mode++) {
		rc1 = dtc_scan(cpu, e, k, &cs_src, cbm, words, mode, &cc);
		rc2 = dtc_scan(gpu, e, k, &gs_src, dbm, words, mode, &gc);
		down(o, gbm, dbm, words * 8);
		CHECK(rc1 == 0 && rc2 == 0, "%s: scan rc %d/%d", what, rc1, rc2);
		CHECK(cc == gc, "%s: scan mode %d count cpu %llu cuda %llu", what, mode,
		      (unsigned long long)cc, (unsigned long long)gc);
		CHECK(memcmp(cbm, gbm, words * 8) == 0, "%s: scan mode %d bitmaps differ", what, mode);
	}
	rc1 = dtc_sparse_from_bitmap(cpu, e, cbm, words, p, len, cpos, cval, size, &cn);
	rc2 = dtc_sparse_from_bitmap(gpu, e, dbm, words, dp, len, dpos, dval, size, &gn);
	CHECK(rc1 == 0 && rc2 == 0 && cn == gn, "%s: sparse rc %d/%d n %llu/%llu", what, rc1, rc2,
	      (unsigned long long)cn, (unsigned long long)gn);
	if (cn == gn && cn) {
		down(o, gpos, dpos, cn * 8);
		down(o, gval, dval, cn * 2);
		CHECK(memcmp(cpos, gpos, cn * 8) == 0 && memcmp(cval, gval, cn * 2) == 0,
		      "%s: sparse output differs", what);
	}
	/* scatter the sparse output into both destinations */
	if (cn) {
		rc1 = dtc_scatter_apply(cpu, e, cpos, cval, cn, cdst, len);
		rc2 = dtc_scatter_apply(gpu, e, dpos, dval, cn, ddst, len);
		down(o, gdst, ddst, len * 2);
		CHECK(rc1 == 0 && rc2 == 0 && memcmp(cdst, gdst, len * 2) == 0, "%s: scatter differs", what);
		/* out of range refused on both, nothing written */
		cpos[cn - 1] = size;
		o->mem_copy(dpos, cpos, cn * 8, 0);
		rc1 = dtc_scatter_apply(cpu, e, cpos, cval, cn, cdst, len);
		rc2 = dtc_scatter_apply(gpu, e, dpos, dval, cn, ddst, len);
		down(o, gdst, ddst, len * 2);
		CHECK(rc1 == DTC_ERANGE && rc2 == DTC_ERANGE && memcmp(cdst, gdst, len * 2) == 0,
		      "%s: scatter refusal rc %d/%d", what, rc1, rc2);
	}
	/* dense extract + apply */
	rc1 = dtc_dense_extract(cpu, e, p, len, cval);
	rc2 = dtc_dense_extract(gpu, e, dp, len, dval);
	down(o, gval, dval, size * 2);
	CHECK(rc1 == 0 && rc2 == 0 && memcmp(cval, gval, size * 2) == 0, "%s: extract differs", what);
	rc1 = dtc_dense_apply(cpu, e, cval, cdst, len);
	rc2 = dtc_dense_apply(gpu, e, dval, ddst, len);
	down(o, gdst, ddst, len * 2);
	CHECK(rc1 == 0 && rc2 == 0 && memcmp(cdst, gdst, len * 2) == 0, "%s: dense apply differs", what);
	/* checksums */
	rc1 = dtc_checksum_buffer(cpu, cdst, len, &cs);
	rc2 = dtc_checksum_buffer(gpu, ddst, len, &gs);
	CHECK(rc1 == 0 && rc2 == 0 && cs == gs, "%s: buffer checksum differs", what);
	rc1 = dtc_checksum_entry(cpu, e, p, len, &cs);
	rc2 = dtc_checksum_entry(gpu, e, dp, len, &gs);
	CHECK(rc1 == 0 && rc2 == 0 && cs == gs, "%s: entry checksum differs", what);
	/* What a sink checks after apply: the box of the destination, which
	 * after a dense apply holds exactly what the entry checksum promised. */
	{
		uint64_t cb = 0, gb = 0;

		rc1 = dtc_checksum_box(cpu, e, cdst, len, &cb);
		rc2 = dtc_checksum_box(gpu, e, ddst, len, &gb);
		CHECK(rc1 == 0 && rc2 == 0 && cb == gb && cb == cs,
		      "%s: box checksum rc %d/%d cpu %016llx cuda %016llx entry %016llx", what, rc1, rc2,
		      (unsigned long long)cb, (unsigned long long)gb, (unsigned long long)cs);
	}

	o->mem_free(dp);
	o->mem_free(dm);
	o->mem_free(dv);
	o->mem_free(dbm);
	o->mem_free(dpos);
	o->mem_free(dval);
	o->mem_free(ddst);
	free(cbm);
	free(gbm);
	free(cpos);
	free(gpos);
	free(cval);
	free(gval);
	free(cdst);
	free(gdst);
}

int main(int argc, char **argv)
{
	const uint64_t len = 1 << 22;
	struct dte_box_map entries[] = {
		{ 1, { 1 << 22 }, 0, { 1 }, 0, { 1 } },
		{ 1, { 1000003 }, 17, { 1 }, 5, { 1 } },
		/* 16-byte aligned and contiguous (the vector scan), ending mid-quad
		 * and mid-word; and one shorter than a warp's 128 elements */
		{ 1, { 1000003 }, 64, { 1 }, 7, { 1 } },
		{ 1, { 37 }, 4, { 1 }, 100, { 1 } },
		{ 2, { 1024, 4096 }, 0, { 1, 1024 }, 0, { 4096, 1 } },		/* transposed */
		{ 2, { 1000, 4000 }, (1 << 22) - 1, { -4000, -1 }, 3999999, { -4000, -1 } },
		{ 3, { 8, 512, 300 }, 1, { 2 * 512 * 300, 600, 2 }, 0, { 300, 2400, 1 } },
	};
	const char *names[] = { "flat", "offset", "aligned-tail", "short", "transposed", "negative",
				"interleaved" };
	const struct dtc_backend *cpu = dtc_backend_cpu(), *gpu;
	float *p, *m, *v;
	char why[512];

	gpu = dtc_backend_load("cuda", argc > 1 ? argv[1] : NULL, why, sizeof(why));
	if (strcmp(dtc_backend_name(gpu), "cuda") != 0) {
		printf("test-gpu: no CUDA device: %s\n", why);
		return 2;
	}
	printf("test-gpu: device %s\n", dtc_backend_device(gpu));
	p = malloc(len * 4);
	m = calloc(len, 4);
	v = calloc(len, 4);
	if (!p || !m || !v) {
		fprintf(stderr, "test-gpu: out of memory\n");
		return 1;
	}
	/* AdamW fixture: weights ~0.02, a few zero/tiny, both variants, 3 steps */
	for (uint64_t i = 0; i < len; i++)
		p[i] = i % 101 == 0 ? 0.0f : gaussf() * (i % 97 == 0 ? 1e-6f : 0.02f);
	for (int variant = 0; variant < 2; variant++) {
		for (int step = 1; step <= 3; step++) {
			struct dtc_hparams hp = { variant ? 1e-5 : 1e-6, 0.9, 0.999, 1e-8, 0.1, step, variant };
			struct dtc_consts k;
			char what[64];

			dtc_hparams_derive(&hp, &k, NULL, 0);
			for (uint64_t i = 0; i < len; i++) {
				float g = gaussf() * 1e-3f * (i % 13 == 0 ? 30.0f : 1.0f);

				m[i] = 0.9f * m[i] + 0.1f * g;
				v[i] = 0.999f * v[i] + 0.001f * g * g;
				p[i] = dtc_adamw_forward(&k, p[i], m[i], v[i]);
			}
			for (size_t t = 0; t < sizeof(entries) / sizeof(entries[0]); t++) {
				snprintf(what, sizeof(what), "adamw v%d s%d %s", variant, step, names[t]);
				compare_entry(cpu, gpu, &entries[t], p, m, v, len, &k, what);
			}
		}
	}
	/* random bit patterns: NaN, Inf, subnormals, huge values */
	for (uint64_t i = 0; i < len; i++) {
		p[i] = dtc_bits_f32((uint32_t)rnd());
		m[i] = dtc_bits_f32((uint32_t)rnd());
		v[i] = dtc_bits_f32((uint32_t)rnd() & 0x7fffffffu);
	}
	for (int variant = 0; variant < 2; variant++) {
		struct dtc_hparams hp = { 1e-4, 0.9, 0.999, 1e-8, 0.01, 7, variant };
		struct dtc_consts k;

		dtc_hparams_derive(&hp, &k, NULL, 0);
		for (size_t t = 0; t < sizeof(entries) / sizeof(entries[0]); t++)
			compare_entry(cpu, gpu, &entries[t], p, m, v, len, &k, names[t]);
	}
	printf("test-gpu: checks=%d mismatches=%d\n", cases, failures);
	free(p);
	free(m);
	free(v);
	return failures ? 1 : 0;
}
