/* gpu/cpu.h — cpu backend internals exposed for tests and the benchmark. */
#ifndef DTC_CPU_H
#define DTC_CPU_H

#include <stdint.h>
#include "gpu/elem.h"

/* Bitmap words one call of a flags kernel decides at most. */
#define DTC_CPU_BLOCK_WORDS 16

/* Verdicts (dtc_adamw_flag) for nw <= DTC_CPU_BLOCK_WORDS words of 64
 * consecutive elements, one bitmap word each. */
typedef void (*dtc_cpu_flags_fn)(const struct dtc_consts *k, const float *p, const float *m,
				 const float *v, int nw, uint64_t *out);

/* The portable kernel: the reference the others must match bit for bit. */
void dtc_cpu_flags(const struct dtc_consts *k, const float *p, const float *m, const float *v,
		   int nw, uint64_t *out);

/* The AVX-512 kernel (gpu/cpu_avx512.c), or NULL where this build or this
 * CPU cannot run it. */
dtc_cpu_flags_fn dtc_cpu_flags_avx512(void);

/* The kernel the scan uses: the fastest one this CPU runs, unless the
 * environment says DTC_CPU_SIMD=generic. */
dtc_cpu_flags_fn dtc_cpu_flags_best(void);

#endif
