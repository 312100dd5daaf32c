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

#endif
