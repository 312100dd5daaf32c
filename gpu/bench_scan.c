/* bench-scan: detect over 2^27 elements held in memory (θ, m, v in FP32,
 * 1.5 GiB) against the streaming-read bandwidth of the same bytes measured
 * in the same run by a plain multi-threaded sum.  "detect" is dtc_detect()
 * as the daemon calls it: the one-pass op, encoded payload included,
 * without and with the entry checksum; the two-pass kernels (scan, then
 * sparse from the bitmap) are timed alongside for comparison.  The inputs
 * are one simulated AdamW step (lr 1e-6 unless given), so a realistic few
 * percent of elements change.  Usage: bench_scan [N [lr [memfd]]]; with
 * memfd the arrays live in memfds mapped shared, the pages the daemon
 * reads on the CPU path (a trainer's), instead of anonymous memory.
 * Final lines:
 *     scan-csum: elements=N GBps=X ratio_with_csum=R csum_ratio=C cpu_csum_ratio=D
 *     scan: elements=N GBps=X stream_GBps=Y ratio=Z
 * ratio: detect (no checksum) throughput over 12 B/element divided by the
 * stream bandwidth.  The phases run in turn, a warm-up round and then
 * REPS rounds; each round gives one ratio (stream time over detect time,
 * seconds apart), and the figure is their median: on a machine shared with
 * other jobs both speeds drift by tens of percent within a minute, and a
 * round's two phases see the same neighbours, where the best of each
 * alone may pair a stream from a quiet moment with a detect from a busy
 * one.  The best times (and their ratio, best_ratio) are printed too; the
 * best detect is the floor other benchmarks divide by.
 * csum_ratio: what the checksum costs, detect with it over detect without
 * (the median of the rounds' ratios, the two detects timed back to back);
 * cpu_csum_ratio the same over the best process CPU times (issue #18's
 * goal: at most 1.10).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include "gpu/backend.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

#define REPS 9

static double clock_s(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best wall time and best process CPU time (all threads) of a phase.  On
 * a machine shared with other jobs the wall clock also counts time our
 * threads sat descheduled; CPU time does not (a core stalled on memory
 * still counts), so the CPU-time ratio is the steadier view of per-element
 * cost next to the wall-clock one the goal is stated in. */
struct phase {
	double wall, cpu, w0, c0, last;
};

static void phase_start(struct phase *ph)
{
	ph->w0 = clock_s(CLOCK_MONOTONIC);
	ph->c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

static void phase_stop(struct phase *ph)
{
	double w = clock_s(CLOCK_MONOTONIC) - ph->w0, c = clock_s(CLOCK_PROCESS_CPUTIME_ID) - ph->c0;

	ph->last = w;
	if (w < ph->wall)
		ph->wall = w;
	if (c < ph->cpu)
		ph->cpu = c;
}

struct job {
	float *p, *m, *v;
	uint64_t lo, hi, sum;
	int prefetch;
	const struct dtc_consts *k;
};

/* Roughly N(0, 1): the sum of four uniforms on (-1, 1) (Irwin-Hall, the
 * bulk of a bell at a fraction of Box-Muller's cost), scaled to unit
 * variance. */
static float gauss(uint64_t i, uint64_t salt)
{
	uint64_t a = dtc_mix64(i * 4 + salt * 0x9e3779b97f4a7c15ull);
	uint64_t b = dtc_mix64(a);
	double s = (double)(a >> 32) + (double)(a & 0xffffffffu) + (double)(b >> 32) +
		   (double)(b & 0xffffffffu);

	return (float)((s / 4294967296.0 - 2.0) * 0.8660254037844386);
}

/* The model the end-to-end bench trains (tests/bench/bench_e2e.py): θ ~
 * N(0, 0.02²), gradients N(0, 1e-3²), torch AdamW (weight decay 0.01);
 * the moments of two steps, θ_t from θ_{t-1} by the forward in torch's
 * FP32 order, so the scan sees what a trainer's step 2 leaves. */
static void *fill(void *arg)
{
	struct job *j = arg;

	for (uint64_t i = j->lo; i < j->hi; i++) {
		float g = gauss(i, 1) * 1e-3f, g0 = gauss(i, 2) * 1e-3f;
		float prev = gauss(i, 3) * 0.02f;

		j->m[i] = 0.9f * (0.1f * g0) + 0.1f * g;
		j->v[i] = 0.999f * (0.001f * g0 * g0) + 0.001f * g * g;
		j->p[i] = dtc_adamw_forward(j->k, prev, j->m[i], j->v[i]);
	}
	return NULL;
}

/* Streaming read of the three arrays: 64-bit integer sums vectorize
 * without reassociating floating point; built for the widest vectors the
 * CPU has, like the scan.  It runs twice a round, plain and with the same
 * software prefetch the scan uses (one line per array 3 KiB ahead, into
 * L2), and the faster counts, so the baseline is the best plain read. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void *stream(void *arg)
{
	struct job *j = arg;
	const uint64_t *a = (const uint64_t *)j->p, *b = (const uint64_t *)j->m,
		       *c = (const uint64_t *)j->v;
	uint64_t s = 0, i = j->lo / 2;

	if (j->prefetch) {
		for (; i + 8 <= j->hi / 2; i += 8) {
			__builtin_prefetch((const void *)((uintptr_t)(a + i) + 3072), 0, 2);
			__builtin_prefetch((const void *)((uintptr_t)(b + i) + 3072), 0, 2);
			__builtin_prefetch((const void *)((uintptr_t)(c + i) + 3072), 0, 2);
			for (int q = 0; q < 8; q++)
				s += a[i + q] + b[i + q] + c[i + q];
		}
	}
	for (; i < j->hi / 2; i++)
		s += a[i] + b[i] + c[i];
	j->sum = s;
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *x, int n)
{
	qsort(x, (size_t)n, sizeof(*x), cmp_double);
	return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

/* n bytes: anonymous, or a memfd mapped shared where dted would map a
 * trainer's buffer (dtc_spread_hint(): left to the kernel, three mappings
 * of one size land exactly their size apart, and the scan measured 1.5x
 * slower over those than over the daemon's placement of the same pages). */
static void *alloc_array(size_t n, int memfd)
{
	static uint64_t maps;
	void *p;
	int fd;

	if (!memfd)
		return aligned_alloc(64, n);
	if ((fd = memfd_create("bench-scan", MFD_CLOEXEC)) < 0)
		return NULL;
	if (ftruncate(fd, (off_t)n) < 0) {
		close(fd);
		return NULL;
	}
	p = mmap(dtc_spread_hint(++maps), n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static void free_array(void *p, size_t n, int memfd)
{
	if (memfd)
		munmap(p, n);
	else
		free(p);
}

static void run_threads(void *(*fn)(void *), struct job *jobs, int nt)
{
	pthread_t tid[16];

	for (int i = 1; i < nt; i++)
		pthread_create(&tid[i], NULL, fn, &jobs[i]);
	fn(&jobs[0]);
	for (int i = 1; i < nt; i++)
		pthread_join(tid[i], NULL);
}

/* A dense part's source read: the checksum pass then the extract (two
 * reads of θ) against dtc_dense_extract_csum (one), same output and sum,
 * best and median of REPS rounds each, wall and CPU time. */
static int dense_probe(const struct dtc_backend *cpu, const struct dte_box_map *e,
		       const float *p, uint64_t n)
{
	struct phase two = { 1e30, 1e30, 0, 0, 0 }, one = two;
	double t_two[REPS], t_one[REPS];
	uint16_t *out = malloc(n * 2), *out2 = malloc(n * 2);
	uint64_t s_two = 0, s_one = 0;

	if (!out || !out2) {
		fprintf(stderr, "bench-scan: cannot allocate the dense output\n");
		return -1;
	}
	memset(out, 0, n * 2);	/* touched: a capture's part buffers are reused */
	memset(out2, 0, n * 2);
	for (int r = -1; r < REPS; r++) {
		phase_start(&two);
		if (dtc_checksum_entry(cpu, e, p, n, &s_two) != DTC_OK ||
		    dtc_dense_extract(cpu, e, p, n, out) != DTC_OK)
			return -1;
		phase_stop(&two);
		phase_start(&one);
		if (dtc_dense_extract_csum(cpu, e, p, n, out2, &s_one) != DTC_OK)
			return -1;
		phase_stop(&one);
		if (r < 0) {	/* warm-up */
			two.wall = two.cpu = one.wall = one.cpu = 1e30;
			continue;
		}
		t_two[r] = two.last;
		t_one[r] = one.last;
	}
	if (s_two != s_one || memcmp(out, out2, n * 2)) {
		fprintf(stderr, "bench-scan: fused dense extract disagrees with extract + checksum\n");
		return -1;
	}
	printf("scan-dense: elements=%llu twopass_s=%.4f fused_s=%.4f median_twopass_s=%.4f "
	       "median_fused_s=%.4f cpu_twopass_s=%.4f cpu_fused_s=%.4f fused_ratio=%.2f\n",
	       (unsigned long long)n, two.wall, one.wall, median(t_two, REPS), median(t_one, REPS),
	       two.cpu, one.cpu, median(t_one, REPS) / median(t_two, REPS));
	free(out);
	free(out2);
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t n = (uint64_t)1 << 27, words, count = 0, out = 0, sink = 0, dcount = 0, ccount = 0;
	uint64_t csum = 0, csum_ref = 0;
	struct dtc_hparams hp = { 1e-6, 0.9, 0.999, 1e-8, 0.01, 2, DTC_VARIANT_TORCH };
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct phase st = { 1e30, 1e30, 0, 0, 0 }, p1 = st, p2 = st, two = st, det = st, detc = st;
	struct dtc_bytes pay = { 0 };
	double bytes, r_det[REPS], r_csum[REPS], t_st[REPS], t_det[REPS], t_csum[REPS], r_cc[REPS];
	double ratio, ratio_csum;
	struct job jobs[16];
	struct dtc_consts k;
	struct dtc_src src;
	struct dte_box_map e = { 1, { 0 }, 0, { 1 }, 0, { 1 } };
	uint64_t *bitmap, *pos;
	uint16_t *val;
	float *p, *m, *v;
	int nt = (int)sysconf(_SC_NPROCESSORS_ONLN), memfd = 0;

	if (argc > 1)
		n = strtoull(argv[1], NULL, 0);
	if (argc > 2)
		hp.lr = strtod(argv[2], NULL);
	if (argc > 3)
		memfd = strcmp(argv[3], "memfd") == 0;
	if (nt < 1 || nt > 16)
		nt = nt < 1 ? 1 : 16;
	n = n / 128 * 128;
	e.extent[0] = (int64_t)n;
	words = (n + 63) / 64;
	p = alloc_array(n * 4, memfd);
	m = alloc_array(n * 4, memfd);
	v = alloc_array(n * 4, memfd);
	bitmap = aligned_alloc(64, words * 8);
	pos = malloc(n / 4 * 8);	/* room for 25% changed */
	val = malloc(n / 4 * 2);
	if (!p || !m || !v || !bitmap || !pos || !val) {
		fprintf(stderr, "bench-scan: cannot allocate %.1f GiB\n", (double)n * 12 / 1073741824.0);
		return 1;
	}
	if (dtc_hparams_derive(&hp, &k, NULL, 0) != DTC_OK)
		return 1;
	for (int i = 0; i < nt; i++)
		jobs[i] = (struct job){ p, m, v, n / (uint64_t)nt * (uint64_t)i,
					i == nt - 1 ? n : n / (uint64_t)nt * (uint64_t)(i + 1), 0, 0, &k };
	run_threads(fill, jobs, nt);
	src = (struct dtc_src){ p, m, v, n };
	bytes = (double)n * 12;

	for (int r = -1; r < REPS; r++) {
		if (r == 0)	/* the warm-up round (first touch of the outputs) does not count */
			st.wall = st.cpu = det.wall = det.cpu = detc.wall = detc.cpu = p1.wall =
				p1.cpu = p2.wall = p2.cpu = two.wall = two.cpu = 1e30;
		for (int pf = 0; pf < 2; pf++) {
			double prev = st.last;

			for (int i = 0; i < nt; i++)
				jobs[i].prefetch = pf;
			phase_start(&st);
			run_threads(stream, jobs, nt);
			phase_stop(&st);
			if (pf && prev < st.last)
				st.last = prev;
			for (int i = 0; i < nt; i++)
				sink += jobs[i].sum;
		}

		pay.n = 0;
		phase_start(&det);
		if (dtc_detect(cpu, &e, &k, &src, NULL, 0, &pay, &dcount, NULL) != DTC_OK) {
			fprintf(stderr, "bench-scan: detect failed\n");
			return 1;
		}
		phase_stop(&det);
		pay.n = 0;
		phase_start(&detc);
		if (dtc_detect(cpu, &e, &k, &src, NULL, 0, &pay, &ccount, &csum) != DTC_OK) {
			fprintf(stderr, "bench-scan: detect failed\n");
			return 1;
		}
		phase_stop(&detc);

		phase_start(&two);
		phase_start(&p1);
		if (dtc_scan(cpu, &e, &k, &src, bitmap, words, DTC_SCAN_SET, &count) != DTC_OK) {
			fprintf(stderr, "bench-scan: scan failed\n");
			return 1;
		}
		phase_stop(&p1);
		phase_start(&p2);
		if (dtc_sparse_from_bitmap(cpu, &e, bitmap, words, p, n, pos, val, n / 4, &out) != DTC_OK) {
			fprintf(stderr, "bench-scan: sparse failed (over 25%% changed?)\n");
			return 1;
		}
		phase_stop(&p2);
		phase_stop(&two);
		if (r >= 0) {
			t_st[r] = st.last;
			t_det[r] = det.last;
			t_csum[r] = detc.last;
			r_det[r] = st.last / det.last;
			r_csum[r] = st.last / detc.last;
			r_cc[r] = detc.last / det.last;
		}
	}
	ratio = median(r_det, REPS);
	ratio_csum = median(r_csum, REPS);
	/* the one-pass op must have found what the two passes did */
	if (dtc_checksum_entry(cpu, &e, p, n, &csum_ref) != DTC_OK || dcount != count ||
	    ccount != count || csum != csum_ref) {
		fprintf(stderr, "bench-scan: detect disagrees with scan/checksum_entry\n");
		return 1;
	}
	printf("scan-detail: threads=%d memory=%s lr=%g changed=%llu (%.3f%%) payload_bytes=%zu "
	       "detect_s=%.4f detect_csum_s=%.4f twopass_s=%.4f (scan %.4f, sparse %.4f) "
	       "stream_s=%.4f pass1_ratio=%.2f best_ratio=%.2f rounds=%d median_detect_s=%.4f "
	       "median_detect_csum_s=%.4f median_stream_s=%.4f sink=%llx\n",
	       nt, memfd ? "memfd" : "anon", hp.lr, (unsigned long long)count,
	       100.0 * (double)count / (double)n, pay.n,
	       det.wall, detc.wall, two.wall, p1.wall, p2.wall, st.wall, st.wall / p1.wall,
	       st.wall / det.wall, REPS, median(t_det, REPS), median(t_csum, REPS),
	       median(t_st, REPS), (unsigned long long)(sink & 0xf));
	printf("scan-cpu: core_ns_per_element: stream=%.3f detect=%.3f detect_csum=%.3f scan=%.3f "
	       "sparse=%.3f cpu_ratio=%.2f cpu_ratio_with_csum=%.2f\n",
	       st.cpu / (double)n * 1e9, det.cpu / (double)n * 1e9, detc.cpu / (double)n * 1e9,
	       p1.cpu / (double)n * 1e9, p2.cpu / (double)n * 1e9, st.cpu / det.cpu,
	       st.cpu / detc.cpu);
	/* GBps: the median rounds' speeds; ratio: the median round's ratio */
	printf("scan-csum: elements=%llu GBps=%.2f ratio_with_csum=%.2f csum_ratio=%.3f "
	       "cpu_csum_ratio=%.3f\n", (unsigned long long)n, bytes / median(t_csum, REPS) / 1e9,
	       ratio_csum, median(r_cc, REPS), detc.cpu / det.cpu);
	printf("scan: elements=%llu GBps=%.2f stream_GBps=%.2f ratio=%.2f\n", (unsigned long long)n,
	       bytes / median(t_det, REPS) / 1e9, bytes / median(t_st, REPS) / 1e9, ratio);
	if (dense_probe(cpu, &e, p, n) < 0)
		return 1;
	free(pay.p);
	free_array(p, n * 4, memfd);
	free_array(m, n * 4, memfd);
	free_array(v, n * 4, memfd);
	free(bitmap);
	free(pos);
	free(val);
	return 0;
}
