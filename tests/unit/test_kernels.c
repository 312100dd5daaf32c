/* cpu kernels over plan entries: box walking with transposed, negative and
 * interleaved strides against a naive reference; scan/mark/sparse against
 * the element math; scatter bounds; checksum partial sums. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <xxhash.h>
#include "gpu/backend.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

static uint64_t seed = 7;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

static float gaussf(void)
{
	/* sum of uniforms: cheap, roughly normal, plenty for fixtures */
	double s = 0;

	for (int i = 0; i < 4; i++)
		s += (double)(rnd() >> 11) / 9007199254740992.0 - 0.5;
	return (float)(s * 1.7);
}

/* Reference mapping: decompose p row-major, no coalescing, no walking. */
static int64_t ref_index(const struct dte_box_map *e, uint64_t p, int dst)
{
	int64_t idx = dst ? e->dst_offset : e->src_offset;

	for (int d = (int)e->ndim - 1; d >= 0; d--) {
		idx += (int64_t)(p % (uint64_t)e->extent[d]) * (dst ? e->dst_stride[d] : e->src_stride[d]);
		p /= (uint64_t)e->extent[d];
	}
	return idx;
}

/* Entries over a 6x10 (or so) source of 1000 elements, of every kind. */
static struct dte_box_map entries[] = {
	/* plain 2-D sub-box of a row-major 20x50 tensor */
	{ 2, { 6, 10 }, 50 * 3 + 5, { 50, 1 }, 0, { 10, 1 } },
	/* transposed storage: canonical [r][c] lives at c*20 + r */
	{ 2, { 20, 50 }, 0, { 1, 20 }, 0, { 50, 1 } },
	/* negative strides: reversed rows and columns */
	{ 2, { 10, 30 }, 999, { -30, -1 }, 299, { -30, -1 } },
	/* interleaved: every other element, offset 1 (e.g. per-group pieces) */
	{ 2, { 5, 100 }, 1, { 200, 2 }, 3, { 101, 1 } },
	/* 4-D with extent-1 dims and mixed signs, dst transposed */
	{ 4, { 3, 1, 4, 5 }, 500, { 100, 7, -20, 3 }, 0, { 1, 1000, 3, 12 } },
	/* long contiguous run that coalesces into one row */
	{ 3, { 4, 5, 50 }, 0, { 250, 50, 1 }, 0, { 250, 50, 1 } },
	/* scalar */
	{ 0, { 0 }, 17, { 0 }, 5, { 0 } },
};
#define N_ENTRIES (sizeof(entries) / sizeof(entries[0]))
#define SRC_LEN 1000
#define DST_LEN 1000

static void test_walk_extract_apply(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	float src[SRC_LEN];
	uint16_t out[SRC_LEN], dst[DST_LEN];

	/* bf16 bits == source index, so extract reveals the walk */
	for (int i = 0; i < SRC_LEN; i++)
		src[i] = dtc_bf16_f32((uint16_t)i);
	for (size_t t = 0; t < N_ENTRIES; t++) {
		const struct dte_box_map *e = &entries[t];
		uint64_t size = dtc_box_size(e);

		assert_int_equal(dtc_entry_check(e, SRC_LEN, DST_LEN), DTC_OK);
		assert_int_equal(dtc_dense_extract(cpu, e, src, SRC_LEN, out), DTC_OK);
		for (uint64_t p = 0; p < size; p++)
			if (out[p] != ref_index(e, p, 0))
				fail_msg("entry %zu pos %llu: src %u want %lld", t, (unsigned long long)p,
					 out[p], (long long)ref_index(e, p, 0));
		memset(dst, 0xff, sizeof(dst));
		assert_int_equal(dtc_dense_apply(cpu, e, out, dst, DST_LEN), DTC_OK);
		for (uint64_t p = 0; p < size; p++)
			assert_int_equal(dst[ref_index(e, p, 1)], out[p]);
	}
}

static void test_entry_check(void **state)
{
	struct dte_box_map e = entries[0];
	float src[10] = { 0 };
	uint16_t out[100];

	assert_int_equal(dtc_entry_check(&e, 50 * 8 + 15, UINT64_MAX), DTC_OK);
	assert_int_equal(dtc_entry_check(&e, 50 * 8 + 14, UINT64_MAX), DTC_EBOX);
	e.src_offset = -1;
	assert_int_equal(dtc_entry_check(&e, UINT64_MAX - 1, UINT64_MAX), DTC_EBOX);
	e = entries[2];
	e.src_offset = 298;	/* reversed walk would reach -1 */
	assert_int_equal(dtc_entry_check(&e, SRC_LEN, UINT64_MAX), DTC_EBOX);
	e.extent[0] = 0;
	assert_int_equal(dtc_entry_check(&e, SRC_LEN, UINT64_MAX), DTC_EBOX);
	e = entries[0];
	e.src_stride[0] = INT64_MAX / 2;	/* overflow in the span */
	assert_int_equal(dtc_entry_check(&e, UINT64_MAX - 1, UINT64_MAX), DTC_EBOX);
	e.ndim = 7;
	assert_int_equal(dtc_entry_check(&e, SRC_LEN, DST_LEN), DTC_EBOX);
	/* kernels refuse before touching memory */
	assert_int_equal(dtc_dense_extract(dtc_backend_cpu(), &entries[0], src, 10, out), DTC_EBOX);
}

static void test_scatter(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	const struct dte_box_map *e = &entries[4];	/* 60 elements, transposed dst */
	uint64_t pos[5] = { 0, 7, 8, 33, 59 };
	uint16_t val[5] = { 11, 22, 33, 44, 55 }, dst[DST_LEN], before[DST_LEN];

	memset(dst, 0, sizeof(dst));
	assert_int_equal(dtc_scatter_apply(cpu, e, pos, val, 5, dst, DST_LEN), DTC_OK);
	for (int i = 0; i < 5; i++)
		assert_int_equal(dst[ref_index(e, pos[i], 1)], val[i]);
	/* out of range position anywhere: error, nothing written */
	memcpy(before, dst, sizeof(dst));
	pos[4] = 60;
	val[0] = 99;
	assert_int_equal(dtc_scatter_apply(cpu, e, pos, val, 5, dst, DST_LEN), DTC_ERANGE);
	assert_memory_equal(dst, before, sizeof(dst));
	pos[4] = UINT64_MAX;
	assert_int_equal(dtc_scatter_apply(cpu, e, pos, val, 5, dst, DST_LEN), DTC_ERANGE);
	assert_memory_equal(dst, before, sizeof(dst));
	/* an entry that maps past the destination is refused */
	pos[4] = 59;
	assert_int_equal(dtc_scatter_apply(cpu, e, pos, val, 5, dst, 59), DTC_EBOX);
	assert_memory_equal(dst, before, sizeof(dst));
	/* unsorted positions are fine for scatter */
	pos[0] = 40, pos[1] = 2;
	assert_int_equal(dtc_scatter_apply(cpu, e, pos, val, 5, dst, DST_LEN), DTC_OK);
	assert_int_equal(dst[ref_index(e, 40, 1)], 99);
	assert_int_equal(dst[ref_index(e, 2, 1)], 22);
}

struct fixture {
	float *p, *m, *v;
	uint64_t n;
};

/* One simulated AdamW step over n elements (forward from elem.h). */
static void fixture_step(struct fixture *f, const struct dtc_consts *k)
{
	for (uint64_t i = 0; i < f->n; i++) {
		float g = gaussf() * 1e-3f;

		f->m[i] = 0.9f * f->m[i] + 0.1f * g;
		f->v[i] = 0.999f * f->v[i] + 0.001f * g * g;
		f->p[i] = dtc_adamw_forward(k, f->p[i], f->m[i], f->v[i]);
	}
}

static void fixture_init(struct fixture *f, uint64_t n)
{
	f->n = n;
	f->p = malloc(n * 4);
	f->m = calloc(n, 4);
	f->v = calloc(n, 4);
	assert_non_null(f->p);
	assert_non_null(f->m);
	assert_non_null(f->v);
	for (uint64_t i = 0; i < n; i++)
		f->p[i] = gaussf() * 0.02f;
}

static void fixture_fini(struct fixture *f)
{
	free(f->p);
	free(f->m);
	free(f->v);
}

static void consts(struct dtc_consts *k, int64_t step, int variant)
{
	struct dtc_hparams hp = { 1e-4, 0.9, 0.999, 1e-8, 0.01, step, variant };

	assert_int_equal(dtc_hparams_derive(&hp, k, NULL, 0), DTC_OK);
}

/* scan + sparse over an entry equal the per-element verdicts. */
static void check_detect(const struct dte_box_map *e, struct fixture *f, const struct dtc_consts *k)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	uint64_t size = dtc_box_size(e), words = dtc_bitmap_words(e), count, n, want = 0, j = 0;
	uint64_t *bm = malloc(words * 8), *pos = malloc(size * 8);
	uint16_t *val = malloc(size * 2);
	struct dtc_src s = { f->p, f->m, f->v, f->n };

	memset(bm, 0xa5, words * 8);	/* SET must overwrite everything */
	assert_int_equal(dtc_scan(cpu, e, k, &s, bm, words, DTC_SCAN_SET, &count), DTC_OK);
	for (uint64_t p = 0; p < size; p++) {
		int64_t i = ref_index(e, p, 0);
		int flag = dtc_adamw_flag(k, f->p[i], f->m[i], f->v[i]);

		if (((bm[p / 64] >> (p % 64)) & 1) != (uint64_t)flag)
			fail_msg("pos %llu: bitmap %d, element says %d", (unsigned long long)p, !flag, flag);
		want += (uint64_t)flag;
	}
	if (size % 64)
		assert_int_equal(bm[words - 1] >> (size % 64), 0);
	assert_int_equal(count, want);
	assert_true(want > 0 && want < size);
	if (count > 0)
		assert_int_equal(dtc_sparse_from_bitmap(cpu, e, bm, words, f->p, f->n, pos, val,
							count - 1, &n), DTC_ENOSPC);
	assert_int_equal(dtc_sparse_from_bitmap(cpu, e, bm, words, f->p, f->n, pos, val, size, &n),
			 DTC_OK);
	assert_int_equal(n, count);
	for (uint64_t p = 0; p < size; p++) {
		if (!((bm[p / 64] >> (p % 64)) & 1))
			continue;
		assert_int_equal(pos[j], p);
		assert_int_equal(val[j], dtc_bf16_rne(f->p[ref_index(e, p, 0)]));
		j++;
	}
	/* a bitmap shorter than the box is refused */
	assert_int_equal(dtc_scan(cpu, e, k, &s, bm, words - 1, DTC_SCAN_SET, &count), DTC_EINVAL);
	free(bm);
	free(pos);
	free(val);
}

static void test_scan_sparse(void **state)
{
	struct fixture f;
	struct dtc_consts k;

	fixture_init(&f, SRC_LEN);
	for (int variant = 0; variant < 2; variant++) {
		consts(&k, 1, variant);
		fixture_step(&f, &k);
		for (size_t t = 0; t < N_ENTRIES; t++)
			if (dtc_box_size(&entries[t]) > 50)
				check_detect(&entries[t], &f, &k);
	}
	fixture_fini(&f);
}

/* Big enough to be split across threads, with a transposed walk too. */
static void test_scan_large(void **state)
{
	struct dte_box_map flat = { 1, { 3000001 }, 0, { 1 }, 0, { 1 } };
	struct dte_box_map tr = { 2, { 1500, 2000 }, 0, { 1, 1500 }, 0, { 2000, 1 } };
	struct fixture f;
	struct dtc_consts k;

	fixture_init(&f, 3000001);
	consts(&k, 1, DTC_VARIANT_TORCH);
	fixture_step(&f, &k);
	check_detect(&flat, &f, &k);
	check_detect(&tr, &f, &k);
	fixture_fini(&f);
}

/* mark: OR of two steps' changed sets is their union; count is its size. */
static void test_mark(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dte_box_map e = { 1, { 777 }, 0, { 1 }, 0, { 1 } };
	uint64_t w = dtc_bitmap_words(&e), a[13], b[13], dirty[13] = { 0 }, c, pop = 0;
	struct fixture f;
	struct dtc_consts k1, k2;
	struct dtc_src s;

	fixture_init(&f, 777);
	s = (struct dtc_src){ f.p, f.m, f.v, f.n };
	consts(&k1, 1, DTC_VARIANT_TORCH);
	fixture_step(&f, &k1);
	assert_int_equal(dtc_scan(cpu, &e, &k1, &s, a, w, DTC_SCAN_SET, &c), DTC_OK);
	assert_int_equal(dtc_scan(cpu, &e, &k1, &s, dirty, w, DTC_SCAN_OR, &c), DTC_OK);
	consts(&k2, 2, DTC_VARIANT_TORCH);
	fixture_step(&f, &k2);
	assert_int_equal(dtc_scan(cpu, &e, &k2, &s, b, w, DTC_SCAN_SET, &c), DTC_OK);
	assert_int_equal(dtc_scan(cpu, &e, &k2, &s, dirty, w, DTC_SCAN_OR, &c), DTC_OK);
	for (uint64_t i = 0; i < w; i++) {
		assert_int_equal(dirty[i], a[i] | b[i]);
		pop += (uint64_t)__builtin_popcountll(dirty[i]);
	}
	assert_int_equal(c, pop);
	assert_true(memcmp(a, b, sizeof(a)) != 0);
	assert_int_equal(dtc_scan(cpu, &e, &k2, &s, dirty, w, 2, &c), DTC_EINVAL);
	fixture_fini(&f);
}

/* Partial checksums of entries that tile a destination add up to the
 * checksum the receiver computes over the applied buffer. */
static void test_checksums(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	/* a 30x40 destination filled by two sources: rows 0..11 and 12..29,
	 * the second stored transposed */
	struct dte_box_map top = { 2, { 12, 40 }, 0, { 40, 1 }, 0, { 40, 1 } };
	struct dte_box_map bot = { 2, { 18, 40 }, 0, { 1, 18 }, 12 * 40, { 40, 1 } };
	float s1[480], s2[720];
	uint16_t dst[1200], v1[480], v2[720];
	uint64_t c1, c2, cd;

	for (int i = 0; i < 480; i++)
		s1[i] = gaussf();
	for (int i = 0; i < 720; i++)
		s2[i] = gaussf();
	assert_int_equal(dtc_checksum_entry(cpu, &top, s1, 480, &c1), DTC_OK);
	assert_int_equal(dtc_checksum_entry(cpu, &bot, s2, 720, &c2), DTC_OK);
	assert_int_equal(dtc_dense_extract(cpu, &top, s1, 480, v1), DTC_OK);
	assert_int_equal(dtc_dense_extract(cpu, &bot, s2, 720, v2), DTC_OK);
	assert_int_equal(dtc_dense_apply(cpu, &top, v1, dst, 1200), DTC_OK);
	assert_int_equal(dtc_dense_apply(cpu, &bot, v2, dst, 1200), DTC_OK);
	assert_int_equal(dtc_checksum_buffer(cpu, dst, 1200, &cd), DTC_OK);
	assert_int_equal(c1 + c2, cd);
	/* one wrong element shows */
	dst[777] ^= 1;
	assert_int_equal(dtc_checksum_buffer(cpu, dst, 1200, &cd), DTC_OK);
	assert_int_not_equal(c1 + c2, cd);
	/* swapping two elements (same multiset of values) also shows */
	dst[777] ^= 1;
	{
		uint16_t t = dst[3];

		dst[3] = dst[4];
		dst[4] = t;
	}
	assert_int_equal(dtc_checksum_buffer(cpu, dst, 1200, &cd), DTC_OK);
	if (dst[3] != dst[4])
		assert_int_not_equal(c1 + c2, cd);
}

/* The threaded checksum equals a plain loop. */
static void test_checksum_large(void **state)
{
	uint64_t n = 3000000, want = 0, got;
	uint16_t *b = malloc(n * 2);

	for (uint64_t i = 0; i < n; i++) {
		b[i] = (uint16_t)rnd();
		want += dtc_csum_term(i, b[i]);
	}
	assert_int_equal(dtc_checksum_buffer(dtc_backend_cpu(), b, n, &got), DTC_OK);
	assert_int_equal(got, want);
	free(b);
}

/* The row-vectorized, threaded checksums of entries and boxes equal a
 * per-element walk on boxes whose rows are not contiguous: a transposed
 * source, a padded destination, a negative stride, rows split mid-way by
 * the threads (2 dims, 1021 x 1031 elements: above the threading cutoff). */
static void test_checksum_strided(void **state)
{
	const int64_t R = 1021, C = 1031, P = 1040;
	uint64_t n = (uint64_t)(R * C), want = 0, want_box = 0, got;
	float *src = malloc(n * sizeof(*src));
	uint16_t *dst = calloc((uint64_t)(R * P), sizeof(*dst));
	struct dte_box_map e;

	assert_non_null(src);
	assert_non_null(dst);
	for (uint64_t i = 0; i < n; i++)
		src[i] = (float)((int32_t)rnd() % 100000) * 1e-5f;
	memset(&e, 0, sizeof(e));
	e.ndim = 2;
	e.extent[0] = R;
	e.extent[1] = C;
	/* source transposed (column-major), destination rows padded to P and
	 * stored bottom-up */
	e.src_offset = 0;
	e.src_stride[0] = 1;
	e.src_stride[1] = R;
	e.dst_offset = (R - 1) * P;
	e.dst_stride[0] = -P;
	e.dst_stride[1] = 1;
	for (int64_t r = 0; r < R; r++)
		for (int64_t c = 0; c < C; c++) {
			int64_t d = e.dst_offset + r * e.dst_stride[0] + c;
			uint16_t b = dtc_bf16_rne(src[r + c * R]);

			dst[d] = b;
			want += dtc_csum_term((uint64_t)d, b);
		}
	want_box = want;
	assert_int_equal(dtc_checksum_entry(dtc_backend_cpu(), &e, src, n, &got), DTC_OK);
	assert_int_equal(got, want);
	assert_int_equal(dtc_checksum_box(dtc_backend_cpu(), &e, dst, (uint64_t)(R * P), &got),
			 DTC_OK);
	assert_int_equal(got, want_box);
	/* one flipped bit anywhere in the box changes the box sum */
	dst[5 * P + 17] ^= 1;
	assert_int_equal(dtc_checksum_box(dtc_backend_cpu(), &e, dst, (uint64_t)(R * P), &got),
			 DTC_OK);
	assert_true(got != want_box);
	free(src);
	free(dst);
}

/* Σ mix(dst index, bf16 of the source element) straight from the
 * definition in gpu/elem.h, position by position (ref_index: no walk, no
 * coalescing). */
static uint64_t ref_entry_sum(const struct dte_box_map *e, const float *src)
{
	uint64_t s = 0, size = dtc_box_size(e);

	for (uint64_t p = 0; p < size; p++)
		s += dtc_csum_term((uint64_t)ref_index(e, p, 1), dtc_bf16_rne(src[ref_index(e, p, 0)]));
	return s;
}

struct runs {
	const uint16_t *out, *want;
	XXH3_state_t *hs;
	uint64_t next, n, max;
};

static uint64_t extract_runs_max, extract_runs_seen;

static void took_run(void *arg, const uint16_t *p, uint64_t n)
{
	struct runs *r = arg;

	if (p != r->out + r->next)
		fail_msg("run at %td, expected at %llu", p - r->out, (unsigned long long)r->next);
	if (memcmp(p, r->want + r->next, n * sizeof(*p)))
		fail_msg("run at %llu handed over before it was written",
			 (unsigned long long)r->next);
	XXH3_64bits_update(r->hs, p, n * sizeof(*p));
	r->next += n;
	r->n++;
	r->max = n > r->max ? n : r->max;
}

static void check_extract_csum(const struct dte_box_map *e, const float *src, uint64_t src_len,
			       const char *what)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	uint64_t size = dtc_box_size(e), sum = 0, sum2 = 0;
	uint16_t *out = malloc(size * sizeof(*out)), *want = malloc(size * sizeof(*want));

	assert_non_null(out);
	assert_non_null(want);
	assert_int_equal(dtc_dense_extract(cpu, e, src, src_len, want), DTC_OK);
	memset(out, 0xa5, size * sizeof(*out));
	assert_int_equal(dtc_dense_extract_csum(cpu, e, src, src_len, out, &sum), DTC_OK);
	if (memcmp(out, want, size * sizeof(*out)))
		fail_msg("%s: fused extract differs from dtc_dense_extract", what);
	if (sum != ref_entry_sum(e, src))
		fail_msg("%s: fused sum %016llx, definition %016llx", what, (unsigned long long)sum,
			 (unsigned long long)ref_entry_sum(e, src));
	assert_int_equal(dtc_checksum_entry(cpu, e, src, src_len, &sum2), DTC_OK);
	assert_int_equal(sum, sum2);
	/* with its runs handed over: the same values and sum, the runs in
	 * order, each final when handed over, covering out once, and a hash
	 * streamed over them equal to one over the whole */
	{
		struct runs r = { .out = out, .want = want, .hs = XXH3_createState() };

		assert_non_null(r.hs);
		XXH3_64bits_reset(r.hs);
		memset(out, 0xa5, size * sizeof(*out));
		assert_int_equal(dtc_dense_extract_csum_each(cpu, e, src, src_len, out, &sum2,
							     took_run, &r), DTC_OK);
		assert_int_equal(sum2, sum);
		if (r.next != size)
			fail_msg("%s: runs covered %llu of %llu", what, (unsigned long long)r.next,
				 (unsigned long long)size);
		assert_int_equal(XXH3_64bits_digest(r.hs), XXH3_64bits(want, size * sizeof(*want)));
		extract_runs_max = r.max > extract_runs_max ? r.max : extract_runs_max;
		extract_runs_seen += r.n;
		XXH3_freeState(r.hs);
	}
	free(out);
	free(want);
}

/* The dense extract fused with its checksum (one read of θ) gives exactly
 * the extract and the entry's checksum as defined, on every kind of box,
 * and on one long enough to cross its slices and the thread split. */
static void test_extract_csum(void **state)
{
	float src[SRC_LEN];
	uint16_t out[4];
	uint64_t sum = 0, n = (1u << 21) + 4099;
	float *big = malloc(2 * n * sizeof(*big));
	struct dte_box_map e = { 0 };
	char what[32];

	for (int i = 0; i < SRC_LEN; i++)
		src[i] = gaussf();
	for (size_t t = 0; t < N_ENTRIES; t++) {
		snprintf(what, sizeof(what), "entry %zu", t);
		check_extract_csum(&entries[t], src, SRC_LEN, what);
	}
	assert_non_null(big);
	for (uint64_t i = 0; i < 2 * n; i++)
		big[i] = gaussf();
	/* one long row, contiguous both sides */
	e.ndim = 1;
	e.extent[0] = (int64_t)n;
	e.src_stride[0] = 1;
	e.dst_stride[0] = 1;
	e.dst_offset = 7;
	check_extract_csum(&e, big, 2 * n, "long contiguous");
	/* long rows, every other source element, destination stride 3 */
	e.ndim = 2;
	e.extent[0] = 2;
	e.extent[1] = (int64_t)(n / 2);
	e.src_offset = 1;
	e.src_stride[0] = (int64_t)n;
	e.src_stride[1] = 2;
	e.dst_offset = 0;
	e.dst_stride[0] = 1;
	e.dst_stride[1] = 3;
	check_extract_csum(&e, big, 2 * n, "long strided");
	/* below the threads' split: one thread, runs of DTC_EXTRACT_RUN */
	e.extent[1] = (int64_t)(DTC_EXTRACT_RUN * 7 / 4);
	extract_runs_seen = 0;
	check_extract_csum(&e, big, 2 * n, "runs strided");
	print_message("extract runs: handed over %llu, longest %llu\n",
		      (unsigned long long)extract_runs_seen, (unsigned long long)extract_runs_max);
	assert_int_equal(extract_runs_seen, 4);	/* 2 rows × 1¾ runs: 3.5 runs, 4 calls */
	/* bad input: refused before anything is touched */
	assert_int_equal(dtc_dense_extract_csum(dtc_backend_cpu(), &entries[0], src, 10, out, &sum),
			 DTC_EBOX);
	assert_int_equal(dtc_dense_extract_csum(dtc_backend_cpu(), &entries[0], src, SRC_LEN, out,
						NULL), DTC_EINVAL);
	free(big);
}

/* An FP32 tensor's halves (daemon/layout/spec.h): a 20 x 30 FP32 source
 * tensor, its [4:12, 5:25] sub-box as halves [8, 20, 2] into a transposed
 * 16-bit sink ([c][r][h]).  Every unit arrives as the source's exact bits
 * (each FP32 value read back whole from the sink), and the sum equals the
 * sink buffer's checksum where nothing else is written. */
static void test_raw16_halves(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	/* source: 16-bit units of a row-major [20][30] FP32 array */
	struct dte_box_map e = { 3, { 8, 20, 2 }, 2 * (4 * 30 + 5), { 2 * 30, 2, 1 },
				 0, { 2, 2 * 8, 1 }, };
	float src[600];
	uint16_t out[320], dst[320];
	uint64_t sum = 0, want = 0, cd;

	(void)state;
	for (int i = 0; i < 600; i++)
		src[i] = gaussf() * 1e-3f;
	assert_int_equal(dtc_raw16_extract_csum(&e, (const uint16_t *)(const void *)src, 1200, out, &sum),
			 DTC_OK);
	assert_int_equal(dtc_dense_apply(cpu, &e, out, dst, 320), DTC_OK);
	for (int r = 0; r < 8; r++)
		for (int c = 0; c < 20; c++) {
			float got;

			memcpy(&got, &dst[2 * (c * 8 + r)], 4);
			assert_memory_equal(&got, &src[(4 + r) * 30 + 5 + c], 4);
		}
	for (uint64_t p = 0; p < 320; p++)
		want += dtc_csum_term((uint64_t)ref_index(&e, p, 1), out[p]);
	assert_int_equal(sum, want);
	assert_int_equal(dtc_checksum_buffer(cpu, dst, 320, &cd), DTC_OK);
	assert_int_equal(cd, sum);
	/* One unit past the source's end is refused, nothing written. */
	e.src_offset = 1200 - (7 * 60 + 19 * 2 + 1);
	assert_int_not_equal(dtc_raw16_extract_csum(&e, (const uint16_t *)(const void *)src, 1200,
						     out, &sum), DTC_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_walk_extract_apply),
		cmocka_unit_test(test_entry_check),
		cmocka_unit_test(test_scatter),
		cmocka_unit_test(test_scan_sparse),
		cmocka_unit_test(test_scan_large),
		cmocka_unit_test(test_mark),
		cmocka_unit_test(test_checksums),
		cmocka_unit_test(test_checksum_large),
		cmocka_unit_test(test_checksum_strided),
		cmocka_unit_test(test_extract_csum),
		cmocka_unit_test(test_raw16_halves),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
