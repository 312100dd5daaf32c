/* gpu/backend_ops.h — what a compute backend implements (internal).
 *
 * compute.c validates entries, lengths and hyper-parameters on the host and
 * then calls these with pointers the backend understands (host for cpu,
 * device for cuda).  Positions and bitmaps may live on the device, so the
 * checks that read them (scatter's position check) belong to the backend.
 * This struct is also the ABI of the cuda plugin (gpu/plugin.h): append
 * fields, never reorder. */
#ifndef DTC_BACKEND_OPS_H
#define DTC_BACKEND_OPS_H

#include <stdint.h>
#include "gpu/entry.h"
#include "gpu/elem.h"

struct dtc_bytes;

struct dtc_backend_ops {
	int (*scan)(const struct dte_box_map *e, const struct dtc_consts *k,
		    const float *param, const float *m, const float *v,
		    uint64_t *bitmap, int mode, uint64_t *count);
	int (*sparse_from_bitmap)(const struct dte_box_map *e, const uint64_t *bitmap,
				  const float *param, uint64_t *pos, uint16_t *val,
				  uint64_t cap, uint64_t *n);
	int (*dense_extract)(const struct dte_box_map *e, const float *param, uint16_t *out);
	int (*scatter)(const struct dte_box_map *e, const uint64_t *pos, const uint16_t *val,
		       uint64_t n, uint16_t *dst);
	int (*dense_apply)(const struct dte_box_map *e, const uint16_t *vals, uint16_t *dst);
	int (*checksum_buffer)(const uint16_t *buf, uint64_t len, uint64_t *sum);
	int (*checksum_entry)(const struct dte_box_map *e, const float *param, uint64_t *sum);

	/* Device memory (NULL for host backends).  dir: 0 host->device,
	 * 1 device->host, 2 device->device.  Synchronous. */
	void *(*mem_alloc)(uint64_t bytes);
	void (*mem_free)(void *p);
	int (*mem_copy)(void *dst, const void *src, uint64_t bytes, int dir);
	int (*mem_set)(void *dst, int byte, uint64_t bytes);
	/* Milliseconds of device time for `iters` copies of `bytes` (bench). */
	int (*time_copy)(void *dst, const void *src, uint64_t bytes, int iters, double *ms);
	void (*fini)(void);

	/* --- ABI 2: the engine's GPU path (NULL for host backends, but cpu
	 * implements checksum_box: the sink's verification on host memory) --- */
	/* Σ mix(dst index, dst[dst index]) over the box: a sink's content where
	 * the entry writes, checked after apply. */
	int (*checksum_box)(const struct dte_box_map *e, const uint16_t *dst, uint64_t *sum);
	/* Map another process's allocation from its cudaIpcMemHandle (`len`
	 * bytes): *base its first byte, *bytes its size, so registrations can
	 * be checked against it.  A handle already open yields the same mapping
	 * with one more reference; ipc_close drops one. */
	int (*ipc_open)(const void *handle, uint64_t len, void **base, uint64_t *bytes);
	int (*ipc_close)(void *base);
	/* An interprocess event (cudaIpcEventHandle): open (shared and counted
	 * like memory handles), make every later op wait for its latest record,
	 * close. */
	int (*event_open)(const void *handle, uint64_t len, void **ev);
	int (*event_wait)(void *ev);
	void (*event_close)(void *ev);

	/* --- host backends only (NULL in the cuda plugin; dtc_detect() reads
	 * it only for a backend without mem_alloc) --- */
	/* dtc_detect() in one pass over θ, m, v: the entry was checked and
	 * merged (BOX_SRC, and BOX_DST when csum is not NULL); mark is NULL or
	 * covers the box.  Appends the payload to out; count and csum as there. */
	int (*detect)(const struct dte_box_map *e, const struct dtc_consts *k, const float *param,
		      const float *m, const float *v, const uint64_t *mark,
		      struct dtc_bytes *out, uint64_t *count, uint64_t *csum);

	/* --- ABI 3: the two-way handshake of a publish that does not stop
	 * the trainer (NULL for host backends) --- */
	/* An event this process records and another process waits on:
	 * created with cudaEventInterprocess | cudaEventDisableTiming, its
	 * cudaIpcEventHandle_t written to handle (len >= 64 bytes). */
	int (*event_export)(void **ev, void *handle, uint64_t len);
	/* Record ev after every op enqueued so far (the legacy default stream
	 * the ops run on); returns at once, no host synchronisation. */
	int (*event_record)(void *ev);
	void (*event_destroy)(void *ev);

	/* --- host backends only (dtc_dense_swap_payload reads it only for a
	 * host backend; NULL in the cuda plugin) --- */
	/* Trade the BF16 payload in[] (box order, box coalesced BOX_DST) with
	 * the elements of dst the injective map e names, and *sum = Σ mix over
	 * the box of what dst then holds: dtc_dense_swap_payload in one pass. */
	int (*dense_swap)(const struct dte_box_map *e, uint16_t *in, uint16_t *dst, uint64_t *sum);
	/* --- host backends only, read only for one (NULL in the cuda
	 * plugin) --- */
	/* dtc_dense_extract_csum_each in one read of θ (the entry checked and
	 * merged with BOX_SRC | BOX_DST): out as dense_extract, *sum as
	 * checksum_entry; done, when not NULL, is handed the output in order,
	 * each run once it is written. */
	int (*dense_extract_csum)(const struct dte_box_map *e, const float *param, uint16_t *out,
				  uint64_t *sum,
				  void (*done)(void *arg, const uint16_t *p, uint64_t n), void *arg);
};

struct dtc_backend {
	const char *name;
	const struct dtc_backend_ops *ops;
	char device[128];	/* human-readable device description */
};

/* A backend on host memory (no mem_alloc): the one-pass and host-only ops
 * are read only for one; a backend with device memory (cuda) takes the
 * device pointers of its own API instead. */
static inline int dtc_host_backend(const struct dtc_backend *be)
{
	return be && be->ops && !be->ops->mem_alloc;
}

/* The cpu backend's ops (gpu/cpu.c). */
extern const struct dtc_backend_ops dtc_cpu_ops;

#endif
