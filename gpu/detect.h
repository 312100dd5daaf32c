/* gpu/detect.h — dtc_detect() internals shared with the cpu backend and
 * the tests. */
#ifndef DTC_DETECT_H
#define DTC_DETECT_H

#include <stddef.h>
#include "gpu/compute.h"

#include "gpu/backend_ops.h"

/* Threads the cpu backend uses for large inputs (DTC_CPU_THREADS, else the
 * online CPUs; 1..16). */
int dtc_cpu_threads(void);

/* Make room for `more` bytes past b->n (realloc, doubling). */
int dtc_bytes_reserve(struct dtc_bytes *b, size_t more);

/* dtc_detect() composed from dtc_scan, dtc_sparse_from_bitmap,
 * dtc_sparse_encode and dtc_checksum_entry: the definition the one-pass
 * backend op must match byte for byte, and what runs without one. */
int dtc_detect_ref(const struct dtc_backend *be, const struct dte_box_map *e,
		   const struct dtc_consts *k, const struct dtc_src *src,
		   const uint64_t *mark, uint64_t mark_words,
		   struct dtc_bytes *out, uint64_t *count, uint64_t *csum);

#endif
