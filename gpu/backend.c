/* Minimal backend selection: cpu only until the CUDA plugin loader lands. */
#include <stdio.h>
#include "gpu/backend.h"

struct dtc_backend {
	const char *name;
};

static const struct dtc_backend cpu_backend = { "cpu" };

const struct dtc_backend *dtc_backend_get(const char *prefer, char *why, unsigned whylen)
{
	if (why && whylen)
		snprintf(why, whylen, "%s", prefer && prefer[0] == 'c' && prefer[1] == 'u' ?
			 "cuda backend not built" : "");
	return &cpu_backend;
}

const char *dtc_backend_name(const struct dtc_backend *be)
{
	return be->name;
}
