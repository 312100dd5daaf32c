/* daemon/side_table.h — the published values of elements marked since a
 * publish (publish interval K > 1 without the union's false positives).
 *
 * With K > 1 the trainer marks every step between two publishes and the
 * pair's dirty bitmap ORs each step's changed set (DESIGN §2.6); the
 * publish sends every dirty element.  An element that changed and changed
 * back since the last publish is sent although the sink already holds its
 * value.  When a mark first flags an element since the last publish (its
 * dirty bit was 0), the step before this one had left its BF16 provably
 * unchanged since the publish, so the BF16 of the reconstructed previous
 * weight θ̂_{t-1} IS the published value — wherever the reconstruction is
 * certain: every value in the guard interval [θ̂−e, θ̂+e] rounds to the same
 * BF16 (gpu/elem.h, dtc_adamw_changed_u: the same bound that decides
 * "unchanged").  Those (position, value) pairs are kept here, per pair and
 * entry, sorted by box position; the publish then drops from the entry's
 * payload every position whose current BF16 equals the kept value.
 *
 * Safety: a position is only ever dropped when its kept value equals what
 * is sent now, and the kept value is what the sink holds at the base
 * version (the pair goes sparse only on that base, its dirty bitmap then
 * holds every step since).  Elements not kept (uncertain reconstruction,
 * past the memory cap, out of memory) are simply sent, as the union did:
 * nothing here can lose a change.  The checksum still covers the whole
 * expected content, so a wrongly dropped element would fail the sink's
 * check and be repaired densely.
 *
 * Memory: 6 bytes per kept element (u32 position, u16 value), or a bitmap
 * over the entry and 2 bytes per kept element where that is less (at most
 * 1/8 + 2 bytes per element of the entry), charged to one daemon-wide budget (dted.conf [daemon] mark_table_size; 0 turns the
 * tables off).  A table lives from the first mark after a publish to the
 * publish that consumes it, like the dirty bitmap it goes with.
 *
 * Workers build and read tables (a capture task owns the pair's table
 * while it runs); the budget counters are atomic.
 */
#ifndef DTED_SIDE_TABLE_H
#define DTED_SIDE_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/compute.h"
#include "gpu/entry.h"

#define SIDE_CAP_DEFAULT ((uint64_t)256 << 20)

/* One entry's kept values, positions ascending: sparse, u32 positions
 * and u16 values (6 bytes each), or, once that would cost more (more than
 * one kept element in 32 of the box), dense: a bitmap over the box and the
 * values in position order (box/8 + 2 bytes each). */
struct side_run {
	uint32_t *pos;             /* sparse; NULL when dense */
	uint64_t *bm;              /* dense: bit p set = position p kept */
	uint64_t words;            /* of bm */
	uint16_t *val;
	size_t n;
};

/* One pair's tables, one run per plan entry. */
struct side_tab {
	size_t n;
	struct side_run *r;
	uint64_t bytes;            /* charged to the budget */
};

/* Candidates of one scan: positions (ascending) of a step's flagged set
 * whose previous BF16 is certain, with that value. */
struct side_cand {
	uint32_t *pos;
	uint16_t *val;
	size_t n, cap;
	uint64_t uncertain;        /* flagged, previous value not certain */
};

/* The daemon-wide cap in bytes (0: off); held and peak bytes now. */
void side_set_cap(uint64_t bytes);
uint64_t side_cap(void);
uint64_t side_held(void);
uint64_t side_peak(void);

/* A table for n entries (charged), or NULL (cap reached, no memory):
 * the caller then keeps the union behaviour. */
struct side_tab *side_new(size_t n);
void side_free(struct side_tab *t);

/* Kept elements of the table, all entries. */
size_t side_count(const struct side_tab *t);

/* For every set bit of flags (a scan's changed set over e's box) not set
 * in skip (NULL: none; e.g. the dirty bitmap: not a first flag): the BF16
 * of the reconstructed θ_{t-1} where the guard interval decides it
 * (appended to c, ascending).  0, or a negative DTC_E* code (bad entry,
 * no memory: c is then unchanged but may have grown). */
int side_prev_scan(const struct dte_box_map *e, const struct dtc_consts *k,
		   const struct dtc_src *s, const uint64_t *flags, const uint64_t *skip,
		   uint64_t words, struct side_cand *c);
void side_cand_free(struct side_cand *c);

/* Keep the candidates whose bit in dirty_before is clear (first flagged
 * since the publish) in entry q of t, whose box has box_size positions
 * (every candidate below it).  Positions already kept keep their value.
 * As many as the budget allows are kept (ascending positions), the rest
 * counted in *left_out; a failed allocation keeps none of this call's.
 * *kept gets how many were added.  t NULL (no table could be made): only
 * *left_out counts the first flags. */
void side_add(struct side_tab *t, size_t q, uint64_t box_size, const struct side_cand *c,
	      const uint64_t *dirty_before, uint64_t *kept, uint64_t *left_out);

/* The kept value at position pos of entry q: 1 (in *val) or 0. */
int side_lookup(const struct side_tab *t, size_t q, uint64_t pos, uint16_t *val);

/* Drop from one entry's encoded sparse payload (len bytes at p, box_size
 * positions, gpu/codec.h) every position whose value equals the value
 * kept for it in entry q.  Rewritten in place: *len, *count (positions
 * left) and *dropped are updated.  0, or a negative DTC_E* code with the
 * payload untouched.  wrong is NULL but in a test build's fault
 * (job_ext.h, capture_wrong_drop): while *wrong > 0, a kept position whose
 * value differs is dropped too (and *wrong counted down). */
int side_filter(const struct side_tab *t, size_t q, uint64_t box_size, uint8_t *p,
		size_t *len, uint64_t *count, uint64_t *dropped, int *wrong);

#endif
