/* bench-gpu: detect (scan + sparse) on the cuda backend over 2^28 elements
 * of θ, m, v in device memory, against device-to-device copy bandwidth
 * measured in the same run.  Copy bandwidth counts bytes read + written;
 * the scan reads 12 B/element.  Then the sink side: scatter-apply of the
 * detected changes into a BF16 copy of the box in device memory, against a
 * dense apply of every element, same run.  Usage: bench_gpu <path to
 * dte-cuda.so>.  Lines:
 *     scan-gpu: elements=N GBps=X copy_GBps=Y ratio=Z
 *     scatter-gpu: changes=C ms=T Gchanges_per_s=R dense_apply_ms=D sparse_vs_dense=S */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	uint64_t n = (uint64_t)1 << 28, chunk = (uint64_t)1 << 24, words, count = 0, out = 0;
	struct dtc_hparams hp = { 1e-6, 0.9, 0.999, 1e-8, 0.1, 2, DTC_VARIANT_TORCH };
	struct dte_box_map e = { 1, { 0 }, 0, { 1 }, 0, { 1 } };
	const struct dtc_backend *gpu;
	const struct dtc_backend_ops *o;
	double best = 1e30, scan_best = 0, copy_ms = 0, bytes;
	float *hp_, *hm, *hv, *dp, *dm, *dv;
	uint64_t *dbm, *dpos;
	uint16_t *dval, *ddst, *dvals;
	struct dtc_consts k;
	struct dtc_src src;
	char why[512];

	gpu = dtc_backend_load("cuda", argc > 1 ? argv[1] : NULL, why, sizeof(why));
	if (strcmp(dtc_backend_name(gpu), "cuda") != 0) {
		printf("bench-gpu: no CUDA device: %s\n", why);
		return 2;
	}
	o = gpu->ops;
	dtc_hparams_derive(&hp, &k, NULL, 0);
	e.extent[0] = (int64_t)n;
	words = (n + 63) / 64;
	dp = o->mem_alloc(n * 4);
	dm = o->mem_alloc(n * 4);
	dv = o->mem_alloc(n * 4);
	dbm = o->mem_alloc(words * 8);
	dpos = o->mem_alloc(n / 4 * 8);
	dval = o->mem_alloc(n / 4 * 2);
	ddst = o->mem_alloc(n * 2);
	dvals = o->mem_alloc(n * 2);
	hp_ = malloc(chunk * 4);
	hm = malloc(chunk * 4);
	hv = malloc(chunk * 4);
	if (!dp || !dm || !dv || !dbm || !dpos || !dval || !ddst || !dvals || !hp_ || !hm || !hv) {
		fprintf(stderr, "bench-gpu: allocation failed\n");
		return 1;
	}
	/* one simulated AdamW step, uploaded in chunks */
	for (uint64_t c = 0; c < n; c += chunk) {
		for (uint64_t i = 0; i < chunk; i++) {
			uint64_t h = dtc_mix64(c + i);
			float g = ((float)(h & 0xffff) / 32768.0f - 1.0f) * 1e-3f;
			float prev = ((float)(h >> 48) / 32768.0f - 1.0f) * 0.02f;

			hm[i] = 0.1f * g;
			hv[i] = 0.001f * g * g;
			hp_[i] = dtc_adamw_forward(&k, prev, hm[i], hv[i]);
		}
		o->mem_copy(dp + c, hp_, chunk * 4, 0);
		o->mem_copy(dm + c, hm, chunk * 4, 0);
		o->mem_copy(dv + c, hv, chunk * 4, 0);
	}
	src = (struct dtc_src){ dp, dm, dv, n };
	for (int r = 0; r < 5; r++) {
		double t0 = now(), t1, t2;

		if (dtc_scan(gpu, &e, &k, &src, dbm, words, DTC_SCAN_SET, &count) != DTC_OK) {
			fprintf(stderr, "bench-gpu: scan failed\n");
			return 1;
		}
		t1 = now();
		if (dtc_sparse_from_bitmap(gpu, &e, dbm, words, dp, n, dpos, dval, n / 4, &out) != DTC_OK) {
			fprintf(stderr, "bench-gpu: sparse failed\n");
			return 1;
		}
		t2 = now();
		/* first round warms the plugin's scratch */
		if (r > 0 && t2 - t0 < best) {
			best = t2 - t0;
			scan_best = t1 - t0;
		}
	}
	/* copy m over v: same buffers, bytes read + written per copy = 2 * n * 4 */
	o->time_copy(dv, dm, n * 4, 10, &copy_ms);
	bytes = (double)n * 12;
	{
		double copy_gbps = 2.0 * (double)n * 4 * 10 / (copy_ms / 1e3) / 1e9;
		double gbps = bytes / best / 1e9;

		printf("scan-gpu-detail: device=%s changed=%llu (%.3f%%) detect_ms=%.3f (scan %.3f, "
		       "sparse %.3f) copy_ms=%.3f\n", dtc_backend_device(gpu), (unsigned long long)count,
		       100.0 * (double)count / (double)n, best * 1e3, scan_best * 1e3,
		       (best - scan_best) * 1e3, copy_ms / 10);
		printf("scan-gpu: elements=%llu GBps=%.1f copy_GBps=%.1f ratio=%.2f\n",
		       (unsigned long long)n, gbps, copy_gbps, gbps / copy_gbps);
	}
	/* Sink side: the detected changes scattered into a BF16 box, and a
	 * dense apply of the whole box for scale (each call returns once the
	 * device is done). */
	{
		double sc = 1e30, dn = 1e30;

		o->mem_set(ddst, 0, n * 2);
		o->mem_set(dvals, 0, n * 2);
		for (int r = 0; r < 6; r++) {
			double t0 = now(), t1, t2;

			if (dtc_scatter_apply(gpu, &e, dpos, dval, out, ddst, n) != DTC_OK) {
				fprintf(stderr, "bench-gpu: scatter failed\n");
				return 1;
			}
			t1 = now();
			if (dtc_dense_apply(gpu, &e, dvals, ddst, n) != DTC_OK) {
				fprintf(stderr, "bench-gpu: dense apply failed\n");
				return 1;
			}
			t2 = now();
			if (r > 0 && t1 - t0 < sc)
				sc = t1 - t0;
			if (r > 0 && t2 - t1 < dn)
				dn = t2 - t1;
		}
		printf("scatter-gpu: changes=%llu ms=%.3f Gchanges_per_s=%.2f dense_apply_ms=%.3f "
		       "sparse_vs_dense=%.3f\n", (unsigned long long)out, sc * 1e3,
		       (double)out / sc / 1e9, dn * 1e3, sc / dn);
	}
	return 0;
}
