/* gpu/backend.h — choosing a compute backend.
 *
 * The daemon asks once for the backend to use: "cuda" when the plugin
 * (dte-cuda.so, static cudart) loads and reports a device, otherwise "cpu".
 * dted never links libcuda; the plugin is dlopen()ed here.
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

#endif
