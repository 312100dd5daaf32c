/* bench_snapshot: dted's detect against the two baselines, on the same
 * AdamW step.
 *
 * N elements of θ, m, v in FP32 hold one simulated torch AdamW step at lr
 * (1e-6 unless given; the same step gpu/bench_scan.c builds: the model of
 * tests/bench/bench_e2e.py, θ ~ N(0, 0.02²), gradients N(0, 1e-3²), weight
 * decay 0.01, step 2), and the BF16 of θ_{t-1} is what the sink holds.
 * Three ways to find what to send, each timed on both cores:
 *   dted      dtc_detect() as the daemon calls it (one pass over θ, m, v:
 *             the AdamW inverse with its derived error bound, the encoded
 *             payload included; no checksum), bytes = the payload as the
 *             default configuration sends it (zstd_level 0: raw);
 *   snapshot  jsnap_scan() (daemon/job_snapshot.c: the BF16 of θ_{t-1} kept
 *             in the daemon, compared with RNE(θ_t) and updated in place),
 *             flags exactly the changed elements;
 *   dte       the seed paper's method (AReaL-DTE): the AdamW inverse θ̂ and
 *             a fixed relative margin, an element sent when RNE(θ̂ ± 1e-4·|θ_t|)
 *             is not RNE(θ_t) at either end (or θ_t is not finite), as
 *             int32 index + BF16 value (6 B each, no compression).
 * The phases run in turn, a warm-up round and REPS rounds (the kept
 * snapshot restored before each, untimed); per round the ratios of the
 * times, and the figures are the median round's.  Output lines:
 *     baseline-dted: elements=N changed=C flagged=F bytes=B detect_s=S
 *     baseline-snapshot: flagged=F snapshot_s=S kept_mb=K
 *     baseline-dte: margin=1e-4 flagged=F bytes=B dte_s=S
 *     baseline: snapshot_detect_ratio=R dte_margin_bytes_ratio=R dte_detect_time_ratio=R
 * snapshot_detect_ratio = dted detect time / snapshot compare time (above
 * 1: the snapshot compare is faster); dte_margin_bytes_ratio = dte bytes /
 * dted bytes; dte_detect_time_ratio = dte time / dted detect time.
 * Usage: bench_snapshot [N [lr]].
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/job_snapshot.h"
#include "gpu/backend.h"
#include "gpu/compute.h"
#include "gpu/elem.h"

#define REPS 5
#define DTE_MARGIN 1e-4f
#define MAXT 16

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct job {
	float *p, *m, *v;
	uint16_t *kept;
	uint64_t lo, hi, count;
	const struct dtc_consts *k;
	uint32_t *idx;	/* dte output: int32 index + BF16 value */
	uint16_t *val;
	uint64_t cap;
};

/* gpu/bench_scan.c's step, element for element. */
static float gauss(uint64_t i, uint64_t salt)
{
	uint64_t a = dtc_mix64(i * 4 + salt * 0x9e3779b97f4a7c15ull);
	uint64_t b = dtc_mix64(a);
	double s = (double)(a >> 32) + (double)(a & 0xffffffffu) + (double)(b >> 32) +
		   (double)(b & 0xffffffffu);

	return (float)((s / 4294967296.0 - 2.0) * 0.8660254037844386);
}

static void *fill(void *arg)
{
	struct job *j = arg;

	j->count = 0;
	for (uint64_t i = j->lo; i < j->hi; i++) {
		float g = gauss(i, 1) * 1e-3f, g0 = gauss(i, 2) * 1e-3f;
		float prev = gauss(i, 3) * 0.02f;

		j->m[i] = 0.9f * (0.1f * g0) + 0.1f * g;
		j->v[i] = 0.999f * (0.001f * g0 * g0) + 0.001f * g * g;
		j->p[i] = dtc_adamw_forward(j->k, prev, j->m[i], j->v[i]);
		j->kept[i] = dtc_bf16_rne(prev);
		j->count += dtc_bf16_rne(j->p[i]) != j->kept[i];
	}
	return NULL;
}

/* AReaL-DTE's detection, as fast as a plain loop goes: 64 verdicts per
 * word through a fixed-length loop the compiler vectorizes (the inverse is
 * elem.h's, the margin replaces dted's derived bound), then the flagged
 * lanes emitted as (int32 index, BF16 value). */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void *dte(void *arg)
{
	struct job *j = arg;
	const struct dtc_consts *k = j->k;
	uint64_t n = 0;

	for (uint64_t w = j->lo; w < j->hi; w += 64) {
		uint8_t fl[64];
		uint64_t bits = 0;

		for (unsigned q = 0; q < 64; q++) {
			float th = j->p[w + q], u = dtc_adamw_u_torch(k, j->m[w + q], j->v[w + q]);
			float prev = dtc_adamw_prev(k, th, u), d = DTE_MARGIN * dtc_fabsf(th);
			uint16_t b = dtc_bf16_rne(th);

			fl[q] = (uint8_t)((dtc_bf16_rne(prev - d) != b) | (dtc_bf16_rne(prev + d) != b) |
					  !dtc_f32_finite(th));
		}
		/* 64 byte flags into a word (gpu/cpu.c's pack64) */
		for (int i = 0; i < 8; i++) {
			uint64_t x;

			memcpy(&x, fl + 8 * i, 8);
			bits |= ((x * 0x0102040810204080ull) >> 56) << (8 * i);
		}
		if (n + 64 > j->cap) {
			j->count = UINT64_MAX;
			return NULL;
		}
		while (bits) {
			unsigned q = (unsigned)__builtin_ctzll(bits);

			j->idx[n] = (uint32_t)(w + q);
			j->val[n++] = dtc_bf16_rne(j->p[w + q]);
			bits &= bits - 1;
		}
	}
	j->count = n;
	return NULL;
}

static void run_threads(void *(*fn)(void *), struct job *jobs, int nt)
{
	pthread_t tid[MAXT];

	for (int i = 1; i < nt; i++)
		pthread_create(&tid[i], NULL, fn, &jobs[i]);
	fn(&jobs[0]);
	for (int i = 1; i < nt; i++)
		pthread_join(tid[i], NULL);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(const double *in, int n)
{
	double x[REPS];

	memcpy(x, in, (size_t)n * sizeof(*x));
	qsort(x, (size_t)n, sizeof(*x), cmp_double);
	return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (1ull << 27), words;
	struct dtc_hparams hp = { 1e-6, 0.9, 0.999, 1e-8, 0.01, 2, DTC_VARIANT_TORCH };
	const struct dtc_backend *cpu = dtc_backend_cpu();
	double t_det[REPS], t_snap[REPS], t_dte[REPS], r_snap[REPS], r_dte[REPS];
	uint64_t changed = 0, det_cnt = 0, snap_cnt = 0, dte_cnt = 0, cap;
	int nt = (int)sysconf(_SC_NPROCESSORS_ONLN);
	struct dtc_bytes pay = { 0 };
	struct dte_box_map e;
	struct dtc_consts k;
	struct job jobs[MAXT];
	struct jsnap s = { 0 };
	uint16_t *kept0, *dval;
	uint32_t *didx;
	uint64_t *bm;
	float *p, *m, *v;

	if (argc > 2)
		hp.lr = strtod(argv[2], NULL);
	n = n / 64 * 64;
	if (n < 64 * MAXT || n > (1ull << 31)) {
		fprintf(stderr, "bench_snapshot: N must be in %d..2^31 (int32 indices)\n", 64 * MAXT);
		return 2;
	}
	nt = nt < 1 ? 1 : nt > MAXT ? MAXT : nt;
	if (dtc_hparams_derive(&hp, &k, NULL, 0) != DTC_OK)
		return 1;
	memset(&e, 0, sizeof(e));
	e.ndim = 1;
	e.extent[0] = (int64_t)n;
	e.src_stride[0] = e.dst_stride[0] = 1;
	words = dtc_bitmap_words(&e);
	cap = n / 4;	/* room for 25 % flagged */
	p = aligned_alloc(64, n * 4);
	m = aligned_alloc(64, n * 4);
	v = aligned_alloc(64, n * 4);
	kept0 = aligned_alloc(64, n * 2);
	s.vals = aligned_alloc(64, n * 2);
	s.n = n;
	bm = calloc(words, sizeof(*bm));
	didx = malloc(cap * sizeof(*didx));
	dval = malloc(cap * sizeof(*dval));
	if (!p || !m || !v || !kept0 || !s.vals || !bm || !didx || !dval) {
		fprintf(stderr, "bench_snapshot: cannot allocate %.1f GiB\n",
			(double)n * 16 / 1073741824.0);
		return 1;
	}
	for (int i = 0; i < nt; i++) {
		uint64_t lo = n / 64 / (uint64_t)nt * 64 * (uint64_t)i;
		uint64_t hi = i == nt - 1 ? n : n / 64 / (uint64_t)nt * 64 * (uint64_t)(i + 1);

		jobs[i] = (struct job){ p, m, v, kept0, lo, hi, 0, &k, didx + lo / 4, dval + lo / 4,
					(hi - lo) / 4 };
	}
	run_threads(fill, jobs, nt);
	for (int i = 0; i < nt; i++)
		changed += jobs[i].count;

	for (int r = -1; r < REPS; r++) {
		struct dtc_src src = { p, m, v, n };
		double t;

		pay.n = 0;
		t = now();
		if (dtc_detect(cpu, &e, &k, &src, NULL, 0, &pay, &det_cnt, NULL) != DTC_OK) {
			fprintf(stderr, "bench_snapshot: detect failed\n");
			return 1;
		}
		t = now() - t;
		if (r >= 0)
			t_det[r] = t;

		memcpy(s.vals, kept0, n * 2);	/* the sink holds θ_{t-1} again */
		memset(bm, 0, words * sizeof(*bm));
		t = now();
		if (jsnap_scan(&s, cpu, &e, p, n, bm, words, &snap_cnt) != DTC_OK) {
			fprintf(stderr, "bench_snapshot: snapshot scan failed\n");
			return 1;
		}
		t = now() - t;
		if (r >= 0)
			t_snap[r] = t;

		t = now();
		run_threads(dte, jobs, nt);
		t = now() - t;
		dte_cnt = 0;
		for (int i = 0; i < nt; i++) {
			if (jobs[i].count == UINT64_MAX) {
				fprintf(stderr, "bench_snapshot: dte flagged over 25%%\n");
				return 1;
			}
			dte_cnt += jobs[i].count;
		}
		if (r >= 0) {
			t_dte[r] = t;
			r_snap[r] = t_det[r] / t_snap[r];
			r_dte[r] = t_dte[r] / t_det[r];
		}
	}
	/* Every method must send at least what changed; the snapshot exactly. */
	if (snap_cnt != changed || det_cnt < changed || dte_cnt < changed) {
		fprintf(stderr, "bench_snapshot: changed %llu, snapshot %llu, dted %llu, dte %llu\n",
			(unsigned long long)changed, (unsigned long long)snap_cnt,
			(unsigned long long)det_cnt, (unsigned long long)dte_cnt);
		return 1;
	}
	printf("baseline-dted: elements=%llu lr=%g threads=%d changed=%llu flagged=%llu bytes=%zu "
	       "detect_s=%.4f\n", (unsigned long long)n, hp.lr, nt, (unsigned long long)changed,
	       (unsigned long long)det_cnt, pay.n, median(t_det, REPS));
	printf("baseline-snapshot: flagged=%llu snapshot_s=%.4f kept_mb=%.0f\n",
	       (unsigned long long)snap_cnt, median(t_snap, REPS), (double)n * 2 / 1048576.0);
	printf("baseline-dte: margin=%g flagged=%llu bytes=%llu dte_s=%.4f\n", (double)DTE_MARGIN,
	       (unsigned long long)dte_cnt, (unsigned long long)dte_cnt * 6, median(t_dte, REPS));
	printf("baseline: snapshot_detect_ratio=%.2f dte_margin_bytes_ratio=%.2f "
	       "dte_detect_time_ratio=%.2f\n", median(r_snap, REPS),
	       (double)dte_cnt * 6 / (double)pay.n, median(r_dte, REPS));
	free(pay.p);
	jsnap_fini(&s);
	free(p);
	free(m);
	free(v);
	free(kept0);
	free(bm);
	free(didx);
	free(dval);
	return 0;
}
