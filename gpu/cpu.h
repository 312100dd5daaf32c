/* gpu/cpu.h — cpu backend internals exposed for tests and the benchmark. */
#ifndef DTC_CPU_H
#define DTC_CPU_H

#include <stdint.h>
#include "gpu/elem.h"

/* Verdicts (dtc_adamw_flag) for nw <= 16 words of 64 consecutive
 * elements, one bitmap word each. */
void dtc_cpu_flags(const struct dtc_consts *k, const float *p, const float *m, const float *v,
		   int nw, uint64_t *out);

#endif
