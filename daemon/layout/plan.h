/* daemon/layout/plan.h — transfer plans: source pieces intersected with
 * sink pieces, validated, grouped per (source node -> sink node) link.
 *
 * Entries are computed for one sink replica; a plan for N replicas of the
 * same sink layout reuses them (replica r's ranks are the same, its nodes
 * shifted), and every entry names a detection: entries with the same source
 * piece and canonical box (replicated norms, replicated KV heads, replicas)
 * share one detection pass over the source.
 *
 * A plan keeps 16 bytes per entry (struct dte_plan_item) and borrows the
 * two layouts it was built from; dte_plan_entry() writes an entry out
 * (ranks, buffers, box, map, link, detection) from them.  A plan only
 * counted (dte_plan_count) keeps no entry.
 */
#ifndef DTE_PLAN_H
#define DTE_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/entry.h"
#include "daemon/layout/layout.h"
#include "daemon/layout/spec.h"

#define DTE_PLAN_DEFAULT_RANKS_PER_NODE 8

/* Largest entry, in elements: a bigger intersection is cut into slabs of
 * whole rows (of the outermost dimension that allows it), so a capture
 * can send a large tensor's payload in parts while it still detects the
 * rest, and its per-entry scratch stays a few MiB. */
#define DTE_PLAN_ENTRY_MAX ((int64_t)1 << 24)
/* The cut in use: DTE_PLAN_ENTRY_MAX.  Only a program that holds every
 * engine of a job (tests/bench/bench_fanout_fixture.c: a tiny model's
 * entries cut as a large model's are, relative to its size) sets another,
 * before any plan; every member of a job must plan with the same cut. */
extern int64_t dte_plan_entry_max;

struct dte_plan_opts {
	uint32_t sink_replicas;    /* 0 means 1 */
	uint32_t ranks_per_node;   /* 0 means DTE_PLAN_DEFAULT_RANKS_PER_NODE */
};

/* One entry, written out: what dte_plan_entry() fills in. */
struct dte_plan_entry {
	uint32_t tensor;           /* canonical tensor id */
	uint32_t src_piece;        /* index into the source layout's pieces */
	uint32_t src_rank, src_buf, src_buf_m, src_buf_v, group;
	uint32_t sink_piece;       /* index into the sink layout's pieces */
	uint32_t sink_rank, sink_buf;
	uint32_t link;             /* replica 0's link; replica r: + r * nlinks */
	uint32_t detect;           /* shared detection id */
	int64_t  lo[DTE_MAX_DIMS]; /* canonical box origin (extent in map) */
	struct dte_box_map map;    /* src: param/exp_avg/exp_avg_sq; dst: sink_buf */
};

/* What a plan keeps per entry: the two pieces (everything else of the
 * entry follows from them and the box) and the detection.  The box is the
 * pieces' intersection, or, for a slab of one cut at DTE_PLAN_ENTRY_MAX,
 * cuts[cut - 1]. */
struct dte_plan_item {
	uint32_t src_piece, sink_piece;
	uint32_t detect;
	uint32_t cut;              /* 0: the whole intersection */
};

struct dte_plan_cut {
	int64_t lo[DTE_MAX_DIMS], hi[DTE_MAX_DIMS];
};

struct dte_plan_link {
	uint32_t src_node, sink_node;
	uint64_t entries, elements;
};

struct dte_plan {
	struct dte_plan_item  *items;      /* n: read them with dte_plan_entry(); NULL: dte_plan_count */
	size_t                 n;          /* entries of one replica */
	struct dte_plan_cut   *cuts;
	size_t                 ncuts;
	const struct dte_layout *src, *sink;  /* the layouts built from: must outlive the plan */
	struct dte_plan_link  *links;      /* nlinks per replica, replicas in order */
	size_t                 nlinks;     /* links of one replica */
	size_t                 ndetect;
	uint32_t               sink_replicas, ranks_per_node;
	uint32_t               src_nodes, sink_nodes;  /* sink_nodes per replica */
	int64_t                elements;   /* sink elements of one replica */
	int64_t                detect_elements; /* source elements scanned once */
	size_t                 shared_entries;  /* entries of one replica sharing a detection with another */
};

/* Builds and validates; returns 0, or -1 with the reason (naming tensor and
 * box for a gap or an overlap). *plan needs dte_plan_fini only on success. */
int dte_plan_build(struct dte_plan *plan, const struct dte_spec *spec,
		   const struct dte_layout *src, const struct dte_layout *sink,
		   const struct dte_plan_opts *opts, char *err, size_t errlen);
/* The same plan counted (n, detections, links, elements) without its
 * entries, for a caller that prints none (`dtectl plan` without
 * --dump-entries; 128 MB at fsdp:dp=64 of Qwen3-235B): items is NULL and
 * dte_plan_entry() not to be called, unless the links had to be counted
 * from the entries (more node pairs than plan.c's table holds). */
int dte_plan_count(struct dte_plan *plan, const struct dte_spec *spec,
		   const struct dte_layout *src, const struct dte_layout *sink,
		   const struct dte_plan_opts *opts, char *err, size_t errlen);
/* How a plan entry into an FP8 buffer (f) moves: as two entries of 16-bit
 * units that the source computes from the entry's element box with the
 * engine's quantizer (f->flags) and everything below the capture carries
 * as any 16-bit entry (staging, apply, the verify that reads memory,
 * undo, storage):
 *  - codes: the box's [R, C] codes as [R, C/2] units of the codes buffer,
 *    two adjacent codes of a row to a unit, the first in its low byte
 *    (the bytes' memory order on a little-endian host);
 *  - scales: its blocks' scales as [ceil(R/128), ceil(C/128), 2] units of
 *    the scale buffer, each scale's low half first.
 * Both maps' src_offset and src_stride[0..1] are the element box's, whose
 * extent is src_extent.  -1 with the reason when the box is not whole
 * 128 x 128 blocks of one sink matrix (a source piece or a plan slab
 * splits a block, so no source holds it whole) or a row has an odd
 * number of codes. */
struct dte_fp8_split {
	struct dte_box_map codes, scales;
	int64_t src_extent[2];
};
int dte_plan_fp8_split(const struct dte_layout_fp8 *f, const struct dte_plan_entry *pe,
		       const char *tensor, struct dte_fp8_split *out, char *err, size_t errlen);

void dte_plan_fini(struct dte_plan *plan);
/* Entry i (< plan->n) written out into *e (unused dims zero). */
void dte_plan_entry(const struct dte_plan *plan, size_t i, struct dte_plan_entry *e);

#endif
