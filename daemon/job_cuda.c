/* daemon/job_cuda.c — the GPU path of the sync engine: CUDA IPC buffers,
 * the trainer's event, and kernel calls over device memory with host-side
 * staging (daemon/job_cuda.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "daemon/derr.h"
#include "daemon/job_cuda.h"
#include "daemon/log.h"
#include "gpu/backend.h"

#define FAIL(rc, ...) derr_fail(err, errlen, rc, __VA_ARGS__)

/* Process-level, not engine state (struct dte_engine), and said so: the
 * device, the CUDA buffers opened (buf.c's buffers are the process's,
 * reached through dbuf_dev_ops) and the device scratch are resources of
 * the process, shared by whatever engines it holds; the first
 * dte_engine_new sets them up and the last dte_engine_free ends them
 * (jcuda_init, jcuda_fini count the engines, on the thread that makes and
 * frees them). */
static const struct dtc_backend *dev;	/* NULL: no GPU path */
static unsigned engines;		/* alive: jcuda_init'ed, not fini'ed */

/* Opened device buffers, [lo, hi) each; read by capture workers while the
 * loop registers and releases, hence the lock. */
struct range {
	uintptr_t lo, hi;
	struct range *next;
};
static struct range *ranges;
static pthread_mutex_t range_lock = PTHREAD_MUTEX_INITIALIZER;

/* Device staging, grow-only: one set for capture, one for apply (both on
 * worker threads: daemon/job_task.c), so an apply never waits behind a
 * long capture's scratch.  Held for the whole call. */
enum { SCR_A, SCR_B, SCR_N };
struct scratch {
	pthread_mutex_t lock;
	void *p[SCR_N];
	uint64_t len[SCR_N];
};
static struct scratch cap_scr = { PTHREAD_MUTEX_INITIALIZER, { 0 }, { 0 } };
static struct scratch app_scr = { PTHREAD_MUTEX_INITIALIZER, { 0 }, { 0 } };

static const struct dbuf_dev_ops dev_ops = { jcuda_buf_open, jcuda_buf_close };

void jcuda_init(const struct dtc_backend *be)
{
	if (engines++)
		return;		/* the process's, set up by the first engine */
	dev = dtc_dev_has(be) ? be : NULL;
	/* buf.c opens and closes CUDA buffers through these (buf.h); they
	 * stay installed past jcuda_fini, for dbuf_fini. */
	dbuf_set_dev_ops(&dev_ops);
}

static void scratch_free(struct scratch *s)
{
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < SCR_N; i++) {
		dtc_dev_free(dev, s->p[i]);
		s->p[i] = NULL;
		s->len[i] = 0;
	}
	pthread_mutex_unlock(&s->lock);
}

int jcuda_fini(void)
{
	if (!engines || --engines)
		return 0;	/* another engine still uses them */
	if (dev) {
		scratch_free(&cap_scr);
		scratch_free(&app_scr);
	}
	return 1;
}

/* s->lock held. */
static void *scratch_get(struct scratch *s, int slot, uint64_t bytes)
{
	void *p;

	if (bytes <= s->len[slot])
		return s->p[slot];
	if (bytes < s->len[slot] + s->len[slot] / 2)
		bytes = s->len[slot] + s->len[slot] / 2;
	dtc_dev_free(dev, s->p[slot]);
	s->p[slot] = NULL;
	s->len[slot] = 0;
	if (!(p = dtc_dev_alloc(dev, bytes)))
		return NULL;
	s->p[slot] = p;
	s->len[slot] = bytes;
	return p;
}

int jcuda_is_dev(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	int hit = 0;

	if (!dev || !p)
		return 0;
	pthread_mutex_lock(&range_lock);
	for (struct range *r = ranges; r && !hit; r = r->next)
		hit = a >= r->lo && a < r->hi;
	pthread_mutex_unlock(&range_lock);
	return hit;
}

int jcuda_buf_open(struct dbuf *b, const void *handle, size_t handle_len, const void *event,
		   size_t event_len, uint64_t offset, char *err, size_t errlen)
{
	uint64_t need = b->length * dbuf_elem_size(b->dtype), bytes = 0;
	struct range *r = NULL;
	void *base = NULL, *ev = NULL;
	int rc;

	if (!dev)
		return FAIL(-EOPNOTSUPP, "no CUDA device: CUDA IPC handles cannot be opened");
	if ((rc = dtc_dev_ipc_open(dev, handle, handle_len, &base, &bytes)) != DTC_OK)
		return FAIL(-EINVAL, "cannot open the CUDA IPC handle (%zu bytes): %s "
			    "(a cudaIpcMemHandle_t of device %d is 64 bytes)", handle_len,
			    dtc_strerror(rc), b->device);
	/* The client's length and offset must stay inside what it shares,
	 * or kernels would read and write another allocation. */
	if (offset > bytes || bytes - offset < need) {
		rc = FAIL(-EINVAL, "range [%llu, %llu) is outside the %llu-byte CUDA allocation",
			(unsigned long long)offset, (unsigned long long)(offset + need),
			(unsigned long long)bytes);
		goto fail;
	}
	if (event_len && (rc = dtc_dev_event_open(dev, event, event_len, &ev)) != DTC_OK) {
		rc = FAIL(-EINVAL, "cannot open the CUDA IPC event handle (%zu bytes): %s",
			  event_len, dtc_strerror(rc));
		goto fail;
	}
	if (!(r = calloc(1, sizeof(*r)))) {
		rc = FAIL(-ENOMEM, "out of memory");
		goto fail;
	}
	b->map = base;
	b->ptr = (uint8_t *)base + offset;
	b->ipc_ev = ev;
	r->lo = (uintptr_t)b->ptr;
	r->hi = r->lo + need;
	pthread_mutex_lock(&range_lock);
	r->next = ranges;
	ranges = r;
	pthread_mutex_unlock(&range_lock);
	DLOG_D("buffer %llu: CUDA IPC, %llu bytes at offset %llu of a %llu-byte allocation%s",
	       (unsigned long long)b->id, (unsigned long long)need, (unsigned long long)offset,
	       (unsigned long long)bytes, ev ? ", with event" : "");
	return 0;
fail:
	dtc_dev_event_close(dev, ev);
	dtc_dev_ipc_close(dev, base);
	return rc;
}

void jcuda_buf_close(struct dbuf *b)
{
	uintptr_t lo = (uintptr_t)b->ptr;

	if (!dev || !b->cuda || !b->map)
		return;
	pthread_mutex_lock(&range_lock);
	for (struct range **pp = &ranges; *pp; pp = &(*pp)->next) {
		if ((*pp)->lo == lo && (*pp)->hi == lo + b->length * dbuf_elem_size(b->dtype)) {
			struct range *r = *pp;

			*pp = r->next;
			free(r);
			break;
		}
	}
	pthread_mutex_unlock(&range_lock);
	dtc_dev_event_close(dev, b->ipc_ev);
	dtc_dev_ipc_close(dev, b->map);
	b->ipc_ev = NULL;
	b->map = NULL;
	b->ptr = NULL;
}

int jcuda_wait(const struct dbuf *b)
{
	if (!dev || !b->cuda || !b->ipc_ev)
		return 0;
	return dtc_dev_event_wait(dev, b->ipc_ev) == DTC_OK ? 0 : -EIO;
}

/* ------------------------------------------------------- capture (worker) */

int jdev_scan(const struct dte_box_map *e, const struct dtc_consts *k, const struct dtc_src *s,
	      uint64_t *bitmap, uint64_t words, int mode, uint64_t *count)
{
	uint64_t *dbm;
	int rc;

	if (!s || !jcuda_is_dev(s->param))
		return dtc_scan(dtc_backend_cpu(), e, k, s, bitmap, words, mode, count);
	if (!bitmap || words < dtc_bitmap_words(e))
		return DTC_EINVAL;
	words = dtc_bitmap_words(e);
	pthread_mutex_lock(&cap_scr.lock);
	if (!(dbm = scratch_get(&cap_scr, SCR_A, words * 8)))
		rc = DTC_ENOMEM;
	else if (mode == DTC_SCAN_OR)
		rc = dtc_dev_copy(dev, dbm, bitmap, words * 8, 0);
	else
		rc = DTC_OK;
	if (rc == DTC_OK)
		rc = dtc_scan(dev, e, k, s, dbm, words, mode, count);
	if (rc == DTC_OK)
		rc = dtc_dev_copy(dev, bitmap, dbm, words * 8, 1);
	pthread_mutex_unlock(&cap_scr.lock);
	return rc;
}

int jdev_sparse_from_bitmap(const struct dte_box_map *e, const uint64_t *bitmap, uint64_t words,
			    const float *param, uint64_t param_len, uint64_t *pos, uint16_t *val,
			    uint64_t cap, uint64_t *n)
{
	uint64_t *dbm, *dpos, got = 0;
	uint16_t *dval;
	int rc;

	if (!jcuda_is_dev(param))
		return dtc_sparse_from_bitmap(dtc_backend_cpu(), e, bitmap, words, param, param_len,
					      pos, val, cap, n);
	if (!bitmap || words < dtc_bitmap_words(e) || !n || (cap && (!pos || !val)))
		return DTC_EINVAL;
	words = dtc_bitmap_words(e);
	pthread_mutex_lock(&cap_scr.lock);
	dbm = scratch_get(&cap_scr, SCR_A, words * 8);
	/* positions then values, in one slot */
	dpos = scratch_get(&cap_scr, SCR_B, cap * 10 + 16);
	dval = dpos ? (uint16_t *)(dpos + cap) : NULL;
	if (!dbm || !dpos)
		rc = DTC_ENOMEM;
	else
		rc = dtc_dev_copy(dev, dbm, bitmap, words * 8, 0);
	if (rc == DTC_OK)
		rc = dtc_sparse_from_bitmap(dev, e, dbm, words, param, param_len, dpos, dval, cap, &got);
	if (rc == DTC_OK)
		rc = dtc_dev_copy(dev, pos, dpos, got * 8, 1);
	if (rc == DTC_OK)
		rc = dtc_dev_copy(dev, val, dval, got * 2, 1);
	pthread_mutex_unlock(&cap_scr.lock);
	if (rc == DTC_OK)
		*n = got;
	return rc;
}

int jdev_dense_extract(const struct dte_box_map *e, const float *param, uint64_t param_len,
		       uint16_t *out)
{
	uint64_t box = dtc_box_size(e);
	uint16_t *dout;
	int rc;

	if (!jcuda_is_dev(param))
		return dtc_dense_extract(dtc_backend_cpu(), e, param, param_len, out);
	if (!out || !box)
		return out ? DTC_EBOX : DTC_EINVAL;
	pthread_mutex_lock(&cap_scr.lock);
	if (!(dout = scratch_get(&cap_scr, SCR_B, box * 2)))
		rc = DTC_ENOMEM;
	else
		rc = dtc_dense_extract(dev, e, param, param_len, dout);
	if (rc == DTC_OK)
		rc = dtc_dev_copy(dev, out, dout, box * 2, 1);
	pthread_mutex_unlock(&cap_scr.lock);
	return rc;
}

int jdev_checksum_entry(const struct dte_box_map *e, const float *param, uint64_t param_len,
			uint64_t *sum)
{
	return dtc_checksum_entry(jcuda_is_dev(param) ? dev : dtc_backend_cpu(), e, param, param_len,
				  sum);
}

/* ---------------------------------------------------------- apply (loop) */

int jdev_scatter_apply(const struct dte_box_map *e, const uint64_t *pos, const uint16_t *val,
		       uint64_t n, uint16_t *dst, uint64_t dst_len)
{
	uint64_t *dpos;
	uint16_t *dval;
	int rc;

	if (!jcuda_is_dev(dst))
		return dtc_scatter_apply(dtc_backend_cpu(), e, pos, val, n, dst, dst_len);
	if (n && (!pos || !val))
		return DTC_EINVAL;
	pthread_mutex_lock(&app_scr.lock);
	dpos = scratch_get(&app_scr, SCR_A, n * 8 + 8);
	dval = scratch_get(&app_scr, SCR_B, n * 2 + 2);
	if (!dpos || !dval)
		rc = DTC_ENOMEM;
	else
		rc = dtc_dev_copy(dev, dpos, pos, n * 8, 0);
	if (rc == DTC_OK)
		rc = dtc_dev_copy(dev, dval, val, n * 2, 0);
	/* positions are range-checked on the device before anything is written */
	if (rc == DTC_OK)
		rc = dtc_scatter_apply(dev, e, dpos, dval, n, dst, dst_len);
	pthread_mutex_unlock(&app_scr.lock);
	return rc;
}

int jdev_dense_apply(const struct dte_box_map *e, const uint16_t *vals, uint16_t *dst,
		     uint64_t dst_len)
{
	uint64_t box = dtc_box_size(e);
	uint16_t *dval;
	int rc;

	if (!jcuda_is_dev(dst))
		return dtc_dense_apply(dtc_backend_cpu(), e, vals, dst, dst_len);
	if (!vals || !box)
		return vals ? DTC_EBOX : DTC_EINVAL;
	pthread_mutex_lock(&app_scr.lock);
	if (!(dval = scratch_get(&app_scr, SCR_B, box * 2)))
		rc = DTC_ENOMEM;
	else
		rc = dtc_dev_copy(dev, dval, vals, box * 2, 0);
	if (rc == DTC_OK)
		rc = dtc_dense_apply(dev, e, dval, dst, dst_len);
	pthread_mutex_unlock(&app_scr.lock);
	return rc;
}

int jdev_checksum_box(const struct dte_box_map *e, const uint16_t *dst, uint64_t dst_len,
		      uint64_t *sum)
{
	return dtc_checksum_box(jcuda_is_dev(dst) ? dev : dtc_backend_cpu(), e, dst, dst_len, sum);
}

const struct dtc_backend *jdev_host(void)
{
	return dtc_backend_cpu();
}

/* The payload kernels read and write the destination from the host: a
 * device destination never reaches them (its entries are decoded into
 * positions and values, and applied by jdev_scatter_apply /
 * jdev_dense_apply); DTC_EINVAL says a caller broke that rule. */
int jdev_sparse_apply_payload(const struct dte_box_map *e, const uint8_t *in, size_t len,
			      uint16_t *dst, uint64_t dst_len, uint64_t *count, uint64_t *delta)
{
	if (jcuda_is_dev(dst))
		return DTC_EINVAL;
	return dtc_sparse_apply_payload(dtc_backend_cpu(), e, in, len, dst, dst_len, count, delta);
}

int jdev_sparse_swap_payload(const struct dte_box_map *e, uint8_t *in, size_t len, uint16_t *dst,
			     uint64_t dst_len, uint64_t *count, uint64_t *delta)
{
	if (jcuda_is_dev(dst))
		return DTC_EINVAL;
	return dtc_sparse_swap_payload(dtc_backend_cpu(), e, in, len, dst, dst_len, count, delta);
}

int jdev_sparse_readback_payload(const struct dte_box_map *e, const uint8_t *in, size_t len,
				 const uint16_t *dst, uint64_t dst_len, uint64_t *count,
				 uint64_t *delta)
{
	if (jcuda_is_dev(dst))
		return DTC_EINVAL;
	return dtc_sparse_readback_payload(dtc_backend_cpu(), e, in, len, dst, dst_len, count,
					   delta);
}

int jdev_dense_swap_payload(const struct dte_box_map *e, uint8_t *in, size_t len, uint16_t *dst,
			    uint64_t dst_len, uint64_t *sum_new)
{
	if (jcuda_is_dev(dst))
		return DTC_EINVAL;
	return dtc_dense_swap_payload(dtc_backend_cpu(), e, in, len, dst, dst_len, sum_new);
}
