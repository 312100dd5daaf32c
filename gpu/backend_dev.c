/* Device memory, CUDA IPC and the destination checksum, over whichever
 * backend is given: the cuda plugin's ops where it has them, a plain host
 * walk for checksum_box on cpu, DTC_EINVAL for the rest. */
#include "gpu/backend.h"
#include "gpu/backend_ops.h"
#include "gpu/box.h"
#include "gpu/compute.h"

int dtc_dev_has(const struct dtc_backend *be)
{
	return be && be->ops && be->ops->mem_alloc && be->ops->ipc_open;
}

void *dtc_dev_alloc(const struct dtc_backend *be, uint64_t bytes)
{
	return be && be->ops && be->ops->mem_alloc ? be->ops->mem_alloc(bytes) : NULL;
}

void dtc_dev_free(const struct dtc_backend *be, void *p)
{
	if (p && be && be->ops && be->ops->mem_free)
		be->ops->mem_free(p);
}

int dtc_dev_copy(const struct dtc_backend *be, void *dst, const void *src, uint64_t bytes, int dir)
{
	if (!be || !be->ops || !be->ops->mem_copy || (bytes && (!dst || !src)))
		return DTC_EINVAL;
	return bytes ? be->ops->mem_copy(dst, src, bytes, dir) : DTC_OK;
}

int dtc_dev_ipc_open(const struct dtc_backend *be, const void *handle, size_t len, void **base,
		     uint64_t *bytes)
{
	if (!dtc_dev_has(be) || !handle || !base || !bytes)
		return DTC_EINVAL;
	return be->ops->ipc_open(handle, len, base, bytes);
}

void dtc_dev_ipc_close(const struct dtc_backend *be, void *base)
{
	if (base && dtc_dev_has(be))
		be->ops->ipc_close(base);
}

int dtc_dev_event_open(const struct dtc_backend *be, const void *handle, size_t len, void **ev)
{
	if (!dtc_dev_has(be) || !be->ops->event_open || !handle || !ev)
		return DTC_EINVAL;
	return be->ops->event_open(handle, len, ev);
}

int dtc_dev_event_wait(const struct dtc_backend *be, void *ev)
{
	if (!dtc_dev_has(be) || !be->ops->event_wait || !ev)
		return DTC_EINVAL;
	return be->ops->event_wait(ev);
}

void dtc_dev_event_close(const struct dtc_backend *be, void *ev)
{
	if (ev && dtc_dev_has(be) && be->ops->event_close)
		be->ops->event_close(ev);
}

static uint64_t host_box_sum(const struct dte_box_map *e, const uint16_t *dst)
{
	int64_t idx[DTE_MAX_DIMS] = { 0 };
	int last = (int)e->ndim - 1, d;
	uint64_t sum = 0;

	for (;;) {
		int64_t base = e->dst_offset;

		for (d = 0; d < last; d++)
			base += idx[d] * e->dst_stride[d];
		for (int64_t i = 0; i < e->extent[last]; i++) {
			int64_t at = base + i * e->dst_stride[last];

			sum += dtc_csum_term((uint64_t)at, dst[at]);
		}
		for (d = last - 1; d >= 0 && ++idx[d] == e->extent[d]; d--)
			idx[d] = 0;
		if (d < 0)
			return sum;
	}
}

int dtc_checksum_box(const struct dtc_backend *be, const struct dte_box_map *e,
		     const uint16_t *dst, uint64_t dst_len, uint64_t *sum)
{
	struct dte_box_map ce;
	uint64_t s = 0;
	int rc;

	if (!be || !be->ops || !dst || !sum)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, UINT64_MAX, dst_len)) != DTC_OK)
		return rc;
	box_coalesce(e, BOX_DST, &ce);
	if (be->ops->checksum_box)
		rc = be->ops->checksum_box(&ce, dst, &s);
	else
		s = host_box_sum(&ce, dst);
	if (rc == DTC_OK)
		*sum = s;
	return rc;
}

int dtc_dev_event_export(const struct dtc_backend *be, void **ev, void *handle, size_t len)
{
	if (!dtc_dev_has(be) || !be->ops->event_export || !ev || !handle)
		return DTC_EINVAL;
	return be->ops->event_export(ev, handle, len);
}

int dtc_dev_event_record(const struct dtc_backend *be, void *ev)
{
	if (!dtc_dev_has(be) || !be->ops->event_record || !ev)
		return DTC_EINVAL;
	return be->ops->event_record(ev);
}

void dtc_dev_event_destroy(const struct dtc_backend *be, void *ev)
{
	if (ev && dtc_dev_has(be) && be->ops->event_destroy)
		be->ops->event_destroy(ev);
}
