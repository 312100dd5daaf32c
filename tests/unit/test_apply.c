/* dtc_sparse_apply_payload (gpu/apply.c) against its definition,
 * dtc_sparse_apply_payload_ref: random boxes (strided, negative,
 * transposed, scalar), large payloads that take the threaded path, an
 * aliasing map that must not, corrupt and truncated payloads (dst
 * untouched), and the delta against checksum_box(after) − (before). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

static uint64_t seed = 11;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

/* A random box over a buffer of `len` elements: 1..4 dims, each dim's
 * destination stride a permutation of a row-major layout, sign random. */
static void random_map(struct dte_box_map *e, uint64_t len_cap, uint64_t *need)
{
	uint32_t nd = 1 + (uint32_t)(rnd() % 4), perm[DTE_MAX_DIMS];
	int64_t stride = 1 + (int64_t)(rnd() % 2);	/* 2: interleaved */
	int64_t lo = 0, hi = 0;

	memset(e, 0, sizeof(*e));
	e->ndim = nd;
	for (uint32_t d = 0; d < nd; d++) {
		e->extent[d] = 1 + (int64_t)(rnd() % (nd == 1 ? len_cap / 2 : 24));
		perm[d] = d;
	}
	for (uint32_t d = nd; d-- > 1;) {	/* Fisher-Yates: transposed storage */
		uint32_t k = (uint32_t)(rnd() % (d + 1)), t = perm[d];

		perm[d] = perm[k];
		perm[k] = t;
	}
	for (uint32_t i = nd; i-- > 0;) {
		uint32_t d = perm[i];

		e->dst_stride[d] = rnd() & 1 ? -stride : stride;
		stride *= e->extent[d];
	}
	for (uint32_t d = 0; d < nd; d++) {
		int64_t span = (e->extent[d] - 1) * e->dst_stride[d];

		if (span < 0)
			lo += span;
		else
			hi += span;
	}
	e->dst_offset = -lo + (int64_t)(rnd() % 5);
	*need = (uint64_t)(e->dst_offset + hi + 1);
}

/* A payload of about `frac` (out of 1024) of the box, random values. */
static uint8_t *make_payload(uint64_t box, unsigned frac, size_t *len, uint64_t *cnt)
{
	uint64_t *pos = malloc((box ? box : 1) * sizeof(*pos)), n = 0;
	uint16_t *val = malloc((box ? box : 1) * sizeof(*val));
	uint8_t *out;

	assert_non_null(pos);
	assert_non_null(val);
	for (uint64_t p = 0; p < box; p++) {
		if (rnd() % 1024 < frac) {
			pos[n] = p;
			val[n++] = (uint16_t)rnd();
		}
	}
	/* an occasional big jump exercises the escape code and the seek */
	out = malloc(dtc_sparse_bound(n));
	assert_non_null(out);
	assert_int_equal(dtc_sparse_encode(pos, val, n, box, out, dtc_sparse_bound(n), len), DTC_OK);
	free(pos);
	free(val);
	*cnt = n;
	return out;
}

static void fill(uint16_t *b, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		b[i] = (uint16_t)rnd();
}

static void one_case(const struct dte_box_map *e, uint64_t need, unsigned frac)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	uint64_t box = dtc_box_size(e), cnt, n1 = 0, n2 = 0, d1 = 5, d2 = 5, before, after;
	uint16_t *a = malloc(need * sizeof(*a)), *b = malloc(need * sizeof(*b));
	size_t len;
	uint8_t *pl = make_payload(box, frac, &len, &cnt);

	assert_non_null(a);
	assert_non_null(b);
	fill(a, need);
	memcpy(b, a, need * sizeof(*a));
	assert_int_equal(dtc_checksum_box(cpu, e, a, need, &before), DTC_OK);
	assert_int_equal(dtc_sparse_apply_payload(cpu, e, pl, len, a, need, &n1, &d1), DTC_OK);
	assert_int_equal(dtc_sparse_apply_payload_ref(cpu, e, pl, len, b, need, &n2, &d2), DTC_OK);
	assert_int_equal(n1, cnt);
	assert_int_equal(n2, cnt);
	assert_memory_equal(a, b, need * sizeof(*a));
	assert_true(d1 == d2);
	assert_int_equal(dtc_checksum_box(cpu, e, a, need, &after), DTC_OK);
	assert_true(d1 - 5 == after - before);
	/* Idempotent: the second apply changes nothing, delta 0. */
	d1 = 0;
	assert_int_equal(dtc_sparse_apply_payload(cpu, e, pl, len, a, need, &n1, &d1), DTC_OK);
	assert_true(d1 == 0);
	assert_memory_equal(a, b, need * sizeof(*a));
	free(pl);
	free(a);
	free(b);
}

static void test_random_boxes(void **state)
{
	for (int t = 0; t < 300; t++) {
		struct dte_box_map e;
		uint64_t need;

		random_map(&e, 4096, &need);
		one_case(&e, need, (unsigned)(rnd() % 1025));
	}
}

static void test_scalar_and_fixed(void **state)
{
	/* scalar; transposed 2-D; negative strides; interleaved */
	static const struct dte_box_map maps[] = {
		{ 0, { 0 }, 0, { 0 }, 5, { 0 } },
		{ 2, { 20, 50 }, 0, { 0 }, 0, { 1, 20 } },
		{ 2, { 10, 30 }, 0, { 0 }, 299, { -30, -1 } },
		{ 2, { 5, 100 }, 0, { 0 }, 3, { 201, 2 } },
	};

	for (size_t i = 0; i < sizeof(maps) / sizeof(maps[0]); i++)
		for (unsigned frac = 0; frac <= 1024; frac += 256)
			one_case(&maps[i], 1100, frac);
}

/* Big enough for the threaded path: a row-major 2-D and a transposed one. */
static void test_large_threaded(void **state)
{
	struct dte_box_map rowm = { 2, { 1024, 1536 }, 0, { 0 }, 7, { 1536, 1 } };
	struct dte_box_map tr = { 2, { 1536, 1024 }, 0, { 0 }, 0, { 1, 1536 } };

	setenv("DTC_CPU_THREADS", "4", 0);
	one_case(&rowm, 1024 * 1536 + 7, 80);
	one_case(&tr, 1024 * 1536, 300);
	one_case(&rowm, 1024 * 1536 + 7, 3);	/* sparse: long escaped gaps */
}

/* Maps that send several positions to one element (stride 0): no
 * threads, the same result as the reference, and a delta that still
 * matches the buffer's checksum change (each write's old value is what the
 * write before it to that element left).  With a period of 16 elements,
 * one batch of the apply's writes hits the same element many times. */
static void aliasing_case(uint32_t rows, uint32_t cols, unsigned frac)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dte_box_map e = { 2, { rows, cols }, 0, { 0 }, 0, { 0, 1 } };
	uint64_t box = dtc_box_size(&e), cnt, n1, n2, d = 0, before, after;
	uint16_t a[512], b[512];
	size_t len;
	uint8_t *pl = make_payload(box, frac, &len, &cnt);

	assert_true(cols <= 512);
	assert_true(cnt >= (1u << 16));
	fill(a, cols);
	memcpy(b, a, cols * sizeof(*a));
	assert_int_equal(dtc_checksum_buffer(cpu, a, cols, &before), DTC_OK);
	assert_int_equal(dtc_sparse_apply_payload(cpu, &e, pl, len, a, cols, &n1, &d), DTC_OK);
	assert_int_equal(dtc_sparse_apply_payload_ref(cpu, &e, pl, len, b, cols, &n2, NULL), DTC_OK);
	assert_memory_equal(a, b, cols * sizeof(*a));
	assert_int_equal(dtc_checksum_buffer(cpu, a, cols, &after), DTC_OK);
	assert_true(d == after - before);
	free(pl);
}

static void test_aliasing_map(void **state)
{
	aliasing_case(512, 512, 400);
	aliasing_case(16384, 16, 600);
}

static uint64_t dst_index(const struct dte_box_map *e, uint64_t i);

/* dtc_sparse_readback_payload after a swap: the memory's delta equals the
 * swap's while every write landed, and differs once one element holds its
 * old value again (a write that did not land); nothing is written. */
static void readback_case(const struct dte_box_map *e, uint64_t need, const uint8_t *pl,
			  const uint8_t *pl0, size_t len, uint64_t cnt, uint16_t *a,
			  const uint16_t *orig, uint64_t d_swap)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	uint64_t rb = 0, n = 0, *pos = malloc((cnt ? cnt : 1) * sizeof(*pos)), got = 0;
	uint16_t *val = malloc((cnt ? cnt : 1) * sizeof(*val));
	uint16_t *a0 = malloc(need * sizeof(*a0));
	uint8_t *plc = malloc(len ? len : 1);

	assert_true(pos && val && a0 && plc);
	memcpy(a0, a, need * sizeof(*a));
	memcpy(plc, pl, len);
	assert_int_equal(dtc_sparse_readback_payload(cpu, e, pl, len, a, need, &n, &rb), DTC_OK);
	assert_int_equal(n, cnt);
	assert_true(rb == d_swap);
	assert_memory_equal(a, a0, need * sizeof(*a));	/* nothing written */
	assert_memory_equal(pl, plc, len);
	assert_int_equal(dtc_sparse_decode(pl0, len, dtc_box_size(e), pos, val, cnt, &got), DTC_OK);
	for (uint64_t k = 0; k < got; k++) {
		uint64_t at = dst_index(e, pos[k]);

		if (orig[at] == a[at])
			continue;	/* the write changed nothing there */
		a[at] = orig[at];	/* as if that write had been skipped */
		rb = 0;
		assert_int_equal(dtc_sparse_readback_payload(cpu, e, pl, len, a, need, &n, &rb),
				 DTC_OK);
		assert_true(rb != d_swap);
		a[at] = a0[at];
		break;
	}
	free(pos);
	free(val);
	free(a0);
	free(plc);
}

/* dtc_sparse_swap_payload (apply on arrival with undo): the buffer gets
 * what the apply writes (same delta), the payload the old values; the
 * same call again puts the buffer and the payload back bit for bit (delta
 * the opposite); a map that may alias is refused, nothing touched. */
static void swap_case(const struct dte_box_map *e, uint64_t need, unsigned frac)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	uint64_t box = dtc_box_size(e), cnt, n1 = 0, n2 = 0, d1 = 0, d2 = 0, d3 = 0;
	uint16_t *a = malloc(need * sizeof(*a)), *b = malloc(need * sizeof(*b));
	uint16_t *orig = malloc(need * sizeof(*orig));
	size_t len;
	uint8_t *pl = make_payload(box, frac, &len, &cnt), *pl0 = malloc(len ? len : 1);

	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(orig);
	assert_non_null(pl0);
	fill(a, need);
	memcpy(b, a, need * sizeof(*a));
	memcpy(orig, a, need * sizeof(*a));
	memcpy(pl0, pl, len);
	assert_true(dtc_map_injective(e));
	assert_int_equal(dtc_sparse_swap_payload(cpu, e, pl, len, a, need, &n1, &d1), DTC_OK);
	assert_int_equal(dtc_sparse_apply_payload_ref(cpu, e, pl0, len, b, need, &n2, &d2), DTC_OK);
	assert_int_equal(n1, cnt);
	assert_memory_equal(a, b, need * sizeof(*a));
	assert_true(d1 == d2);
	readback_case(e, need, pl, pl0, len, cnt, a, orig, d1);
	/* undo */
	assert_int_equal(dtc_sparse_swap_payload(cpu, e, pl, len, a, need, &n1, &d3), DTC_OK);
	assert_memory_equal(a, orig, need * sizeof(*a));
	assert_memory_equal(pl, pl0, len);
	assert_true(d1 + d3 == 0);
	free(pl);
	free(pl0);
	free(a);
	free(b);
	free(orig);
}

static void test_swap_undo(void **state)
{
	struct dte_box_map rowm = { 2, { 1024, 1536 }, 0, { 0 }, 7, { 1536, 1 } };
	struct dte_box_map alias = { 2, { 64, 16 }, 0, { 0 }, 0, { 0, 1 } };
	uint16_t buf[16] = { 0 }, buf0[16];
	uint64_t cnt, n = 0, d = 0;
	size_t len;
	uint8_t *pl, *pl0;

	for (int t = 0; t < 200; t++) {
		struct dte_box_map e;
		uint64_t need;

		random_map(&e, 4096, &need);
		if (dtc_map_injective(&e))
			swap_case(&e, need, (unsigned)(rnd() % 1025));
	}
	setenv("DTC_CPU_THREADS", "4", 0);
	swap_case(&rowm, 1024 * 1536 + 7, 80);	/* the threaded path */
	/* aliasing: refused, nothing written either side */
	pl = make_payload(dtc_box_size(&alias), 900, &len, &cnt);
	pl0 = malloc(len);
	assert_non_null(pl0);
	memcpy(pl0, pl, len);
	fill(buf, 16);
	memcpy(buf0, buf, sizeof(buf));
	assert_false(dtc_map_injective(&alias));
	assert_int_equal(dtc_sparse_swap_payload(dtc_backend_cpu(), &alias, pl, len, buf, 16, &n, &d),
			 DTC_EINVAL);
	assert_memory_equal(buf, buf0, sizeof(buf));
	assert_memory_equal(pl, pl0, len);
	free(pl);
	free(pl0);
}

/* dtc_dense_swap_payload: the buffer as dtc_dense_apply() leaves it,
 * *sum_new as dtc_checksum_box() of it, the payload the old values in
 * canonical order; the same call again restores both bit for bit; a
 * wrong length or an aliasing map is refused with nothing written. */
/* Box position i (row-major) → its destination index, from the map's
 * definition (gpu/entry.h). */
static uint64_t dst_index(const struct dte_box_map *e, uint64_t i)
{
	int64_t at = e->dst_offset;

	for (uint32_t d = e->ndim; d-- > 0;) {
		at += (int64_t)(i % (uint64_t)e->extent[d]) * e->dst_stride[d];
		i /= (uint64_t)e->extent[d];
	}
	return (uint64_t)at;
}

/* The cpu backend without its fused dense_swap: dtc_dense_swap_payload's
 * generic swap, then dtc_checksum_box (the definition the fused op must
 * match; what a host backend without the op runs). */
static struct dtc_backend_ops ref_ops;
static struct dtc_backend ref_be = { "cpu-ref", &ref_ops, "" };

static void dense_swap_one(const struct dtc_backend *cpu, const struct dte_box_map *e,
			   uint64_t need)
{
	uint64_t box = dtc_box_size(e), s1 = 0, s2 = 0, s3 = 0;
	uint16_t *a = malloc(need * sizeof(*a)), *b = malloc(need * sizeof(*b));
	uint16_t *orig = malloc(need * sizeof(*orig));
	uint16_t *pl = malloc((box ? box : 1) * sizeof(*pl)), *pl0 = malloc((box ? box : 1) * 2);

	assert_true(a && b && orig && pl && pl0);
	fill(a, need);
	memcpy(b, a, need * sizeof(*a));
	memcpy(orig, a, need * sizeof(*a));
	fill(pl, box);
	memcpy(pl0, pl, box * 2);
	assert_int_equal(dtc_dense_swap_payload(cpu, e, (uint8_t *)pl, box * 2, a, need, &s1),
			 DTC_OK);
	assert_int_equal(dtc_dense_apply(cpu, e, pl0, b, need), DTC_OK);
	assert_memory_equal(a, b, need * sizeof(*a));
	assert_int_equal(dtc_checksum_box(cpu, e, b, need, &s2), DTC_OK);
	assert_true(s1 == s2);
	/* the payload holds what the box's elements held, in box order */
	for (uint64_t i = 0; i < box; i++)
		assert_int_equal(pl[i], orig[dst_index(e, i)]);
	/* undo */
	assert_int_equal(dtc_dense_swap_payload(cpu, e, (uint8_t *)pl, box * 2, a, need, &s3),
			 DTC_OK);
	assert_memory_equal(a, orig, need * sizeof(*a));
	assert_memory_equal(pl, pl0, box * 2);
	/* a payload one value short or long: refused, nothing written */
	if (box) {
		assert_int_equal(dtc_dense_swap_payload(cpu, e, (uint8_t *)pl, box * 2 - 2, a, need,
							&s3), DTC_ETRUNC);
		assert_int_equal(dtc_dense_swap_payload(cpu, e, (uint8_t *)pl, box * 2 + 1, a, need,
							&s3), DTC_ECORRUPT);
		assert_memory_equal(a, orig, need * sizeof(*a));
		assert_memory_equal(pl, pl0, box * 2);
	}
	free(a);
	free(b);
	free(orig);
	free(pl);
	free(pl0);
}

/* Each case through the cpu backend's fused op and through the generic
 * swap: both must give the same buffers, payloads and sums. */
static void dense_swap_case(const struct dte_box_map *e, uint64_t need)
{
	ref_ops = *dtc_backend_cpu()->ops;
	ref_ops.dense_swap = NULL;
	assert_non_null(dtc_backend_cpu()->ops->dense_swap);
	dense_swap_one(dtc_backend_cpu(), e, need);
	dense_swap_one(&ref_be, e, need);
}

static void test_dense_swap(void **state)
{
	struct dte_box_map rowm = { 2, { 1024, 1536 }, 0, { 0 }, 7, { 1536, 1 } };
	struct dte_box_map col = { 2, { 300, 40 }, 0, { 0 }, 3, { 1, 300 } };
	struct dte_box_map alias = { 2, { 64, 16 }, 0, { 0 }, 0, { 0, 1 } };
	uint16_t buf[16], buf0[16], pl[64 * 16], pl0[64 * 16];
	uint64_t s = 0;
	int tried = 0;

	for (int t = 0; t < 200; t++) {
		struct dte_box_map e;
		uint64_t need;

		random_map(&e, 4096, &need);
		if (dtc_map_injective(&e)) {
			dense_swap_case(&e, need);
			tried++;
		}
	}
	assert_true(tried > 50);
	dense_swap_case(&rowm, 1024 * 1536 + 7);	/* rows of memcpy blocks */
	dense_swap_case(&col, 300 * 40 + 3);		/* a strided destination */
	fill(buf, 16);
	memcpy(buf0, buf, sizeof(buf));
	fill(pl, 64 * 16);
	memcpy(pl0, pl, sizeof(pl));
	assert_int_equal(dtc_dense_swap_payload(dtc_backend_cpu(), &alias, (uint8_t *)pl,
						sizeof(pl), buf, 16, &s), DTC_EINVAL);
	assert_memory_equal(buf, buf0, sizeof(buf));
	assert_memory_equal(pl, pl0, sizeof(pl));
}

/* Every truncation and many one-byte corruptions: the same status as the
 * decoder, and dst untouched whenever it is an error. */
static void test_bad_payloads(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dte_box_map e = { 2, { 40, 200 }, 0, { 0 }, 3, { 1, 40 } };
	uint64_t box = dtc_box_size(&e), cnt, n, d;
	uint16_t a[8100], b[8100];
	uint64_t *pos = malloc(box * sizeof(*pos));
	uint16_t *val = malloc(box * sizeof(*val));
	size_t len;
	uint8_t *pl = make_payload(box, 30, &len, &cnt), *bad = malloc(len + 4);
	int errors = 0;

	assert_non_null(bad);
	fill(a, 8100);
	memcpy(b, a, sizeof(a));
	for (size_t cut = 0; cut < len; cut++) {
		int rc = dtc_sparse_apply_payload(cpu, &e, pl, cut, a, 8100, &n, &d);

		assert_int_not_equal(rc, DTC_OK);
		assert_int_equal(dtc_sparse_payload_check(pl, cut, box, &n), rc);
		assert_memory_equal(a, b, sizeof(a));
	}
	for (int t = 0; t < 4000; t++) {
		size_t at = (size_t)(rnd() % len);
		int rc, want;
		uint64_t got;

		memcpy(bad, pl, len);
		bad[at] ^= (uint8_t)(1 + rnd() % 255);
		want = dtc_sparse_decode(bad, len, box, pos, val, box, &got);
		assert_int_equal(dtc_sparse_payload_check(bad, len, box, &n), want);
		rc = dtc_sparse_apply_payload(cpu, &e, bad, len, a, 8100, &n, &d);
		assert_int_equal(rc, want);
		if (rc != DTC_OK) {
			errors++;
			assert_memory_equal(a, b, sizeof(a));
		} else {
			/* a value byte: still well-formed; restore the baseline */
			memcpy(a, b, sizeof(a));
		}
	}
	assert_true(errors > 100);
	/* Trailing bytes and a position past the box. */
	memcpy(bad, pl, len);
	bad[len] = 0;
	assert_int_equal(dtc_sparse_apply_payload(cpu, &e, bad, len + 1, a, 8100, &n, &d),
			 DTC_ECORRUPT);
	assert_int_equal(dtc_sparse_apply_payload(cpu, &e, pl, len, a, 8100, &n, &d), DTC_OK);
	memcpy(b, a, sizeof(a));
	assert_int_not_equal(dtc_sparse_apply_payload(cpu, &e, pl, len, a, 8000, &n, &d),
			     DTC_OK);	/* dst too short for the box */
	{
		struct dte_box_map small = e;

		small.extent[1] = 100;	/* same payload, half the box */
		assert_int_equal(dtc_sparse_apply_payload(cpu, &small, pl, len, a, 8100, &n, &d),
				 DTC_ERANGE);
	}
	assert_memory_equal(a, b, sizeof(a));
	free(pl);
	free(bad);
	free(pos);
	free(val);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_boxes),
		cmocka_unit_test(test_scalar_and_fixed),
		cmocka_unit_test(test_large_threaded),
		cmocka_unit_test(test_aliasing_map),
		cmocka_unit_test(test_bad_payloads),
		cmocka_unit_test(test_swap_undo),
		cmocka_unit_test(test_dense_swap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
