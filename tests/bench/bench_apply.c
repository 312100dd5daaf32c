/* bench_apply: what the sink's verify that reads memory costs a sparse
 * apply (docs/SYNC.md step 5, docs/BENCHMARKS.md).
 *
 * One BF16 buffer of 2^LOG elements (default 26: 128 MiB, far larger
 * than the caches, as a model's weights are), one entry over all of it,
 * sparse payloads of 0.1 %, 1 % and 4 % of the elements at random
 * positions.  Per fraction, in the same run, alternating, ROUNDS rounds
 * (median):
 *   - before: dtc_sparse_apply_payload(), the write and the delta it
 *     meant to write (what the daemon's incremental check added);
 *   - now:    dtc_sparse_swap_payload() (the payload keeps the old values,
 *     the undo log) then dtc_sparse_readback_payload() (Σ over the written
 *     positions of mix(memory) − mix(old), read back after the writes);
 *   - swap_delta: dtc_sparse_swap_payload() with its own delta (what apply
 *     on arrival added before).
 * The payload is copied back between rounds, outside the timing.  Output,
 * one line per fraction:
 *     apply-verify: elements=N changed=C before_ms=A now_ms=B ratio=B/A
 *         swap_delta_ms=S readback_ms=R
 * and for dense entries (swapped in, the undo log, since the same change):
 *     apply-dense: elements=N copy_ms=C swap_ms=S ratio=S/C
 * (swap_ms includes its fused checksum of what it wrote; the dense check
 * itself is the full pass over the box either way).
 * Usage: bench_apply [LOG [ROUNDS]] */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	unsigned lg = argc > 1 ? (unsigned)atoi(argv[1]) : 26;
	int rounds = argc > 2 ? atoi(argv[2]) : 7;
	const double fracs[] = { 0.001, 0.01, 0.04 };
	uint64_t n = 1ull << lg, seed = 1;
	uint16_t *dst = malloc(n * sizeof(*dst));
	uint64_t *pos = malloc(n / 16 * sizeof(*pos));
	uint16_t *val = malloc(n / 16 * sizeof(*val));
	struct dte_box_map m = { 0 };

	if (lg < 16 || lg > 30 || rounds < 1 || rounds > 101 || !dst || !pos || !val) {
		fprintf(stderr, "usage: bench_apply [LOG 16..30 [ROUNDS 1..101]]\n");
		return 2;
	}
	m.ndim = 1;
	m.extent[0] = (int64_t)n;
	m.dst_stride[0] = 1;
	for (uint64_t i = 0; i < n; i++)
		dst[i] = (uint16_t)dtc_mix64(seed + i);
	for (size_t f = 0; f < sizeof(fracs) / sizeof(fracs[0]); f++) {
		uint64_t c = 0, thr = (uint64_t)(fracs[f] * 18446744073709551615.0);
		double tb[101], tn[101], ts[101], tr[101];
		uint8_t *pl, *work;
		size_t len;

		for (uint64_t i = 0; i < n && c < n / 16; i++) {
			if (dtc_mix64(seed * 1000003 + i) < thr) {
				pos[c] = i;
				val[c++] = (uint16_t)dtc_mix64(i ^ 0x5555);
			}
		}
		pl = malloc(dtc_sparse_bound(c));
		if (!pl || dtc_sparse_encode(pos, val, c, n, pl, dtc_sparse_bound(c), &len) != DTC_OK)
			return 1;
		work = malloc(len);
		if (!work)
			return 1;
		for (int r = 0; r < rounds; r++) {
			uint64_t got = 0, d = 0;
			double t0;

			/* before: write + the delta it meant to write */
			t0 = now_ms();
			if (dtc_sparse_apply_payload(cpu, &m, pl, len, dst, n, &got, &d) != DTC_OK)
				return 1;
			tb[r] = now_ms() - t0;
			/* now: swap (undo log), then read back */
			memcpy(work, pl, len);
			d = 0;
			t0 = now_ms();
			if (dtc_sparse_swap_payload(cpu, &m, work, len, dst, n, &got, NULL) != DTC_OK)
				return 1;
			tr[r] = now_ms();
			if (dtc_sparse_readback_payload(cpu, &m, work, len, dst, n, &got, &d) != DTC_OK)
				return 1;
			tn[r] = now_ms() - t0;
			tr[r] = now_ms() - tr[r];
			/* the swap with its own delta (apply on arrival before) */
			memcpy(work, pl, len);
			d = 0;
			t0 = now_ms();
			if (dtc_sparse_swap_payload(cpu, &m, work, len, dst, n, &got, &d) != DTC_OK)
				return 1;
			ts[r] = now_ms() - t0;
			/* new values in dst differ from the next round's old ones */
			for (uint64_t k = 0; k < c; k += 64)
				dst[pos[k]] ^= 1;
		}
		{
			double b = median(tb, rounds), w = median(tn, rounds);

			printf("apply-verify: elements=%" PRIu64 " changed=%" PRIu64 " before_ms=%.3f "
			       "now_ms=%.3f ratio=%.3f swap_delta_ms=%.3f readback_ms=%.3f\n", n, c, b, w,
			       w / b, median(ts, rounds), median(tr, rounds));
		}
		free(pl);
		free(work);
	}
	{
		/* Dense entries are swapped too (the undo log): the swap against
		 * the copy it replaced, one 2^(LOG-2)-element entry; the full
		 * pass that verifies a dense version is the same either way. */
		uint64_t dn = n / 4, sn = 0;
		uint16_t *pl = malloc(dn * sizeof(*pl)), *work = malloc(dn * sizeof(*work));
		struct dte_box_map dm = m;
		double tc[101], tw[101];

		if (!pl || !work)
			return 1;
		dm.extent[0] = (int64_t)dn;
		for (uint64_t i = 0; i < dn; i++)
			pl[i] = (uint16_t)dtc_mix64(i * 3 + 7);
		for (int r = 0; r < rounds; r++) {
			double t0 = now_ms();

			if (dtc_dense_apply(cpu, &dm, pl, dst, n) != DTC_OK)
				return 1;
			tc[r] = now_ms() - t0;
			memcpy(work, pl, dn * sizeof(*pl));
			t0 = now_ms();
			if (dtc_dense_swap_payload(cpu, &dm, (uint8_t *)work, dn * 2, dst, n, &sn) !=
			    DTC_OK)
				return 1;
			tw[r] = now_ms() - t0;
		}
		{
			double c = median(tc, rounds), w = median(tw, rounds);

			printf("apply-dense: elements=%" PRIu64 " copy_ms=%.3f swap_ms=%.3f ratio=%.3f\n",
			       dn, c, w, w / c);
		}
		free(pl);
		free(work);
	}
	free(dst);
	free(pos);
	free(val);
	return 0;
}
