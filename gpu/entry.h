/* gpu/entry.h — one plan entry as the compute kernels see it.
 *
 * A box of canonical elements (row-major "canonical order" over `extent`),
 * and how box element (i_0..i_{n-1}) maps into the source buffers and into
 * one destination buffer:
 *     src index = src_offset + sum_d i_d * src_stride[d]
 *     dst index = dst_offset + sum_d i_d * dst_stride[d]
 * in elements of the buffer's dtype.  Strides may be negative or zero-free
 * permutations (transposed storage, fused/interleaved layouts); validation
 * of the resulting ranges against buffer lengths happens before any kernel
 * runs.  A box-relative position is the row-major linear index of
 * (i_0..i_{n-1}) within `extent`.
 *
 * Shared contract between the layout/plan code (daemon/layout) and the
 * compute kernels (gpu/).
 */
#ifndef DTE_ENTRY_H
#define DTE_ENTRY_H

#include <stdint.h>

#define DTE_MAX_DIMS 6

struct dte_box_map {
	uint32_t ndim;
	int64_t  extent[DTE_MAX_DIMS];
	int64_t  src_offset;
	int64_t  src_stride[DTE_MAX_DIMS];
	int64_t  dst_offset;
	int64_t  dst_stride[DTE_MAX_DIMS];
};

#endif
