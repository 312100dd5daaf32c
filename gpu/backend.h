/* gpu/backend.h — choosing a compute backend.
 *
 * The daemon asks once for the backend to use: "cuda" when the plugin
 * (dte-cuda.so, static cudart) loads and reports a device, otherwise "cpu".
 * dted never links libcuda; the plugin is dlopen()ed here.  It is looked
 * for at $DTE_CUDA_PLUGIN, else next to the library or program that holds
 * this code, else in ../lib relative to the running program.
 */
#ifndef DTC_BACKEND_H
#define DTC_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/entry.h"

struct dtc_backend;

/* Select and cache the backend (thread-safe; first call decides).
 * `prefer` is "auto", "cpu" or "cuda"; NULL means "auto".  When "cuda" is
 * preferred but unusable, falls back to cpu and says why in `why` (may be
 * NULL).  Never returns NULL. */
const struct dtc_backend *dtc_backend_get(const char *prefer, char *why, unsigned whylen);

/* "cpu" or "cuda". */
const char *dtc_backend_name(const struct dtc_backend *be);

/* One line about the device ("host, 2 threads", "NVIDIA H200 (sm_90)"). */
const char *dtc_backend_device(const struct dtc_backend *be);

/* The cpu backend, always available. */
const struct dtc_backend *dtc_backend_cpu(void);

/* Uncached selection, for tests and tools: like dtc_backend_get() but
 * `plugin_path` (may be NULL) overrides the search.  The cuda backend, once
 * loaded, stays loaded for the life of the process. */
const struct dtc_backend *dtc_backend_load(const char *prefer, const char *plugin_path,
					   char *why, unsigned whylen);

/* ---- device memory and CUDA IPC (gpu/backend_dev.c) ----
 * For the engine's GPU path: buffers other processes registered as CUDA
 * IPC handles, and device staging for capture and apply.  On a backend
 * without device memory (cpu) these return DTC_EINVAL / NULL.  dir of
 * dtc_dev_copy: 0 host->device, 1 device->host, 2 device->device; every
 * call returns once its result is usable. */
int dtc_dev_has(const struct dtc_backend *be);
void *dtc_dev_alloc(const struct dtc_backend *be, uint64_t bytes);
void dtc_dev_free(const struct dtc_backend *be, void *p);
int dtc_dev_copy(const struct dtc_backend *be, void *dst, const void *src, uint64_t bytes, int dir);

/* Map a cudaIpcMemHandle_t (64 bytes): *base the allocation's first byte,
 * *bytes what lies from there to its end.  The same handle opened again
 * shares the mapping; every open needs one close. */
int dtc_dev_ipc_open(const struct dtc_backend *be, const void *handle, size_t len, void **base,
		     uint64_t *bytes);
void dtc_dev_ipc_close(const struct dtc_backend *be, void *base);

/* A cudaIpcEventHandle_t (64 bytes) another process records; wait makes
 * every later device op of this process wait for its latest record. */
int dtc_dev_event_open(const struct dtc_backend *be, const void *handle, size_t len, void **ev);
int dtc_dev_event_wait(const struct dtc_backend *be, void *ev);
void dtc_dev_event_close(const struct dtc_backend *be, void *ev);
/* The other direction: an event this process records (after its capture
 * kernels) for another process's stream to wait on; handle receives its
 * cudaIpcEventHandle_t (len >= 64).  Record returns at once. */
int dtc_dev_event_export(const struct dtc_backend *be, void **ev, void *handle, size_t len);
int dtc_dev_event_record(const struct dtc_backend *be, void *ev);
void dtc_dev_event_destroy(const struct dtc_backend *be, void *ev);

/* Σ mix(dst index, dst[dst index]) over the box: what a destination holds
 * where the entry writes (the sink's check after apply).  dst is host
 * memory on cpu, device memory on cuda; the box is checked against
 * dst_len first. */
int dtc_checksum_box(const struct dtc_backend *be, const struct dte_box_map *e,
		     const uint16_t *dst, uint64_t dst_len, uint64_t *sum);

#endif
