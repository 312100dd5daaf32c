/* daemon/layout/gen.h — layout generators for real runtimes.
 *
 * Each fills an initialised, empty dte_layout from a model spec and a
 * parallel config and returns 0, or -1 with the reason (an impossible
 * configuration names what does not divide what).  Rank numbering and the
 * buffer conventions each generator assumes are described in its .c file.
 */
#ifndef DTE_LAYOUT_GEN_H
#define DTE_LAYOUT_GEN_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/layout/layout.h"

/* Megatron-Core trainer (source). ep/etp only matter for MoE models;
 * etp = 0 means "same as tp" (Megatron's default). */
struct dte_megatron_cfg {
	int64_t tp, dp, ep, etp;
	int     dist_opt;   /* distributed optimizer: DP ranks own flat shards */
};

/* FSDP2 trainer (source): every tensor dim-0 sharded over dp ranks. */
struct dte_fsdp_cfg {
	int64_t dp;
};

/* SGLang / vLLM inference replica (sink). ep: expert parallel size for
 * FusedMoE; must divide tp (the rest of tp becomes MoE tensor parallel). */
struct dte_infer_cfg {
	int64_t tp, ep;
};

int dte_layout_megatron(struct dte_layout *l, const struct dte_spec *spec,
			const struct dte_megatron_cfg *cfg, char *err, size_t errlen);
int dte_layout_fsdp(struct dte_layout *l, const struct dte_spec *spec,
		    const struct dte_fsdp_cfg *cfg, char *err, size_t errlen);
int dte_layout_sglang(struct dte_layout *l, const struct dte_spec *spec,
		      const struct dte_infer_cfg *cfg, char *err, size_t errlen);
int dte_layout_vllm(struct dte_layout *l, const struct dte_spec *spec,
		    const struct dte_infer_cfg *cfg, char *err, size_t errlen);
/* Declarative pieces from a JSON file (format in gen_json.c). */
int dte_layout_load_json(struct dte_layout *l, const struct dte_spec *spec,
			 const char *path, char *err, size_t errlen);

/* Internal to the generators: formatted error, returns -1. */
int dte_layout_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Formats a box as "[lo0:hi0, lo1:hi1]" into buf. */
const char *dte_layout_box_str(char *buf, size_t len, uint32_t ndim,
			       const int64_t *lo, const int64_t *hi);

#endif
