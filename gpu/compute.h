/* gpu/compute.h — the compute plane's public API.
 *
 * Kernels over one plan entry (gpu/entry.h), run by a backend
 * (gpu/backend.h): the cpu backend takes host pointers, the cuda backend
 * device pointers.  Lengths are in elements.  Every function validates the
 * entry against the buffer lengths it is given before touching memory, and
 * returns 0 or a negative DTC_E* code (dtc_strerror() names it); outputs are
 * written only on success.
 *
 * Detect is two passes: dtc_scan() computes the step's changed set as a
 * bitmap over box positions (1 bit per element, bit p of word p/64) and its
 * population count; dtc_sparse_from_bitmap() then emits the sorted
 * box-relative positions and BF16 values.  With DTC_SCAN_OR the same scan
 * ORs into a dirty bitmap that persists across steps (mark, DESIGN §2.6).
 */
#ifndef DTC_COMPUTE_H
#define DTC_COMPUTE_H

#include <stddef.h>
#include <stdint.h>
#include "gpu/entry.h"
#include "gpu/elem.h"

struct dtc_backend;

enum dtc_status {
	DTC_OK = 0,
	DTC_EINVAL = -1,	/* bad argument (NULL, bad hyper-parameters) */
	DTC_EBOX = -2,		/* entry maps outside its buffers, or bad shape */
	DTC_ERANGE = -3,	/* a position is outside the box */
	DTC_ETRUNC = -4,	/* payload ends early */
	DTC_ECORRUPT = -5,	/* payload malformed (bad header, unsorted, trailing bytes) */
	DTC_ENOSPC = -6,	/* output capacity too small */
	DTC_ENOMEM = -7,
	DTC_ECHECKSUM = -8,	/* chunk checksum mismatch */
	DTC_EDEVICE = -9,	/* backend/device failure */
};

const char *dtc_strerror(int status);

/* One optimizer group's hyper-parameters for the step being inverted.
 * lr is the learning rate the step actually used. */
struct dtc_hparams {
	double lr;
	double beta1;
	double beta2;
	double eps;
	double weight_decay;
	int64_t step;		/* the optimizer's step count after this step, >= 1 */
	int32_t variant;	/* enum dtc_variant */
};

/* Derive the FP32 constants the forward used; DTC_EINVAL (with a reason in
 * `why`, may be NULL) for values that make the inverse meaningless. */
int dtc_hparams_derive(const struct dtc_hparams *hp, struct dtc_consts *k,
		       char *why, unsigned whylen);

/* A source piece's three FP32 buffers, same mapping, `len` elements each. */
struct dtc_src {
	const float *param;
	const float *exp_avg;
	const float *exp_avg_sq;
	uint64_t len;
};

/* Number of elements in the box (product of extents); 0 for a bad shape. */
uint64_t dtc_box_size(const struct dte_box_map *e);
/* uint64 words a bitmap over the box needs. */
uint64_t dtc_bitmap_words(const struct dte_box_map *e);

/* Check shape and that every src (dst) index lies in [0, len); a len of
 * UINT64_MAX skips that side. */
int dtc_entry_check(const struct dte_box_map *e, uint64_t src_len, uint64_t dst_len);

enum dtc_scan_mode {
	DTC_SCAN_SET = 0,	/* bitmap := this step's changed set */
	DTC_SCAN_OR = 1,	/* bitmap |= this step's changed set (mark) */
};

/* Pass 1 of detect / mark.  `count` gets the population of the resulting
 * bitmap.  Bits past the box end in the last word are left zero. */
int dtc_scan(const struct dtc_backend *be, const struct dte_box_map *e,
	     const struct dtc_consts *k, const struct dtc_src *src,
	     uint64_t *bitmap, uint64_t bitmap_words, int mode, uint64_t *count);

/* Pass 2: positions (ascending) and BF16 values of the set bits; `cap`
 * is the room in pos/val, `n` gets the number written. */
int dtc_sparse_from_bitmap(const struct dtc_backend *be, const struct dte_box_map *e,
			   const uint64_t *bitmap, uint64_t bitmap_words,
			   const float *param, uint64_t param_len,
			   uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *n);

/* BF16 of every box element, canonical order; `out` holds box_size. */
int dtc_dense_extract(const struct dtc_backend *be, const struct dte_box_map *e,
		      const float *param, uint64_t param_len, uint16_t *out);

/* Both at once: out as dtc_dense_extract() and *sum as
 * dtc_checksum_entry(), exactly; a host backend reads θ once for the two,
 * another runs them one after the other. */
int dtc_dense_extract_csum(const struct dtc_backend *be, const struct dte_box_map *e,
			   const float *param, uint64_t param_len, uint16_t *out, uint64_t *sum);

/* dtc_dense_extract_csum(), with done(arg, p, n) called on the calling
 * thread for runs of out just written, in order, covering out exactly
 * once: a host backend on one thread every DTC_EXTRACT_RUN values, while
 * the run is still in cache (the source's chunk hash: daemon/
 * job_capture.c, which would otherwise read the part again from memory);
 * several threads or another backend, once for all of out at the end.
 * Not called when the extract fails. */
#define DTC_EXTRACT_RUN ((uint64_t)1 << 16)
typedef void (*dtc_out_fn)(void *arg, const uint16_t *p, uint64_t n);
int dtc_dense_extract_csum_each(const struct dtc_backend *be, const struct dte_box_map *e,
				const float *param, uint64_t param_len, uint16_t *out,
				uint64_t *sum, dtc_out_fn done, void *arg);

/* An FP32 tensor's halves (daemon/layout/spec.h): e's source indices
 * are 16-bit units of src (an FP32 buffer read as src_len 16-bit units,
 * little-endian halves), copied as they are into out (box_size of them,
 * canonical order), and *sum gets their checksum terms at e's destination
 * indices, as dtc_checksum_box() of a sink holding them will be.  Host
 * memory only; the entry is checked first. */
int dtc_raw16_extract_csum(const struct dte_box_map *e, const uint16_t *src, uint64_t src_len,
			   uint16_t *out, uint64_t *sum);

/* Write val[i] at the destination of box position pos[i].  Every position
 * is checked (< box size, destination inside dst_len) before anything is
 * written: on error dst is untouched. */
int dtc_scatter_apply(const struct dtc_backend *be, const struct dte_box_map *e,
		      const uint64_t *pos, const uint16_t *val, uint64_t n,
		      uint16_t *dst, uint64_t dst_len);

/* Dense apply: vals in canonical order, box_size of them. */
int dtc_dense_apply(const struct dtc_backend *be, const struct dte_box_map *e,
		    const uint16_t *vals, uint16_t *dst, uint64_t dst_len);

/* Σ mix(i, buf[i]) over a whole destination buffer. */
int dtc_checksum_buffer(const struct dtc_backend *be, const uint16_t *buf, uint64_t len,
			uint64_t *sum);

/* The entry's expected contribution to its destination buffer's checksum:
 * Σ mix(dst index, bf16(param[src index])) over the box. */
int dtc_checksum_entry(const struct dtc_backend *be, const struct dte_box_map *e,
		       const float *param, uint64_t param_len, uint64_t *sum);

/* Where to map the k-th large host array the scan will read side by side
 * with others (an mmap hint; NULL where the address space is small).
 * Left to itself the kernel packs consecutive mappings top-down, so a
 * trainer's θ, m and v of one tensor, mapped one after the other, sit
 * exactly their size apart (often a power of two), and the detect that
 * streams them side by side ran 25-50% slower there than over the same
 * pages mapped apart (measured on this project's Zen 4 VM; some structure
 * the CPU indexes by address bits aliases).  The hint is a page spread
 * over [32 TiB, 96 TiB) by a hash of k (application memory under ASan
 * too); where that range is taken or does not exist the kernel places the
 * mapping as usual. */
void *dtc_spread_hint(uint64_t k);

/* ---- one-pass detect and payload apply (host backends) ------------------
 * The capture and apply paths the daemon runs on host memory: detect reads
 * θ, m, v once and leaves the entry's sparse payload (gpu/codec.h format)
 * and, on request, its expected checksum; apply writes a payload straight
 * from its encoded bytes.  Both are defined by the two-pass calls above
 * (same bytes, same sums; tests/unit/test_detect.c holds them to that) and
 * need a backend whose buffers are host memory (DTC_EINVAL otherwise). */

/* A growable malloc'd byte buffer; payloads are appended at n. */
struct dtc_bytes {
	uint8_t *p;
	size_t n, cap;
};

/* Append the entry's sparse payload for this step to out: the positions
 * dtc_scan(DTC_SCAN_SET) flags, together with the set bits of `mark` when
 * it is not NULL (the dirty bitmap of earlier marked steps, mark_words
 * long), in the bytes dtc_sparse_encode() would write for them and their
 * BF16 values.  *count gets the number of positions; with csum non-NULL,
 * *csum gets dtc_checksum_entry() of the entry, from the same read of θ.
 * On error out->n is unchanged (out->p may have been reallocated). */
int dtc_detect(const struct dtc_backend *be, const struct dte_box_map *e,
	       const struct dtc_consts *k, const struct dtc_src *src,
	       const uint64_t *mark, uint64_t mark_words,
	       struct dtc_bytes *out, uint64_t *count, uint64_t *csum);

/* Apply one entry's encoded sparse payload (len bytes at in) to dst.  The
 * whole payload is validated first (dtc_sparse_decode's checks, and every
 * destination inside dst_len): on any error dst is untouched.  *count gets
 * the number of positions written; with delta non-NULL, *delta is
 * increased by Σ mix(i, new) − mix(i, old) over the destination indices i
 * written, old being what dst held just before: the change of
 * dtc_checksum_box() over the box, mod 2^64. */
int dtc_sparse_apply_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			     const uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
			     uint64_t *count, uint64_t *delta);

/* dtc_sparse_apply_payload() that also writes, in place of each new
 * value in the payload, the value dst held there: calling it again on the
 * same bytes puts every old value back exactly and the payload as it was
 * (apply on arrival with undo, docs/SYNC.md).  The same checks first (an
 * error leaves dst and the payload untouched); DTC_EINVAL when e's map may
 * send two positions to one element (dtc_map_injective() 0), where the
 * order of the swaps would matter. */
int dtc_sparse_swap_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			    uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
			    uint64_t *count, uint64_t *delta);

/* The read-back of a swap (dtc_sparse_swap_payload()): `in` is the
 * payload as the swap left it (the old values in place of the new ones);
 * nothing is written.  *delta += Σ mix(i, dst[i]) − mix(i, old) over its
 * positions, dst[i] read from memory as it is now: after a swap that wrote
 * every value, the swap's own delta; a write that did not land (or was
 * overwritten since) shows as a difference.  What a sink's incremental
 * verification adds, so it checks the memory, not what it meant to write
 * (docs/SYNC.md, step 5).  The same checks first; *count the positions. */
int dtc_sparse_readback_payload(const struct dtc_backend *be, const struct dte_box_map *e,
				const uint8_t *in, size_t len, const uint16_t *dst, uint64_t dst_len,
				uint64_t *count, uint64_t *delta);

/* The dense counterpart: `in` is an entry's dense payload (box_size
 * little-endian BF16 values in canonical order, exactly 2 * box_size
 * bytes); each is swapped with the element of dst it maps to, so dst
 * holds the new values and `in` the old ones, and a second call undoes
 * the first exactly.  *sum_new gets dtc_checksum_box() of dst over the
 * box after the swap (the entry's whole contribution to the sink's sum).
 * The same checks first (nothing written on error); DTC_EINVAL when the
 * map is not injective. */
int dtc_dense_swap_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			   uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
			   uint64_t *sum_new);

/* Whether distinct positions of e's box reach distinct elements (a
 * sufficient test: 0 may be a false negative). */
int dtc_map_injective(const struct dte_box_map *e);

/* The same by decode + dtc_scatter_apply (gpu/apply.c): the definition the
 * one-pass version is tested against. */
int dtc_sparse_apply_payload_ref(const struct dtc_backend *be, const struct dte_box_map *e,
				 const uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
				 uint64_t *count, uint64_t *delta);

/* dtc_sparse_decode()'s checks without its output: what a sink runs when
 * it stages a payload it will apply later with the call above. */
int dtc_sparse_payload_check(const uint8_t *in, size_t len, uint64_t box_size, uint64_t *count);

#endif
