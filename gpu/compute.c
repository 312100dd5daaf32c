/* The public kernel calls: validate on the host, then hand to the backend.
 * Entries and lengths are checked here once for every backend, so a
 * backend only ever sees a box that maps inside its buffers, with its dims
 * already merged where the sides the kernel touches allow (box_coalesce):
 * positions are unchanged by that, only the walk gets longer rows. */
#include "gpu/backend_ops.h"
#include "gpu/box.h"
#include "gpu/compute.h"

static int check_bitmap(const struct dte_box_map *e, const uint64_t *bitmap, uint64_t words)
{
	if (!bitmap || words < dtc_bitmap_words(e))
		return DTC_EINVAL;
	return DTC_OK;
}

int dtc_scan(const struct dtc_backend *be, const struct dte_box_map *e,
	     const struct dtc_consts *k, const struct dtc_src *src,
	     uint64_t *bitmap, uint64_t bitmap_words, int mode, uint64_t *count)
{
	struct dte_box_map ce;
	uint64_t c;
	int rc;

	if (!be || !k || !src || !src->param || !src->exp_avg || !src->exp_avg_sq || !count ||
	    (mode != DTC_SCAN_SET && mode != DTC_SCAN_OR) ||
	    (k->variant != DTC_VARIANT_TORCH && k->variant != DTC_VARIANT_FUSED))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, src->len, UINT64_MAX)) != DTC_OK)
		return rc;
	if ((rc = check_bitmap(e, bitmap, bitmap_words)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_SRC, &ce);
	rc = be->ops->scan(&ce, k, src->param, src->exp_avg, src->exp_avg_sq, bitmap, mode, &c);
	if (rc == DTC_OK)
		*count = c;
	return rc;
}

int dtc_sparse_from_bitmap(const struct dtc_backend *be, const struct dte_box_map *e,
			   const uint64_t *bitmap, uint64_t bitmap_words,
			   const float *param, uint64_t param_len,
			   uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *n)
{
	struct dte_box_map ce;
	uint64_t c;
	int rc;

	if (!be || !param || !n || (cap && (!pos || !val)))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, param_len, UINT64_MAX)) != DTC_OK)
		return rc;
	if ((rc = check_bitmap(e, bitmap, bitmap_words)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_SRC, &ce);
	rc = be->ops->sparse_from_bitmap(&ce, bitmap, param, pos, val, cap, &c);
	if (rc == DTC_OK)
		*n = c;
	return rc;
}

int dtc_dense_extract(const struct dtc_backend *be, const struct dte_box_map *e,
		      const float *param, uint64_t param_len, uint16_t *out)
{
	struct dte_box_map ce;
	int rc;

	if (!be || !param || !out)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, param_len, UINT64_MAX)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_SRC, &ce);
	return be->ops->dense_extract(&ce, param, out);
}

int dtc_dense_extract_csum_each(const struct dtc_backend *be, const struct dte_box_map *e,
				const float *param, uint64_t param_len, uint16_t *out,
				uint64_t *sum, dtc_out_fn done, void *arg)
{
	struct dte_box_map ce;
	uint64_t s = 0;
	int rc;

	if (!be || !param || !out || !sum)
		return DTC_EINVAL;
	if (!dtc_host_backend(be) || !be->ops->dense_extract_csum) {
		if ((rc = dtc_dense_extract(be, e, param, param_len, out)) != DTC_OK ||
		    (rc = dtc_checksum_entry(be, e, param, param_len, sum)) != DTC_OK)
			return rc;
		if (done)
			done(arg, out, dtc_box_size(e));
		return DTC_OK;
	}
	if ((rc = dtc_entry_check(e, param_len, UINT64_MAX)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_SRC | BOX_DST, &ce);
	rc = be->ops->dense_extract_csum(&ce, param, out, &s, done, arg);
	if (rc == DTC_OK)
		*sum = s;
	return rc;
}

int dtc_dense_extract_csum(const struct dtc_backend *be, const struct dte_box_map *e,
			   const float *param, uint64_t param_len, uint16_t *out, uint64_t *sum)
{
	return dtc_dense_extract_csum_each(be, e, param, param_len, out, sum, NULL, NULL);
}

int dtc_raw16_extract_csum(const struct dte_box_map *e, const uint16_t *src, uint64_t src_len,
			   uint16_t *out, uint64_t *sum)
{
	struct dte_box_map ce;
	struct box_rows r;
	uint64_t s = 0;
	int rc;

	if (!src || !out || !sum)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, src_len, UINT64_MAX)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_SRC | BOX_DST, &ce);
	for (box_rows_init(&r, &ce, 0, dtc_box_size(&ce)); box_rows_next(&r); ) {
		int64_t ss = ce.src_stride[ce.ndim - 1], ds = ce.dst_stride[ce.ndim - 1];

		for (uint64_t i = 0; i < r.n; i++) {
			uint16_t v = src[r.src + (int64_t)i * ss];

			out[r.p + i] = v;
			s += dtc_csum_term((uint64_t)(r.dst + (int64_t)i * ds), v);
		}
	}
	*sum = s;
	return DTC_OK;
}

int dtc_scatter_apply(const struct dtc_backend *be, const struct dte_box_map *e,
		      const uint64_t *pos, const uint16_t *val, uint64_t n,
		      uint16_t *dst, uint64_t dst_len)
{
	struct dte_box_map ce;
	int rc;

	if (!be || !dst || (n && (!pos || !val)))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, UINT64_MAX, dst_len)) != DTC_OK)
		return rc;
	if (n == 0)
		return DTC_OK;
	box_coalesce(e, BOX_DST, &ce);
	return be->ops->scatter(&ce, pos, val, n, dst);
}

int dtc_dense_apply(const struct dtc_backend *be, const struct dte_box_map *e,
		    const uint16_t *vals, uint16_t *dst, uint64_t dst_len)
{
	struct dte_box_map ce;
	int rc;

	if (!be || !vals || !dst)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, UINT64_MAX, dst_len)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_DST, &ce);
	return be->ops->dense_apply(&ce, vals, dst);
}

int dtc_checksum_buffer(const struct dtc_backend *be, const uint16_t *buf, uint64_t len,
			uint64_t *sum)
{
	uint64_t s = 0;
	int rc;

	if (!be || !sum || (len && !buf))
		return DTC_EINVAL;
	if (len == 0) {
		*sum = 0;
		return DTC_OK;
	}
	rc = be->ops->checksum_buffer(buf, len, &s);
	if (rc == DTC_OK)
		*sum = s;
	return rc;
}

int dtc_checksum_entry(const struct dtc_backend *be, const struct dte_box_map *e,
		       const float *param, uint64_t param_len, uint64_t *sum)
{
	struct dte_box_map ce;
	uint64_t s = 0;
	int rc;

	if (!be || !param || !sum)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, param_len, UINT64_MAX)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_SRC | BOX_DST, &ce);
	rc = be->ops->checksum_entry(&ce, param, &s);
	if (rc == DTC_OK)
		*sum = s;
	return rc;
}

void *dtc_spread_hint(uint64_t k)
{
#if UINTPTR_MAX > 0xffffffffu
	uint64_t x = dtc_mix64(k);

	return (void *)(uintptr_t)((1ull << 45) + (x % (1ull << 46) & ~0xfffull));
#else
	(void)k;
	return NULL;
#endif
}
