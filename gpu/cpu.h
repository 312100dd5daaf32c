/* gpu/cpu.h — cpu backend internals exposed for tests and the benchmark. */
#ifndef DTC_CPU_H
#define DTC_CPU_H

#include <stdint.h>
#include "gpu/elem.h"

/* Verdicts for 64 consecutive elements as one bitmap word. */
uint64_t dtc_cpu_flags64(const struct dtc_consts *k, const float *p, const float *m,
			 const float *v);

#endif
