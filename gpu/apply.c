/* dtc_sparse_apply_payload() on host memory, straight from the encoded
 * bytes (gpu/codec.h format): no decoded position/value arrays.
 *
 * Two passes over the payload, neither over the box: the first only
 * decodes and checks (dtc_sparse_decode's rules), so a bad payload leaves
 * dst untouched; the second decodes again and, per position, reads the old
 * value, writes the new one and adds mix(i, new) − mix(i, old) to the
 * delta.  The check pass notes where each of a few equal shares of the
 * positions starts in the gap stream, so large payloads are written by
 * several threads, each from its own cut (only when the map provably sends
 * distinct positions to distinct elements, so no two threads share one). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/box.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/detect.h"

#define APPLY_PAR_MIN	(1u << 16)	/* positions; below this one thread is faster */
#define APPLY_MAX_PARTS	8

/* Where one share of the positions starts: its first element, the byte
 * of its gap code, and the smallest position it may have (prev + 1). */
struct cut {
	uint64_t first;
	size_t off;
	uint64_t next;
};

/* The check pass: dtc_sparse_decode's validation without its output.
 * *vals gets the byte offset of the values; cuts[k] (k < ncuts) where
 * share k of ncuts starts. */
static int payload_scan(const uint8_t *in, size_t len, uint64_t box_size, uint64_t *count,
			size_t *vals, struct cut *cuts, int ncuts)
{
	const uint8_t *p = in, *end = in + len;
	uint64_t c, next = 0;
	int rc, k = 0;

	if ((rc = dtc_sparse_count(in, len, box_size, &c)) != DTC_OK)
		return rc;
	(void)dtc_varint_get(&p, end, &c);	/* skip the count, checked above */
	for (uint64_t i = 0; i < c; i++) {
		uint64_t gap;

		if (k < ncuts && i == c * (uint64_t)k / (uint64_t)ncuts) {
			cuts[k].first = i;
			cuts[k].off = (size_t)(p - in);
			cuts[k].next = next;
			k++;
		}
		if ((rc = dtc_gap_get(&p, end, &gap)) != DTC_OK)
			return rc;
		if (next >= box_size || gap >= box_size - next)
			return DTC_ERANGE;
		next += gap + 1;
	}
	if ((uint64_t)(end - p) < 2 * c)
		return DTC_ETRUNC;
	if ((uint64_t)(end - p) > 2 * c)
		return DTC_ECORRUPT;
	for (; k < ncuts; k++) {
		cuts[k].first = c;
		cuts[k].off = (size_t)(p - in);
		cuts[k].next = next;
	}
	*count = c;
	*vals = (size_t)(p - in);
	return DTC_OK;
}

int dtc_sparse_payload_check(const uint8_t *in, size_t len, uint64_t box_size, uint64_t *count)
{
	size_t vals;

	if (!in || !count)
		return DTC_EINVAL;
	return payload_scan(in, len, box_size, count, &vals, NULL, 0);
}

/* The write pass over positions [first, last) of an already checked
 * payload, starting at gap byte p with next as the smallest position. */
struct share {
	const struct dte_box_map *e;	/* coalesced on the dst side */
	const uint8_t *p, *end;
	uint8_t *vals;            /* written back only when swap */
	uint64_t first, last, next;
	uint16_t *dst;
	int want_delta;
	int swap;                 /* the old values go back into the payload */
	int readback;             /* write nothing: Σ mix(at, dst) − mix(at, payload value) */
	uint64_t delta;
	pthread_t tid;
	int started;
};

/* Positions are decoded a batch ahead of the writes and their cache
 * lines prefetched, so the read-modify-writes of scattered elements
 * overlap instead of each waiting for its miss. */
#define APPLY_BATCH 64

/* Σ mix(at, new) − mix(at, old) over a batch: no carried dependency but
 * the sum, so it vectorizes (8 lanes of 64-bit multiplies on AVX-512); as
 * the write loop's scalar tail it cost a fifth of the apply. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
static uint64_t delta_batch(const int64_t *at, const uint16_t *nv, const uint16_t *ov, uint64_t n)
{
	uint64_t d = 0;

	for (uint64_t k = 0; k < n; k++)
		d += dtc_csum_term((uint64_t)at[k], nv[k]) - dtc_csum_term((uint64_t)at[k], ov[k]);
	return d;
}

static void share_write(struct share *s)
{
	const struct dte_box_map *e = s->e;
	const int64_t d1 = e->dst_stride[e->ndim - 1];
	const uint8_t *p = s->p;
	uint8_t *v = s->vals + 2 * s->first;
	uint16_t *dst = s->dst;
	int64_t at[APPLY_BATCH];
	uint16_t nv[APPLY_BATCH], ov[APPLY_BATCH];
	struct box_walk w;
	uint64_t d = 0, cur, gap = 0, i = s->first;

	if (s->first >= s->last)
		return;
	/* The first position, then the walk follows the gaps. */
	(void)dtc_gap_get(&p, s->end, &gap);
	cur = s->next + gap;
	box_walk_seek(&w, e, cur);
	while (i < s->last) {
		uint64_t nb = s->last - i < APPLY_BATCH ? s->last - i : APPLY_BATCH;

		for (uint64_t k = 0; k < nb; k++) {
			at[k] = w.dst_row + w.col * d1;
			__builtin_prefetch(&dst[at[k]], 1);
			if (i + k + 1 == s->last)
				break;
			(void)dtc_gap_get(&p, s->end, &gap);
			cur += gap + 1;
			w.col += (int64_t)gap + 1;
			if (w.col >= w.row_len) {
				int64_t col = w.col - w.row_len;

				if (col < w.row_len) {
					box_walk_next_row(&w);
					w.col = col;
				} else {
					box_walk_seek(&w, e, cur);
				}
			}
		}
		if (s->readback) {
			/* The sink's memory as it is now against the payload's
			 * values (after a swap: what the elements held before). */
			for (uint64_t k = 0; k < nb; k++, v += 2) {
				nv[k] = dst[at[k]];
				ov[k] = (uint16_t)(v[0] | (v[1] << 8));
			}
			d += delta_batch(at, nv, ov, nb);
			i += nb;
			continue;
		}
		/* Old value read, new one written, in order (a later position
		 * reads what an earlier one wrote, should two share an element);
		 * then the delta of the batch in one loop that vectorizes. */
		for (uint64_t k = 0; k < nb; k++, v += 2) {
			nv[k] = (uint16_t)(v[0] | (v[1] << 8));
			ov[k] = dst[at[k]];
			dst[at[k]] = nv[k];
			if (s->swap) {
				v[0] = (uint8_t)ov[k];
				v[1] = (uint8_t)(ov[k] >> 8);
			}
		}
		if (s->want_delta)
			d += delta_batch(at, nv, ov, nb);
		i += nb;
	}
	s->delta = d;
}

static void *share_main(void *arg)
{
	share_write(arg);
	return NULL;
}

/* Distinct positions reach distinct elements: with dims ordered by
 * |stride|, each stride exceeds the reach of the smaller ones.  A
 * sufficient test (false negatives only cost the threads). */
static int map_injective(const struct dte_box_map *e)
{
	uint64_t s[DTE_MAX_DIMS], x[DTE_MAX_DIMS], reach = 0;
	uint32_t n = 0;

	for (uint32_t d = 0; d < e->ndim; d++) {
		if (e->extent[d] == 1)
			continue;
		s[n] = (uint64_t)(e->dst_stride[d] < 0 ? -e->dst_stride[d] : e->dst_stride[d]);
		x[n++] = (uint64_t)e->extent[d];
	}
	for (uint32_t a = 1; a < n; a++)	/* insertion sort by stride */
		for (uint32_t b = a; b > 0 && s[b - 1] > s[b]; b--) {
			uint64_t t = s[b];

			s[b] = s[b - 1];
			s[b - 1] = t;
			t = x[b];
			x[b] = x[b - 1];
			x[b - 1] = t;
		}
	for (uint32_t d = 0; d < n; d++) {
		if (s[d] <= reach)
			return 0;
		/* entry_check bounded the span by dst_len: no overflow here */
		reach += (x[d] - 1) * s[d];
	}
	return 1;
}

/* The reference: decode into arrays, delta from dst before the scatter. */
int dtc_sparse_apply_payload_ref(const struct dtc_backend *be, const struct dte_box_map *e,
				 const uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
				 uint64_t *count, uint64_t *delta)
{
	uint64_t n = 0, got = 0, d = 0, *pos = NULL;
	uint16_t *val = NULL;
	int rc;

	if (!dtc_host_backend(be) || !in || !dst || !count)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, UINT64_MAX, dst_len)) != DTC_OK)
		return rc;
	if ((rc = dtc_sparse_count(in, len, dtc_box_size(e), &n)) != DTC_OK)
		return rc;
	if (n && (!(pos = malloc(n * sizeof(*pos))) || !(val = malloc(n * sizeof(*val))))) {
		rc = DTC_ENOMEM;
		goto out;
	}
	if ((rc = dtc_sparse_decode(in, len, dtc_box_size(e), pos, val, n, &got)) != DTC_OK)
		goto out;
	if (delta) {
		for (uint64_t i = 0; i < got; i++) {
			uint64_t di = (uint64_t)box_dst_of(e, pos[i]);	/* scalars too */

			d += dtc_csum_term(di, val[i]) - dtc_csum_term(di, dst[di]);
		}
	}
	if ((rc = dtc_scatter_apply(be, e, pos, val, got, dst, dst_len)) != DTC_OK)
		goto out;
	*count = got;
	if (delta)
		*delta += d;
out:
	free(pos);
	free(val);
	return rc;
}

static int apply_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			 uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len, uint64_t *count,
			 uint64_t *delta, int mode);

enum { AP_WRITE, AP_SWAP, AP_READBACK };

int dtc_sparse_apply_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			     const uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
			     uint64_t *count, uint64_t *delta)
{
	/* AP_WRITE: the payload is only read */
	return apply_payload(be, e, (uint8_t *)(uintptr_t)in, len, dst, dst_len, count, delta,
			     AP_WRITE);
}

int dtc_sparse_swap_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			    uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
			    uint64_t *count, uint64_t *delta)
{
	if (in && dtc_host_backend(be) && !map_injective(e))
		return DTC_EINVAL;	/* order would matter: the undo could not be exact */
	return apply_payload(be, e, in, len, dst, dst_len, count, delta, AP_SWAP);
}

int dtc_sparse_readback_payload(const struct dtc_backend *be, const struct dte_box_map *e,
				const uint8_t *in, size_t len, const uint16_t *dst, uint64_t dst_len,
				uint64_t *count, uint64_t *delta)
{
	if (!delta)
		return DTC_EINVAL;
	/* AP_READBACK writes neither dst nor the payload. */
	return apply_payload(be, e, (uint8_t *)(uintptr_t)in, len, (uint16_t *)(uintptr_t)dst,
			     dst_len, count, delta, AP_READBACK);
}

int dtc_dense_swap_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			   uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len,
			   uint64_t *sum_new)
{
	struct dte_box_map m;
	struct box_rows r;
	uint64_t size;
	int64_t d1;
	int rc;

	if (!dtc_host_backend(be) || !dst || !sum_new || (!in && len))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, UINT64_MAX, dst_len)) != DTC_OK)
		return rc;
	size = dtc_box_size(e);
	if (len / 2 < size)
		return DTC_ETRUNC;
	if (len != size * 2)
		return DTC_ECORRUPT;
	if (!map_injective(e))
		return DTC_EINVAL;	/* order would matter: the undo could not be exact */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	return DTC_EINVAL;	/* the payload's BF16 are little-endian */
#endif
	if ((uintptr_t)in & 1)
		return DTC_EINVAL;	/* framed payloads keep entries 2-byte aligned */
	box_coalesce(e, BOX_DST, &m);
	/* The backend's fused op (cpu: swap and sum in one pass, on its
	 * threads); below, the definition it must match: the swap, then
	 * dtc_checksum_box over the box. */
	if (be->ops->dense_swap)
		return be->ops->dense_swap(&m, (uint16_t *)(void *)in, dst, sum_new);
	d1 = m.dst_stride[m.ndim - 1];
	for (box_rows_init(&r, &m, 0, size); box_rows_next(&r);) {
		uint16_t *v = (uint16_t *)(void *)in + r.p, *d = dst + r.dst;
		uint64_t run = r.n;

		if (d1 == 1) {
			/* Through a small buffer: three memcpy per block. */
			uint16_t tmp[2048];

			for (uint64_t k = 0; k < run; k += 2048) {
				size_t n = (size_t)(run - k < 2048 ? run - k : 2048) * sizeof(*tmp);

				memcpy(tmp, d + k, n);
				memcpy(d + k, v + k, n);
				memcpy(v + k, tmp, n);
			}
		} else {
			for (uint64_t k = 0; k < run; k++) {
				uint16_t t = d[(int64_t)k * d1];

				d[(int64_t)k * d1] = v[k];
				v[k] = t;
			}
		}
	}
	return dtc_checksum_box(be, e, dst, dst_len, sum_new);
}

int dtc_map_injective(const struct dte_box_map *e)
{
	return map_injective(e);
}

static int apply_payload(const struct dtc_backend *be, const struct dte_box_map *e,
			 uint8_t *in, size_t len, uint16_t *dst, uint64_t dst_len, uint64_t *count,
			 uint64_t *delta, int mode)
{
	struct cut cuts[APPLY_MAX_PARTS];
	struct share sh[APPLY_MAX_PARTS];
	struct dte_box_map m;
	uint64_t n = 0, d = 0;
	size_t vals = 0;
	int rc, parts = 1;

	if (!dtc_host_backend(be) || !in || !dst || !count)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, UINT64_MAX, dst_len)) != DTC_OK)
		return rc;
	/* How many shares can only be known after the count: read it first. */
	if ((rc = dtc_sparse_count(in, len, dtc_box_size(e), &n)) != DTC_OK)
		return rc;
	if (n >= APPLY_PAR_MIN && map_injective(e))
		parts = dtc_cpu_threads() < APPLY_MAX_PARTS ? dtc_cpu_threads() : APPLY_MAX_PARTS;
	if ((rc = payload_scan(in, len, dtc_box_size(e), &n, &vals, cuts, parts)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_DST, &m);
	for (int k = 0; k < parts; k++) {
		sh[k] = (struct share){
			.e = &m, .p = in + cuts[k].off, .end = in + vals, .vals = in + vals,
			.first = cuts[k].first, .last = k + 1 < parts ? cuts[k + 1].first : n,
			.next = cuts[k].next, .dst = dst, .want_delta = delta != NULL,
			.swap = mode == AP_SWAP, .readback = mode == AP_READBACK,
		};
	}
	for (int k = 1; k < parts; k++)
		sh[k].started = pthread_create(&sh[k].tid, NULL, share_main, &sh[k]) == 0;
	share_write(&sh[0]);
	for (int k = 1; k < parts; k++) {
		if (sh[k].started)
			pthread_join(sh[k].tid, NULL);
		else
			share_write(&sh[k]);
	}
	for (int k = 0; k < parts; k++)
		d += sh[k].delta;
	*count = n;
	if (delta)
		*delta += d;
	return DTC_OK;
}
