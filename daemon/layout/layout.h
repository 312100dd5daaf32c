/* daemon/layout/layout.h — pieces and layouts.
 *
 * A piece says "these canonical elements live here": canonical tensor id, a
 * box [lo, hi) per dim, and the affine map
 *     buffer index = offset + sum_d (c_d - lo_d) * stride_d
 * into one buffer of one rank (element units, signed strides).  A source
 * piece names three buffers with that same map (param, exp_avg, exp_avg_sq)
 * and an optimizer group.  A layout is every piece and buffer of one side of
 * a job (all ranks of a trainer, or one inference replica).
 */
#ifndef DTE_LAYOUT_H
#define DTE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/entry.h"
#include "daemon/layout/spec.h"

#define DTE_LAYOUT_NAME_MAX 96

enum dte_layout_role { DTE_LAYOUT_SOURCE = 0, DTE_LAYOUT_SINK = 1 };

struct dte_piece {
	uint32_t tensor;                 /* canonical tensor id (spec) */
	uint32_t ndim;                   /* = the tensor's ndim */
	int64_t  lo[DTE_MAX_DIMS];
	int64_t  hi[DTE_MAX_DIMS];
	uint32_t rank;
	uint32_t buf;                    /* sink: the buffer; source: param */
	uint32_t buf_m, buf_v;           /* source: exp_avg, exp_avg_sq */
	uint32_t group;                  /* source: optimizer group */
	int64_t  offset;
	int64_t  stride[DTE_MAX_DIMS];
};

/* Names of buffers and runtime tensors are kept once per layout (a
 * name many ranks share is stored once) and live as long as the layout:
 * at most DTE_LAYOUT_NAME_MAX - 1 characters. */
struct dte_layout_buffer {
	uint32_t rank;
	uint32_t id;                     /* unique within the rank */
	int64_t  length;                 /* elements */
	const char *name;
};

/* A runtime tensor of one rank as that runtime names and allocates it
 * (Megatron's linear_qkv.weight, SGLang's qkv_proj.weight): row-major,
 * `offset` elements into buffer `buf` of the rank (a source's param,
 * exp_avg and exp_avg_sq buffers share the offset).  With Megatron's
 * distributed optimizer over dp > 1 a tensor can straddle DP shards: the
 * offset is relative to this shard's start and may lie outside it. */
struct dte_layout_tensor {
	uint32_t rank, buf, ndim;
	int64_t  offset;
	int64_t  shape[DTE_MAX_DIMS];
	const char *name;
};

/* A sink weight held as FP8 block-scaled (a sink layout with fp8=1):
 * buffer `buf` of `rank` holds float8_e4m3fn codes of `mats` row-major
 * [rows, cols] matrices (the rank's runtime tensor: MoE w13/w2 one per
 * local expert), with the same piece maps a BF16 sink has (one byte an
 * element), and buffer `scale_buf` holds their FP32 weight_scale_inv,
 * row-major [mats, ceil(rows/128), ceil(cols/128)] (vLLM
 * fp8_utils.create_fp8_scale_parameter, SGLang Fp8LinearMethod
 * create_fp8_weight_; FusedMoE: Fp8MoEMethod.create_weights).  Block
 * (i, j) of a matrix is block (lo0/128 + i', lo1/128 + j') of the
 * canonical tensor its piece maps there: dte_layout_fp8_check() makes
 * every piece of such a buffer sit on both block grids. */
#define DTE_FP8_BLOCK 128
struct dte_layout_fp8 {
	uint32_t rank, buf, scale_buf;
	int64_t  mats, rows, cols;
	/* The engine's quantizer (gpu/fp8.h enum dtc_fp8_flags): what the
	 * source computes the codes and scales with (daemon/job_capture.c). */
	uint32_t flags;
};

struct dte_layout_names;
struct dte_layout_rule;
struct dte_layout;

/* What a layout that keeps a rule (below) computes on demand: the
 * generator that made the rule (gen_fsdp.c) hands these down with it, so
 * layout.c calls the rule without calling up into a generator. */
struct dte_layout_rule_ops {
	const struct dte_piece *(*piece)(const struct dte_layout *l, size_t i,
					 struct dte_piece *tmp);
	uint32_t (*tensor)(const struct dte_layout *l, size_t i);
	const struct dte_layout_buffer *(*buffer)(const struct dte_layout *l, size_t i,
						  struct dte_layout_buffer *tmp);
	/* Index of the buffer (rank, id); SIZE_MAX: none. */
	size_t (*buffer_index)(const struct dte_layout *l, uint32_t rank, uint32_t id);
	void (*free)(struct dte_layout_rule *rule);
};

struct dte_layout {
	int                       role;  /* enum dte_layout_role */
	uint64_t                  spec_hash;
	uint32_t                  nranks;
	char                      desc[128];
	struct dte_piece         *pieces;
	size_t                    npieces, cap_pieces;
	struct dte_layout_buffer *bufs;
	size_t                    nbufs, cap_bufs;
	struct dte_layout_tensor *tensors;  /* generators that know them (not json:) */
	size_t                    ntensors, cap_tensors;
	struct dte_layout_names  *names;    /* the buffers' and tensors' names */
	/* A layout built for a plan only (dte_layout_from_desc_plan) may keep
	 * its pieces and buffers as the rule that gives them (fsdp:, every
	 * rank's dim-0 shard of every tensor) instead of the arrays: pieces
	 * and bufs are NULL, npieces and nbufs count them, dte_layout_piece()
	 * and dte_layout_buffer() compute them. */
	struct dte_layout_rule   *rule;
	const struct dte_layout_rule_ops *rule_ops;  /* with rule */
	int                       no_tensors;  /* for a plan only: runtime tensors not kept */
	struct dte_layout_fp8    *fp8;       /* sinks with fp8=1: the FP8 weights */
	size_t                    nfp8, cap_fp8;
};

void dte_layout_init(struct dte_layout *l, int role, uint64_t spec_hash);
void dte_layout_fini(struct dte_layout *l);
int  dte_layout_add_piece(struct dte_layout *l, const struct dte_piece *p);
/* Adds a buffer with this id, or (id < 0) the rank's next id; returns
 * the id or -1 on no memory. */
int64_t dte_layout_add_buffer(struct dte_layout *l, uint32_t rank, int64_t id, int64_t length,
			      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
int  dte_layout_add_tensor(struct dte_layout *l, uint32_t rank, uint32_t buf, int64_t offset,
			   uint32_t ndim, const int64_t *shape, const char *name);
/* For generators that name many buffers alike: the layout's own copy of
 * a name (NULL on no memory), which the _named calls take as it is. */
const char *dte_layout_name(struct dte_layout *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int64_t dte_layout_add_buffer_named(struct dte_layout *l, uint32_t rank, int64_t id, int64_t length,
				    const char *name);
int  dte_layout_add_tensor_named(struct dte_layout *l, uint32_t rank, uint32_t buf, int64_t offset,
				 uint32_t ndim, const int64_t *shape, const char *name);
int  dte_layout_add_fp8(struct dte_layout *l, const struct dte_layout_fp8 *f);
/* Every piece in an FP8 buffer on the 128 x 128 block grid of both its
 * canonical tensor and the rank's matrix (a ragged block only at the
 * canonical tensor's end), so that each block of the sink is one block of
 * one canonical tensor; -1 with the first piece that is not, and why. */
int  dte_layout_fp8_check(const struct dte_layout *l, const struct dte_spec *spec, char *err,
			  size_t errlen);
/* What a sink's FP8 weights ask of a source (dtectl plan's fp8 line):
 * how many canonical blocks of the FP8-held tensors no single source
 * piece holds whole.  The FP8 detect (gpu/fp8.h) computes a block's scale
 * from all of its elements, so a source can send FP8 only for blocks it
 * holds whole; split blocks need the BF16 on the sink's side. */
struct dte_layout_fp8_use {
	uint64_t weights;       /* FP8 weight buffers */
	uint64_t codes;         /* their elements (one byte each) */
	uint64_t scales;        /* their scale elements (four bytes each) */
	uint64_t tensors;       /* canonical tensors held FP8 */
	uint64_t blocks;        /* their 128 x 128 blocks */
	uint64_t split;         /* of those, held whole by no source piece */
};
int dte_layout_fp8_use(const struct dte_layout *src, const struct dte_layout *sink,
		       const struct dte_spec *spec, struct dte_layout_fp8_use *out);
/* The FP8 record of buffer (rank, buf); NULL when it holds BF16. */
const struct dte_layout_fp8 *dte_layout_fp8_find(const struct dte_layout *l, uint32_t rank,
						 uint32_t buf);
/* The 16-bit units a client registers buffer (rank, id) as, and a sink
 * moves (issue 33): an FP8 weight's codes two to a unit (its bytes / 2),
 * its FP32 scales as their halves (2 a scale), any other buffer its
 * elements.  -1 for an FP8 buffer of odd length. */
int64_t dte_layout_units(const struct dte_layout *l, uint32_t rank, uint32_t id, int64_t length);

/* Room for this many more pieces, buffers and tensors (0: no more). */
int  dte_layout_reserve(struct dte_layout *l, size_t pieces, size_t bufs, size_t tensors);
/* Generators call this once done: lookups want buffers sorted by (rank, id). */
void dte_layout_sort_buffers(struct dte_layout *l);
const struct dte_layout_buffer *dte_layout_buffer_find(const struct dte_layout *l,
						       uint32_t rank, uint32_t id);
/* The same for any layout (NULL: none): a rule's buffer is computed into
 * *tmp.  dte_layout_buffer_find finds none in a layout that keeps a rule. */
const struct dte_layout_buffer *dte_layout_buffer_get(const struct dte_layout *l, uint32_t rank,
						      uint32_t id, struct dte_layout_buffer *tmp);

/* For generators and plans: memory about to be written all through (a
 * large array just allocated) is faulted in by one call, not a trap per
 * page; small ranges are left alone. */
void dte_layout_prefault(void *mem, size_t len);

/* Piece i and buffer i of a layout: in the array, or, for a layout that
 * keeps a rule, computed into *tmp (its rule_ops).  A piece's tensor alone
 * is cheaper to ask for. */
static inline const struct dte_piece *dte_layout_piece(const struct dte_layout *l, size_t i,
						       struct dte_piece *tmp)
{
	return l->rule ? l->rule_ops->piece(l, i, tmp) : &l->pieces[i];
}

static inline uint32_t dte_layout_piece_tensor(const struct dte_layout *l, size_t i)
{
	return l->rule ? l->rule_ops->tensor(l, i) : l->pieces[i].tensor;
}

static inline const struct dte_layout_buffer *dte_layout_buffer(const struct dte_layout *l, size_t i,
								struct dte_layout_buffer *tmp)
{
	return l->rule ? l->rule_ops->buffer(l, i, tmp) : &l->bufs[i];
}

/* Carries a layout a generator made on the spec's runtime view
 * (dte_spec_runtime) over to the canonical spec: every piece of an FP32
 * tensor gets the trailing half dim [0, 2) at stride 1, its other strides
 * and its offset doubled, so it addresses 16-bit units.  A sink's buffer
 * holding such a tensor is registered as 16-bit units (length doubled, its
 * runtime tensors' offsets too) and may hold nothing else; a source's
 * buffers stay FP32 elements (the halves of θ, read as 16-bit units).
 * -1 with why. */
int dte_layout_halves(struct dte_layout *l, const struct dte_spec *spec, char *err,
		      size_t errlen);
/* 2 for a source piece of an FP32 tensor (its map is in 16-bit units of
 * an FP32 buffer), 1 otherwise. */
static inline int dte_piece_units(const struct dte_layout *l, const struct dte_spec *spec,
				  const struct dte_piece *p)
{
	return l->role == DTE_LAYOUT_SOURCE && p->tensor < spec->n &&
	       dte_spec_is_halves(spec, p->tensor) ? 2 : 1;
}

/* Number of elements in a piece's box. */
int64_t dte_piece_volume(const struct dte_piece *p);
/* Intersect two boxes of ndim dims; returns the volume (0: empty). */
int64_t dte_box_intersect(uint32_t ndim, const int64_t *alo, const int64_t *ahi,
			  const int64_t *blo, const int64_t *bhi,
			  int64_t *olo, int64_t *ohi);

/* Decompose the row-major flat range [a, b) of a tensor of this shape into
 * at most 2*ndim-1 boxes; returns the count, -1 on a bad range. */
int dte_layout_flat_boxes(uint32_t ndim, const int64_t *shape, int64_t a, int64_t b,
			  int64_t lo[][DTE_MAX_DIMS], int64_t hi[][DTE_MAX_DIMS]);

/* Checks a layout on its own: pieces name real tensors with in-range
 * boxes, map inside their (declared) buffers, and no two pieces write the
 * same buffer element.  Returns 0 or -1 with the reason. */
int dte_layout_validate(const struct dte_layout *l, const struct dte_spec *spec,
			char *err, size_t errlen);

/* "megatron:tp=2,dp=4", "fsdp:dp=8", "sglang:tp=4,ep=2", "vllm:tp=8",
 * "json:FILE" → layout.  Role picks which side the string describes. */
int dte_layout_from_desc(struct dte_layout *l, const struct dte_spec *spec,
			 const char *desc, int role, char *err, size_t errlen);
/* The same, for a source that registers shards ("mcore:", "fsdp2:"):
 * `shards` is the shard table of every rank known (gen.h,
 * dte_shards_parse); NULL or "" gives a layout of ranks without buffers. */
int dte_layout_from_desc_shards(struct dte_layout *l, const struct dte_spec *spec,
				const char *desc, int role, const char *shards, char *err,
				size_t errlen);
/* The same, for a plan and nothing else (`dtectl plan`): the layout may
 * keep its pieces and buffers as a rule (see struct dte_layout: read them
 * with dte_layout_piece, dte_layout_buffer, dte_layout_buffer_get) and
 * has no runtime tensors.  `spec` must outlive it.  Every count, buffer
 * and piece is the one dte_layout_from_desc_shards gives. */
int dte_layout_from_desc_plan(struct dte_layout *l, const struct dte_spec *spec,
			      const char *desc, int role, const char *shards, char *err,
			      size_t errlen);
/* 1 when the description is one whose buffers come from a shard table. */
int dte_layout_desc_sharded(const char *desc);

/* The layout kinds dte_layout_from_desc knows (desc.c's table, which its
 * parser reads): "name:key=value,..." with exactly these keys (defaults
 * when left out); json takes a file name instead.  For `dtectl plan
 * --supported` and the errors naming them. */
#define DTE_LAYOUT_KIND_MAX_KEYS 5
struct dte_layout_kind {
	const char *name;
	int         role;       /* enum dte_layout_role */
	int         sharded;    /* buffers from a shard table (--shards) */
	int         file;       /* "json:FILE" */
	const char *runtime;    /* what the layout is of */
	size_t      nkeys;
	const char *keys[DTE_LAYOUT_KIND_MAX_KEYS];
	int64_t     defaults[DTE_LAYOUT_KIND_MAX_KEYS];
};
const struct dte_layout_kind *dte_layout_kinds(size_t *n);
/* Parallelisms no layout has: a key of this name is refused (with what it
 * is) unless its value is 1; the listing prints them as refused. */
struct dte_layout_refused {
	const char *key;
	const char *what;
};
const struct dte_layout_refused *dte_layout_refused_keys(size_t *n);

#endif
