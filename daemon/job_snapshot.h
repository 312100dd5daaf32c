/* daemon/job_snapshot.h — snapshot-diff detection (job option
 * `detect = snapshot`): the baseline that keeps the previous BF16 version
 * instead of inverting AdamW.  See job_snapshot.c. */
#ifndef DTE_JOB_SNAPSHOT_H
#define DTE_JOB_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/compute.h"

/* The BF16 values of one plan entry's box as last sent to its sink. */
struct jsnap {
	uint16_t *vals;           /* box_size values, canonical box order; NULL: none kept */
	uint64_t n;
};

/* OR into `bitmap` every box position whose BF16 value now differs from
 * the kept one, then keep the current values.  With nothing kept yet every
 * position is set.  `count` (may be NULL) gets the bitmap's population.
 * On error (bad entry, short bitmap, no memory) bitmap and kept values are
 * untouched. */
int jsnap_scan(struct jsnap *s, const struct dtc_backend *be, const struct dte_box_map *e,
	       const float *param, uint64_t param_len, uint64_t *bitmap, uint64_t words,
	       uint64_t *count);

/* Keep `vals` (n = box size), e.g. right after a dense capture sent them. */
int jsnap_keep(struct jsnap *s, const uint16_t *vals, uint64_t n);

/* Forget the kept values (re-plan, job end): the next scan sets all. */
void jsnap_fini(struct jsnap *s);

/* jsnap_fini of each of n, then free(s); NULL is fine. */
void jsnap_free_all(struct jsnap *s, size_t n);

#endif
