/* gpu/cpu.h — cpu backend internals exposed for tests and the benchmark:
 * the portable kernels (the reference the AVX-512 ones must match bit for
 * bit) and the choice among them.  The kernels' contract is
 * gpu/cpu_kernels.h. */
#ifndef DTC_CPU_H
#define DTC_CPU_H

#include "gpu/cpu_kernels.h"

/* The portable kernel: the reference the others must match bit for bit. */
void dtc_cpu_flags(const struct dtc_consts *k, const float *p, const float *m, const float *v,
		   int nw, uint64_t *out);

/* The kernel the scan uses: the fastest one this CPU runs, unless the
 * environment says DTC_CPU_SIMD=generic. */
dtc_cpu_flags_fn dtc_cpu_flags_best(void);

/* The portable detect block, and the one the backend uses: chosen like
 * dtc_cpu_flags_best(). */
uint64_t dtc_cpu_detect_block(const struct dtc_consts *k, const float *p, const float *m,
			      const float *v, int nw, const uint64_t *mark, uint64_t pos,
			      int64_t dbase, int64_t dstride, int csum, struct dtc_cpu_emit *s);
dtc_cpu_detect_fn dtc_cpu_detect_best(void);

/* The portable row kernels (the reference) and the ones the backend uses:
 * chosen like dtc_cpu_flags_best(). */
extern const struct dtc_cpu_runs dtc_cpu_runs_generic;
const struct dtc_cpu_runs *dtc_cpu_runs_best(void);

#endif
