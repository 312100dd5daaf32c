/* dtc_detect() and dtc_sparse_apply_payload(), composed from the two-pass
 * kernels: the definition the one-pass versions must match byte for byte
 * (and what a backend without them runs). */
#include <stdlib.h>
#include <string.h>
#include "gpu/backend_ops.h"
#include "gpu/box.h"
#include "gpu/codec.h"
#include "gpu/compute.h"

static int host_backend(const struct dtc_backend *be)
{
	return be && be->ops && !be->ops->mem_alloc;
}

static int bytes_room(struct dtc_bytes *b, size_t more)
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

int dtc_detect(const struct dtc_backend *be, const struct dte_box_map *e,
	       const struct dtc_consts *k, const struct dtc_src *src,
	       const uint64_t *mark, uint64_t mark_words,
	       struct dtc_bytes *out, uint64_t *count, uint64_t *csum)
{
	uint64_t words, n = 0, cnt = 0, *bm = NULL, *pos = NULL;
	uint16_t *val = NULL;
	size_t len = 0;
	int rc;

	if (!host_backend(be) || !out || !count || !src)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, src->len, UINT64_MAX)) != DTC_OK)
		return rc;
	words = dtc_bitmap_words(e);
	if (mark && mark_words < words)
		return DTC_EINVAL;
	if (!(bm = malloc((words ? words : 1) * sizeof(*bm))))
		return DTC_ENOMEM;
	rc = dtc_scan(be, e, k, src, bm, words, DTC_SCAN_SET, &cnt);
	if (rc == DTC_OK && mark) {
		cnt = 0;
		for (uint64_t i = 0; i < words; i++) {
			bm[i] |= mark[i];
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
		rc = bytes_room(out, dtc_sparse_bound(cnt));
	if (rc == DTC_OK)
		rc = dtc_sparse_encode(pos, val, cnt, dtc_box_size(e), out->p + out->n,
				       out->cap - out->n, &len);
	if (rc == DTC_OK && csum)
		rc = dtc_checksum_entry(be, e, src->param, src->len, csum);
	if (rc == DTC_OK) {
		out->n += len;
		*count = cnt;
	}
	free(bm);
	free(pos);
	free(val);
	return rc;
}
