/* dtc_detect(): validation, then the backend's one-pass op, or (for a
 * backend without one) dtc_detect_ref(), composed from the two-pass
 * kernels: the definition the one-pass op must match byte for byte. */
#include <stdlib.h>
#include <string.h>
#include "gpu/backend_ops.h"
#include "gpu/box.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/detect.h"

int dtc_bytes_reserve(struct dtc_bytes *b, size_t more)
{
	size_t need = b->n + more, nc;
	void *np;

	if (need < b->n)
		return DTC_ENOMEM;
	if (need <= b->cap)
		return DTC_OK;
	nc = b->cap ? b->cap : 4096;
	while (nc < need)
		nc = nc > SIZE_MAX / 2 ? need : 2 * nc;
	if (!(np = realloc(b->p, nc)))
		return DTC_ENOMEM;
	b->p = np;
	b->cap = nc;
	return DTC_OK;
}

/* Destination indices the checksum tells apart (it mixes index << 16). */
#define DST_INDEX_LIMIT ((uint64_t)1 << 48)

static int detect_check(const struct dtc_backend *be, const struct dte_box_map *e,
			const struct dtc_consts *k, const struct dtc_src *src,
			const uint64_t *mark, uint64_t mark_words, const struct dtc_bytes *out,
			const uint64_t *count)
{
	int rc;

	if (!dtc_host_backend(be) || !out || !count || !k || !src || !src->param ||
	    !src->exp_avg || !src->exp_avg_sq ||
	    (k->variant != DTC_VARIANT_TORCH && k->variant != DTC_VARIANT_FUSED))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, src->len, DST_INDEX_LIMIT)) != DTC_OK)
		return rc;
	if (mark && mark_words < dtc_bitmap_words(e))
		return DTC_EINVAL;
	return DTC_OK;
}

int dtc_detect(const struct dtc_backend *be, const struct dte_box_map *e,
	       const struct dtc_consts *k, const struct dtc_src *src,
	       const uint64_t *mark, uint64_t mark_words,
	       struct dtc_bytes *out, uint64_t *count, uint64_t *csum)
{
	struct dte_box_map ce;
	uint64_t cnt = 0, sum = 0;
	int rc;

	if ((rc = detect_check(be, e, k, src, mark, mark_words, out, count)) != DTC_OK)
		return rc;
	if (!be->ops->detect)
		return dtc_detect_ref(be, e, k, src, mark, mark_words, out, count, csum);
	/* positions do not depend on the merge; the checksum's dst walk does */
	box_coalesce(e, csum ? BOX_SRC | BOX_DST : BOX_SRC, &ce);
	rc = be->ops->detect(&ce, k, src->param, src->exp_avg, src->exp_avg_sq, mark, out, &cnt,
			     csum ? &sum : NULL);
	if (rc == DTC_OK) {
		*count = cnt;
		if (csum)
			*csum = sum;
	}
	return rc;
}

int dtc_detect_ref(const struct dtc_backend *be, const struct dte_box_map *e,
		   const struct dtc_consts *k, const struct dtc_src *src,
		   const uint64_t *mark, uint64_t mark_words,
		   struct dtc_bytes *out, uint64_t *count, uint64_t *csum)
{
	uint64_t words, size, n = 0, cnt = 0, sum = 0, *bm = NULL, *pos = NULL;
	uint16_t *val = NULL;
	size_t len = 0;
	int rc;

	if ((rc = detect_check(be, e, k, src, mark, mark_words, out, count)) != DTC_OK)
		return rc;
	size = dtc_box_size(e);
	words = dtc_bitmap_words(e);
	if (!(bm = malloc(words * sizeof(*bm))))
		return DTC_ENOMEM;
	rc = dtc_scan(be, e, k, src, bm, words, DTC_SCAN_SET, &cnt);
	if (rc == DTC_OK && mark) {
		/* mark bits past the box end are not positions */
		cnt = 0;
		for (uint64_t i = 0; i < words; i++) {
			bm[i] |= mark[i];
			if (i + 1 == words && size % 64)
				bm[i] &= ((uint64_t)1 << (size % 64)) - 1;
			cnt += (uint64_t)__builtin_popcountll(bm[i]);
		}
	}
	if (rc == DTC_OK && cnt && (!(pos = malloc(cnt * sizeof(*pos))) ||
				    !(val = malloc(cnt * sizeof(*val)))))
		rc = DTC_ENOMEM;
	if (rc == DTC_OK && cnt)
		rc = dtc_sparse_from_bitmap(be, e, bm, words, src->param, src->len, pos, val,
					    cnt, &n);
	if (rc == DTC_OK && n != cnt)
		rc = DTC_ECORRUPT;
	if (rc == DTC_OK)
		rc = dtc_bytes_reserve(out, dtc_sparse_bound(cnt));
	if (rc == DTC_OK)
		rc = dtc_sparse_encode(pos, val, cnt, size, out->p + out->n, out->cap - out->n, &len);
	if (rc == DTC_OK && csum)
		rc = dtc_checksum_entry(be, e, src->param, src->len, &sum);
	if (rc == DTC_OK) {
		out->n += len;
		*count = cnt;
		if (csum)
			*csum = sum;
	}
	free(bm);
	free(pos);
	free(val);
	return rc;
}
