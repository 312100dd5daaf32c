/* gpu/plugin.h — the ABI between backend.c and the cuda plugin dte-cuda.so.
 *
 * The plugin is built by nvcc with cudart linked statically, so dted and
 * libdte never link libcuda/cudart: backend.c dlopen()s the plugin and
 * calls its one exported entry point.  Bump DTC_PLUGIN_ABI whenever
 * struct dtc_backend_ops or this signature changes incompatibly. */
#ifndef DTC_PLUGIN_H
#define DTC_PLUGIN_H

#include "gpu/backend_ops.h"

#define DTC_PLUGIN_ABI		3	/* 2: checksum_box, IPC memory and events;
					 * 3: event_export/record/destroy */
#define DTC_PLUGIN_SYMBOL	"dtc_cuda_plugin_open"
#define DTC_PLUGIN_FILE		"dte-cuda.so"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 0 with *ops set and `device` describing the GPU when one is
 * usable; otherwise a negative DTC_E* code with the reason in `why`. */
typedef int (*dtc_plugin_open_fn)(unsigned abi, const struct dtc_backend_ops **ops,
				  char *device, unsigned devlen, char *why, unsigned whylen);

int dtc_cuda_plugin_open(unsigned abi, const struct dtc_backend_ops **ops,
			 char *device, unsigned devlen, char *why, unsigned whylen);

#ifdef __cplusplus
}
#endif

#endif
