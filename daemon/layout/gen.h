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

/* FSDP2 trainer (source): every tensor dim-0 sharded over dp ranks.
 * rule: for a plan only, the pieces and buffers kept as their rule
 * (struct dte_layout's rule; `spec` must outlive the layout), and no
 * runtime tensors. */
struct dte_fsdp_cfg {
	int64_t dp;
	int     rule;
};

/* SGLang / vLLM inference replica (sink). ep: expert parallel size for
 * FusedMoE; must divide tp (the rest of tp becomes MoE tensor parallel). */
struct dte_infer_cfg {
	int64_t tp, ep;
	int64_t fp8;    /* 1: linear weights held FP8 with 128 x 128 block scales */
	int64_t dp;     /* vLLM: engines of a data-parallel group sharing the experts */
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

/* Registered shards (gen_shards.c): a source buffer described by the
 * trainer-side parameter it shards (name, TP-local shape) and the
 * contiguous range [lo, hi) of that parameter's row-major flattened
 * elements it holds.  θ, m and v of a shard are three buffers with ids
 * 3k, 3k+1, 3k+2 (k: the shard's index among its rank's shards, in table
 * order).  `group` is the optimizer group whose hyper-parameters (and step
 * count) the publish gives for it. */
struct dte_shard {
	uint32_t rank, group, ndim;
	int64_t  lo, hi;
	int64_t  shape[DTE_MAX_DIMS];
	char     name[DTE_LAYOUT_NAME_MAX];
};

#define DTE_SHARD_MAX_GROUPS 65536

/* Parses a shard table: one shard per line,
 *     <rank> <group> <lo> <hi> <name> <d0>[,<d1>...]
 * (blank lines and lines starting with '#' skipped).  *out is malloc'd
 * (free it); 0, or -1 naming the line. */
int dte_shards_parse(const char *text, struct dte_shard **out, size_t *n, char *err,
		     size_t errlen);

/* Trainers that register shards: "mcore:tp=,dp=[,ep=,etp=]" (Megatron-Core
 * names and TP-local shapes, ranks as gen_megatron.c numbers them) and
 * "fsdp2:dp=" (HF names and shapes, FSDP2 dim-0 shards or any other ranges).
 * The layout has tp*dp (dp) ranks; a rank without shards has no buffers. */
struct dte_shards_cfg {
	int     megatron;             /* 1: mcore names; 0: HF names */
	struct dte_megatron_cfg mg;   /* megatron only (dist_opt ignored) */
	int64_t ranks;
};
int dte_layout_shards(struct dte_layout *l, const struct dte_spec *spec,
		      const struct dte_shards_cfg *cfg, const struct dte_shard *s, size_t n,
		      char *err, size_t errlen);
/* gen_megatron.c: 0 when Megatron-Core can run this model at cfg's
 * parallel sizes, else -1 naming what does not divide what. */
int dte_megatron_check(const struct dte_spec *spec, const struct dte_megatron_cfg *cfg,
		       char *err, size_t errlen);
/* gen_megatron.c: the pieces of rank `rank`'s shards s[0..n) (all of that
 * rank), whose param buffers have ids bufid[i]. */
int dte_megatron_shard_pieces(struct dte_layout *l, const struct dte_spec *spec,
			      const struct dte_megatron_cfg *cfg, uint32_t rank,
			      const struct dte_shard *s, size_t n, const uint32_t *bufid,
			      char *err, size_t errlen);

/* Internal to the generators: formatted error, returns -1. */
int dte_layout_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Formats a box as "[lo0:hi0, lo1:hi1]" into buf. */
const char *dte_layout_box_str(char *buf, size_t len, uint32_t ndim,
			       const int64_t *lo, const int64_t *hi);

#endif
