/* bench_detect_once: dted's detect alone over a trainer's own memory, for
 * the end-to-end floor (tests/bench/bench_e2e.py).  The trainer passes its
 * three memfds (θ, m, v: same size, same layout) and the step it just
 * took; this maps them read-only and runs dtc_detect() with the checksum
 * over all of it as one box, as the daemon's capture does per entry: one
 * warm-up round (the mapping's first touch), then ROUNDS timed ones.  The
 * bench runs it on the source's core right before each version's publish,
 * so the floor is measured on the same memory, step and machine minute as
 * the sync it is compared with.
 *
 * Usage: bench_detect_once FD_THETA FD_M FD_V LR STEP [WEIGHT_DECAY]
 * Prints: detect-once: elements=N changed=C best_s=S median_s=M
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include "gpu/backend.h"
#include "gpu/compute.h"

#define ROUNDS 3

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const float *map_fd(int fd, size_t *bytes)
{
	struct stat st;
	void *p;

	if (fstat(fd, &st) < 0 || st.st_size <= 0)
		return NULL;
	*bytes = (size_t)st.st_size;
	p = mmap(NULL, *bytes, PROT_READ, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

int main(int argc, char **argv)
{
	struct dtc_hparams hp = { 1e-6, 0.9, 0.999, 1e-8, 0.01, 1, DTC_VARIANT_TORCH };
	struct dte_box_map e = { 1, { 0 }, 0, { 1 }, 0, { 1 } };
	struct dtc_bytes pay = { 0 };
	struct dtc_consts k;
	struct dtc_src src;
	size_t bp, bm, bv;
	const float *p, *m, *v;
	double t[ROUNDS], best = 1e30, tmp;
	uint64_t n, count = 0, csum = 0;

	if (argc < 6) {
		fprintf(stderr, "usage: bench_detect_once FD_THETA FD_M FD_V LR STEP [WD]\n");
		return 2;
	}
	p = map_fd(atoi(argv[1]), &bp);
	m = map_fd(atoi(argv[2]), &bm);
	v = map_fd(atoi(argv[3]), &bv);
	hp.lr = strtod(argv[4], NULL);
	hp.step = strtoll(argv[5], NULL, 0);
	if (argc > 6)
		hp.weight_decay = strtod(argv[6], NULL);
	if (!p || !m || !v || bp != bm || bp != bv) {
		fprintf(stderr, "bench_detect_once: three memfds of one size wanted\n");
		return 1;
	}
	if (dtc_hparams_derive(&hp, &k, NULL, 0) != DTC_OK) {
		fprintf(stderr, "bench_detect_once: hyperparameters refused\n");
		return 1;
	}
	n = bp / 4;
	e.extent[0] = (int64_t)n;
	src = (struct dtc_src){ p, m, v, n };
	for (int r = -1; r < ROUNDS; r++) {
		double t0 = now();

		pay.n = 0;
		if (dtc_detect(dtc_backend_cpu(), &e, &k, &src, NULL, 0, &pay, &count, &csum) !=
		    DTC_OK) {
			fprintf(stderr, "bench_detect_once: detect failed\n");
			return 1;
		}
		if (r >= 0) {
			t[r] = now() - t0;
			if (t[r] < best)
				best = t[r];
		}
	}
	for (int i = 0; i < ROUNDS; i++)	/* median of three */
		for (int j = i + 1; j < ROUNDS; j++)
			if (t[j] < t[i]) {
				tmp = t[i];
				t[i] = t[j];
				t[j] = tmp;
			}
	printf("detect-once: elements=%llu changed=%llu best_s=%.4f median_s=%.4f csum=%016llx\n",
	       (unsigned long long)n, (unsigned long long)count, best, t[ROUNDS / 2],
	       (unsigned long long)csum);
	free(pay.p);
	return 0;
}
