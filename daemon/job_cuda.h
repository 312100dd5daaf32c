/* daemon/job_cuda.h — the sync engine's GPU path (docs/SYNC.md).
 *
 * Buffers registered as CUDA IPC handles are opened once, at registration,
 * by the cuda backend: their dbuf.ptr is then a device pointer.  The
 * engine's host code stays as it is; the kernel calls it makes go through
 * the jdev_* wrappers below, which run on the cpu backend for host memory
 * and on the cuda backend for opened device memory, staging host-side
 * inputs and outputs (bitmaps, positions, values) through device scratch.
 * Which memory a pointer is comes from the table of opened ranges, so a
 * pointer the engine got from anywhere else is always treated as host.
 *
 * Ordering (DESIGN §4): the trainer records its interprocess event after
 * each optimizer step and before publish; capture makes every device read
 * wait for that record (jcuda_wait) instead of the trainer syncing.
 * Capture and apply return once their device work is done, so the trainer
 * may step again when publish returns.
 */
#ifndef DTED_JOB_CUDA_H
#define DTED_JOB_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/buf.h"
#include "gpu/compute.h"

struct dtc_backend;

/* The backend for device memory (NULL or cpu: no GPU path). */
void jcuda_init(const struct dtc_backend *be);
/* Frees device scratch (daemon exit; buffers are closed by dbuf_fini). */
/* The process's device path and buffer registry are shared by its
 * engines: set up by the first jcuda_init, ended by the last jcuda_fini,
 * which returns 1 then (the caller ends the buffer registry, dbuf_fini),
 * else 0. */
int jcuda_fini(void);

/* buf.c reaches these two through struct dbuf_dev_ops (buf.h), which
 * jcuda_init installs.  Open b's IPC handle (and event, when event_len)
 * and check [offset, offset + length) against the allocation: b->ptr is
 * the device address of the first element.  A negative errno with the
 * reason (daemon/derr.h). */
int jcuda_buf_open(struct dbuf *b, const void *handle, size_t handle_len, const void *event,
		   size_t event_len, uint64_t offset, char *err, size_t errlen);
void jcuda_buf_close(struct dbuf *b);

/* 1 when p lies in an opened device buffer. */
int jcuda_is_dev(const void *p);

/* Later device reads of b wait for the trainer's latest event record. */
int jcuda_wait(const struct dbuf *b);

/* gpu/compute.h's calls with host-side outputs/inputs for device sources
 * or destinations; plain cpu-backend calls for host memory. */
int jdev_scan(const struct dte_box_map *e, const struct dtc_consts *k, const struct dtc_src *s,
	      uint64_t *bitmap, uint64_t words, int mode, uint64_t *count);
int jdev_sparse_from_bitmap(const struct dte_box_map *e, const uint64_t *bitmap, uint64_t words,
			    const float *param, uint64_t param_len, uint64_t *pos, uint16_t *val,
			    uint64_t cap, uint64_t *n);
int jdev_dense_extract(const struct dte_box_map *e, const float *param, uint64_t param_len,
		       uint16_t *out);
int jdev_checksum_entry(const struct dte_box_map *e, const float *param, uint64_t param_len,
			uint64_t *sum);
int jdev_scatter_apply(const struct dte_box_map *e, const uint64_t *pos, const uint16_t *val,
		       uint64_t n, uint16_t *dst, uint64_t dst_len);
int jdev_dense_apply(const struct dte_box_map *e, const uint16_t *vals, uint16_t *dst,
		     uint64_t dst_len);
int jdev_checksum_box(const struct dte_box_map *e, const uint16_t *dst, uint64_t dst_len,
		      uint64_t *sum);
/* Host memory only (DTC_EINVAL for a device destination): the sink's
 * payload kernels, which apply (and swap, for undo) straight from the
 * received bytes. */
int jdev_sparse_apply_payload(const struct dte_box_map *e, const uint8_t *in, size_t len,
			      uint16_t *dst, uint64_t dst_len, uint64_t *count, uint64_t *delta);
int jdev_sparse_swap_payload(const struct dte_box_map *e, uint8_t *in, size_t len, uint16_t *dst,
			     uint64_t dst_len, uint64_t *count, uint64_t *delta);
int jdev_sparse_readback_payload(const struct dte_box_map *e, const uint8_t *in, size_t len,
				 const uint16_t *dst, uint64_t dst_len, uint64_t *count,
				 uint64_t *delta);
int jdev_dense_swap_payload(const struct dte_box_map *e, uint8_t *in, size_t len, uint16_t *dst,
			    uint64_t dst_len, uint64_t *sum_new);
/* The backend for host memory, for the host-only steps that take one
 * (a snapshot scan, detect, the fused dense extract).  This file is the
 * one place the engine chooses host or device compute: the daemon picks
 * the device backend once (main.c, jcuda_init), every engine file goes
 * through jdev_* (tests/system/engine_api.sh checks that no other engine
 * object names a backend). */
const struct dtc_backend *jdev_host(void);

#endif
