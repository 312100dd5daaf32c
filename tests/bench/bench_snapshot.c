/* bench_snapshot: the snapshot-diff baseline's detect cost (job_snapshot.c)
 * over N FP32 master weights: compare RNE(θ) with the kept BF16 version,
 * flag differences, keep the new version.  The step is a deterministic
 * perturbation of 1e-4 relative (a few percent of BF16 values
 * cross a rounding boundary, like an AdamW step at lr 1e-6).
 * Usage: bench_snapshot [N].  Output line:
 *     snapshot: elements=N scan_s=S changed=C kept_mb=K
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/job_snapshot.h"
#include "gpu/backend.h"

#define REPS 3

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (1ull << 27), words, cnt = 0;
	struct dte_box_map e;
	struct jsnap s = { 0 };
	double best = 1e30;
	uint64_t *bm;
	float *p;

	if (n < 64 || n > (1ull << 34)) {
		fprintf(stderr, "bench_snapshot: N must be in 64..2^34\n");
		return 2;
	}
	memset(&e, 0, sizeof(e));
	e.ndim = 1;
	e.extent[0] = (int64_t)n;
	e.src_stride[0] = e.dst_stride[0] = 1;
	words = dtc_bitmap_words(&e);
	p = malloc(n * sizeof(*p));
	bm = calloc(words, sizeof(*bm));
	if (!p || !bm) {
		fprintf(stderr, "bench_snapshot: cannot allocate %.1f GiB\n", (double)n * 4 / (1 << 30));
		return 1;
	}
	for (uint64_t i = 0; i < n; i++)
		p[i] = (float)((double)dtc_mix64(i) / 18446744073709551616.0 - 0.5) * 0.04f;
	if (jsnap_scan(&s, dtc_backend_cpu(), &e, p, n, bm, words, &cnt) != DTC_OK)
		return 1;
	for (int r = 0; r < REPS; r++) {
		double t;

		for (uint64_t i = 0; i < n; i++)
			p[i] *= (dtc_mix64(i + (uint64_t)r * n) & 1) ? 1.0f + 1e-4f : 1.0f - 1e-4f;
		memset(bm, 0, words * sizeof(*bm));
		t = now();
		if (jsnap_scan(&s, dtc_backend_cpu(), &e, p, n, bm, words, &cnt) != DTC_OK) {
			fprintf(stderr, "bench_snapshot: scan failed\n");
			return 1;
		}
		t = now() - t;
		if (t < best)
			best = t;
	}
	printf("snapshot: elements=%llu scan_s=%.4f changed=%llu kept_mb=%.0f\n",
	       (unsigned long long)n, best, (unsigned long long)cnt, (double)n * 2 / 1048576.0);
	jsnap_fini(&s);
	free(bm);
	free(p);
	return 0;
}
