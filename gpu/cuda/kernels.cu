/* dte-cuda.so — the cuda backend as a dlopen()ed plugin (static cudart).
 *
 * Same element math as the cpu backend (gpu/elem.h, built with
 * --fmad=false), so outputs match it bit for bit.  Detect is two passes
 * like the cpu one: scan writes the changed bitmap (a warp's ballot is one
 * 32-bit half of a bitmap word, so no two warps share a word and no store
 * needs an atomic) and the count; sparse_from_bitmap prefix-sums per-word
 * populations (cub) and each word's thread writes its run of output slots,
 * so the output is sorted and deterministic.
 *
 * Every op runs on the legacy default stream and returns once its results
 * are usable by the caller (host outputs copied back, device outputs
 * complete), so a caller never needs a sync of its own.  Small scratch
 * (counters, per-word counts, cub's temp) is kept per process and only
 * grows: cudaMalloc/cudaFree per call cost more than a 2^28-element scan's
 * kernels (cudaFree synchronises the whole device).  A mutex guards it;
 * ops are synchronous anyway.
 *
 * The engine's GPU path (daemon/job_cuda.c) also needs CUDA IPC: opened
 * memory handles are cached by handle and reference-counted, because a
 * process may open a given handle only once and torch hands out one handle
 * per caching-allocator segment, shared by every tensor inside it. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cub/device/device_scan.cuh>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/plugin.h"
#include "gpu/compute.h"

#define THREADS 256

static int grid_for(uint64_t n)
{
	uint64_t b = (n + THREADS - 1) / THREADS;

	return (int)(b < 1 ? 1 : b > 65535ull * 8 ? 65535 * 8 : b);
}

/* The entry was validated by the caller (gpu/compute.c). */
static uint64_t box_size_h(const struct dte_box_map *e)
{
	uint64_t n = 1;

	for (uint32_t d = 0; d < e->ndim; d++)
		n *= (uint64_t)e->extent[d];
	return n;
}

static int cu_err(cudaError_t e)
{
	if (e != cudaSuccess) {
		fprintf(stderr, "dte-cuda: %s\n", cudaGetErrorString(e));
		return DTC_EDEVICE;
	}
	return DTC_OK;
}

/* Launch errors now, execution errors once the stream drained. */
static int check(cudaError_t e)
{
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	return cu_err(e);
}

/* Process-wide scratch, grow-only; hold `lk` while using it. */
enum { SCR_SMALL, SCR_WC, SCR_OFF, SCR_TMP, SCR_N };
static struct {
	void *p[SCR_N];
	size_t len[SCR_N];
} scr;
static pthread_mutex_t lk = PTHREAD_MUTEX_INITIALIZER;

static void *scratch(int slot, size_t bytes)
{
	void *p;

	if (bytes <= scr.len[slot])
		return scr.p[slot];
	if (bytes < 2 * scr.len[slot])
		bytes = 2 * scr.len[slot];
	if (cudaMalloc(&p, bytes) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	cudaFree(scr.p[slot]);
	scr.p[slot] = p;
	scr.len[slot] = bytes;
	return p;
}

/* Source / destination index of box position p (row-major over extent). */
__device__ __forceinline__ int64_t src_of(const struct dte_box_map &e, uint64_t p)
{
	int64_t idx = e.src_offset;

	if (e.ndim == 1)
		return idx + (int64_t)p * e.src_stride[0];
	for (uint32_t d = e.ndim; d-- > 0;) {
		uint64_t ext = (uint64_t)e.extent[d];

		idx += (int64_t)(p % ext) * e.src_stride[d];
		p /= ext;
	}
	return idx;
}

__device__ __forceinline__ int64_t dst_of(const struct dte_box_map &e, uint64_t p)
{
	int64_t idx = e.dst_offset;

	if (e.ndim == 1)
		return idx + (int64_t)p * e.dst_stride[0];
	for (uint32_t d = e.ndim; d-- > 0;) {
		uint64_t ext = (uint64_t)e.extent[d];

		idx += (int64_t)(p % ext) * e.dst_stride[d];
		p /= ext;
	}
	return idx;
}

/* dtc_adamw_flag() with the variant fixed at compile time. */
template <int VARIANT>
__device__ __forceinline__ int flag_of(const struct dtc_consts &k, float ps, float ms, float vs)
{
	if (dtc_adamw_quiet(&k, ps, ms, vs))
		return 0;
	return dtc_adamw_changed_u(&k, ps, VARIANT == DTC_VARIANT_FUSED ? dtc_adamw_u_fused(&k, ms, vs)
									: dtc_adamw_u_torch(&k, ms, vs));
}

/* Store one 32-bit half of a bitmap word; `base` is its first position. */
__device__ __forceinline__ unsigned put_bits(uint32_t *bitmap, uint64_t base, uint64_t size,
					     unsigned bits, int mode)
{
	unsigned valid = size - base >= 32 ? 0xffffffffu : (1u << (unsigned)(size - base)) - 1;

	if (mode == DTC_SCAN_OR)
		bits |= bitmap[base / 32] & valid;
	bitmap[base / 32] = bits;
	return (unsigned)__popc(bits);
}

/* Any box: one element per thread, a warp's ballot is one 32-bit half. */
template <int VARIANT>
__global__ void scan_kernel(struct dte_box_map e, struct dtc_consts k, const float *__restrict__ p,
			    const float *__restrict__ m, const float *__restrict__ v,
			    uint32_t *bitmap, int mode, uint64_t size, unsigned long long *count)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	uint64_t limit = (size + 31) / 32 * 32;	/* whole warps take part */
	unsigned lane = threadIdx.x & 31, local = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < limit; i += stride) {
		int f = 0;
		unsigned bits;

		if (i < size) {
			int64_t s = src_of(e, i);

			f = flag_of<VARIANT>(k, p[s], m[s], v[s]);
		}
		bits = __ballot_sync(0xffffffffu, f);
		if (lane == 0)
			local += put_bits(bitmap, i, size, bits, mode);
	}
	if (lane == 0 && local)
		atomicAdd(count, (unsigned long long)local);
}

/* Contiguous, 16-byte aligned sources (what box_coalesce makes of most
 * entries): each thread loads four elements of each array with one
 * 16-byte load, so four times the bytes are in flight per thread and the
 * scan runs at memory speed.  Lane L holds elements 4L..4L+3 of the warp's
 * 128 as a nibble; eight lanes OR their nibbles into one 32-bit half.
 * (Compacting the elements that fail the quiet test across the warp, so
 * the full inverse runs ceil(n/32) times instead of up to four, measured no
 * faster on an H200: divergence is not what bounds this kernel.) */
template <int VARIANT>
__global__ void scan4_kernel(struct dtc_consts k, const float4 *__restrict__ p,
			     const float4 *__restrict__ m, const float4 *__restrict__ v,
			     uint32_t *bitmap, int mode, uint64_t size, unsigned long long *count)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	uint64_t quads = (size + 3) / 4, limit = (quads + 31) / 32 * 32;
	unsigned lane = threadIdx.x & 31, local = 0;

	for (uint64_t q = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; q < limit; q += stride) {
		unsigned nib = 0, w;

		if (q * 4 + 3 < size) {
			float4 a = p[q], b = m[q], c = v[q];

			nib = (unsigned)flag_of<VARIANT>(k, a.x, b.x, c.x) |
			      (unsigned)flag_of<VARIANT>(k, a.y, b.y, c.y) << 1 |
			      (unsigned)flag_of<VARIANT>(k, a.z, b.z, c.z) << 2 |
			      (unsigned)flag_of<VARIANT>(k, a.w, b.w, c.w) << 3;
		} else if (q < quads) {
			const float *pf = (const float *)p, *mf = (const float *)m;
			const float *vf = (const float *)v;

			for (uint64_t j = q * 4; j < size; j++)
				nib |= (unsigned)flag_of<VARIANT>(k, pf[j], mf[j], vf[j]) << (j - q * 4);
		}
		w = nib << (4 * (lane & 7));
		w |= __shfl_xor_sync(0xffffffffu, w, 1);
		w |= __shfl_xor_sync(0xffffffffu, w, 2);
		w |= __shfl_xor_sync(0xffffffffu, w, 4);
		if ((lane & 7) == 0 && q * 4 < size)
			local += put_bits(bitmap, q * 4, size, w, mode);
	}
	local += __shfl_xor_sync(0xffffffffu, local, 8);
	local += __shfl_xor_sync(0xffffffffu, local, 16);
	if (lane == 0 && local)
		atomicAdd(count, (unsigned long long)local);
}

static int aligned16(const void *a)
{
	return ((uintptr_t)a & 15) == 0;
}

template <int VARIANT>
static void scan_launch(const struct dte_box_map *e, const struct dtc_consts *k, const float *param,
			const float *m, const float *v, uint32_t *bm32, int mode, uint64_t size,
			unsigned long long *dcount)
{
	const float *p1 = param + e->src_offset, *m1 = m + e->src_offset, *v1 = v + e->src_offset;

	if (e->ndim == 1 && e->src_stride[0] == 1 && aligned16(p1) && aligned16(m1) && aligned16(v1))
		scan4_kernel<VARIANT><<<grid_for((size + 3) / 4), THREADS>>>(
			*k, (const float4 *)p1, (const float4 *)m1, (const float4 *)v1, bm32, mode, size,
			dcount);
	else
		scan_kernel<VARIANT><<<grid_for(size), THREADS>>>(*e, *k, param, m, v, bm32, mode, size,
								   dcount);
}

static int cu_scan(const struct dte_box_map *e, const struct dtc_consts *k, const float *param,
		   const float *m, const float *v, uint64_t *bitmap, int mode, uint64_t *count)
{
	uint64_t size = box_size_h(e), words = (size + 63) / 64;
	unsigned long long *dcount, hcount = 0;
	uint32_t *bm32 = (uint32_t *)bitmap;
	int rc;

	pthread_mutex_lock(&lk);
	if (!(dcount = (unsigned long long *)scratch(SCR_SMALL, 64))) {
		pthread_mutex_unlock(&lk);
		return DTC_ENOMEM;
	}
	cudaMemsetAsync(dcount, 0, sizeof(*dcount));
	/* No warp covers the upper half of the last word when the box ends in
	 * its lower half; bits past the box end must read as zero. */
	if ((size + 31) / 32 < words * 2)
		cudaMemsetAsync(bm32 + words * 2 - 1, 0, 4);
	if (k->variant == DTC_VARIANT_FUSED)
		scan_launch<DTC_VARIANT_FUSED>(e, k, param, m, v, bm32, mode, size, dcount);
	else
		scan_launch<DTC_VARIANT_TORCH>(e, k, param, m, v, bm32, mode, size, dcount);
	/* The copy back waits for the kernel; no device-wide sync needed. */
	rc = cu_err(cudaGetLastError());
	if (rc == DTC_OK)
		rc = cu_err(cudaMemcpy(&hcount, dcount, sizeof(hcount), cudaMemcpyDeviceToHost));
	pthread_mutex_unlock(&lk);
	if (rc == DTC_OK)
		*count = hcount;
	return rc;
}

/* Population of each word, masked to the box; wc[words] = 0 so that an
 * exclusive scan over words + 1 leaves the total in its last slot. */
__global__ void word_count_kernel(const uint64_t *bitmap, uint64_t words, uint64_t size,
				  uint64_t *wc)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= words; i += stride) {
		uint64_t b = i < words ? bitmap[i] : 0;

		if (i == words - 1 && size % 64)
			b &= (1ull << (size % 64)) - 1;
		wc[i] = (uint64_t)__popcll(b);
	}
}

/* One thread per bitmap word writes that word's run of outputs: adjacent
 * threads write adjacent runs, and only changed elements' θ is read. */
__global__ void fill_kernel(struct dte_box_map e, const uint64_t *bitmap, const uint64_t *off,
			    const float *param, uint64_t words, uint64_t size, uint64_t *pos,
			    uint16_t *val)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
		uint64_t w = bitmap[i], o = off[i];

		if (i == words - 1 && size % 64)
			w &= (1ull << (size % 64)) - 1;
		while (w) {
			uint64_t at = i * 64 + (uint64_t)(__ffsll((long long)w) - 1);

			pos[o] = at;
			val[o] = dtc_bf16_rne(param[src_of(e, at)]);
			o++;
			w &= w - 1;
		}
	}
}

static int cu_sparse(const struct dte_box_map *e, const uint64_t *bitmap, const float *param,
		     uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *n)
{
	uint64_t size = box_size_h(e), words = (size + 63) / 64, total = 0;
	uint64_t *wc, *off;
	void *tmp;
	size_t tmp_bytes = 0;
	int rc = DTC_ENOMEM;

	pthread_mutex_lock(&lk);
	wc = (uint64_t *)scratch(SCR_WC, (words + 1) * 8);
	off = (uint64_t *)scratch(SCR_OFF, (words + 1) * 8);
	cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, wc, off, (int64_t)(words + 1));
	tmp = scratch(SCR_TMP, tmp_bytes ? tmp_bytes : 1);
	if (!wc || !off || !tmp)
		goto out;
	word_count_kernel<<<grid_for(words + 1), THREADS>>>(bitmap, words, size, wc);
	cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, wc, off, (int64_t)(words + 1));
	if ((rc = cu_err(cudaGetLastError())) != DTC_OK ||
	    (rc = cu_err(cudaMemcpy(&total, off + words, 8, cudaMemcpyDeviceToHost))) != DTC_OK)
		goto out;
	if (total > cap) {
		rc = DTC_ENOSPC;
		goto out;
	}
	if (total) {
		fill_kernel<<<grid_for(words), THREADS>>>(*e, bitmap, off, param, words, size, pos, val);
		if ((rc = check(cudaGetLastError())) != DTC_OK)
			goto out;
	}
	*n = total;
	rc = DTC_OK;
out:
	pthread_mutex_unlock(&lk);
	return rc;
}

__global__ void extract_kernel(struct dte_box_map e, const float *param, uint64_t size, uint16_t *out)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < size; i += stride)
		out[i] = dtc_bf16_rne(param[src_of(e, i)]);
}

static int cu_extract(const struct dte_box_map *e, const float *param, uint16_t *out)
{
	uint64_t size = box_size_h(e);

	extract_kernel<<<grid_for(size), THREADS>>>(*e, param, size, out);
	return check(cudaGetLastError());
}

__global__ void range_check_kernel(const uint64_t *pos, uint64_t n, uint64_t size, int *bad)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		if (pos[i] >= size)
			*bad = 1;
}

__global__ void scatter_kernel(struct dte_box_map e, const uint64_t *pos, const uint16_t *val,
			       uint64_t n, uint16_t *dst)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		dst[dst_of(e, pos[i])] = val[i];
}

static int cu_scatter(const struct dte_box_map *e, const uint64_t *pos, const uint16_t *val,
		      uint64_t n, uint16_t *dst)
{
	int *dbad, bad = 0, rc;

	pthread_mutex_lock(&lk);
	if (!(dbad = (int *)scratch(SCR_SMALL, 64))) {
		pthread_mutex_unlock(&lk);
		return DTC_ENOMEM;
	}
	cudaMemsetAsync(dbad, 0, sizeof(int));
	range_check_kernel<<<grid_for(n), THREADS>>>(pos, n, box_size_h(e), dbad);
	rc = cu_err(cudaGetLastError());
	if (rc == DTC_OK)
		rc = cu_err(cudaMemcpy(&bad, dbad, sizeof(int), cudaMemcpyDeviceToHost));
	pthread_mutex_unlock(&lk);
	if (rc != DTC_OK)
		return rc;
	if (bad)
		return DTC_ERANGE;
	scatter_kernel<<<grid_for(n), THREADS>>>(*e, pos, val, n, dst);
	return check(cudaGetLastError());
}

__global__ void dense_apply_kernel(struct dte_box_map e, const uint16_t *vals, uint64_t size,
				   uint16_t *dst)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < size; i += stride)
		dst[dst_of(e, i)] = vals[i];
}

static int cu_dense_apply(const struct dte_box_map *e, const uint16_t *vals, uint16_t *dst)
{
	uint64_t size = box_size_h(e);

	dense_apply_kernel<<<grid_for(size), THREADS>>>(*e, vals, size, dst);
	return check(cudaGetLastError());
}

__device__ __forceinline__ void reduce_add(unsigned long long s, unsigned long long *sum)
{
	for (int o = 16; o > 0; o /= 2)
		s += __shfl_down_sync(0xffffffffu, s, o);
	if ((threadIdx.x & 31) == 0)
		atomicAdd(sum, s);
}

__global__ void csum_buf_kernel(const uint16_t *buf, uint64_t len, unsigned long long *sum)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	unsigned long long s = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += stride)
		s += dtc_csum_term(i, buf[i]);
	reduce_add(s, sum);
}

__global__ void csum_entry_kernel(struct dte_box_map e, const float *param, uint64_t size,
				  unsigned long long *sum)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	unsigned long long s = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < size; i += stride)
		s += dtc_csum_term((uint64_t)dst_of(e, i), dtc_bf16_rne(param[src_of(e, i)]));
	reduce_add(s, sum);
}

/* Σ mix(dst index, dst[dst index]) over the box: what a sink holds where
 * the entry wrote, compared after apply with what the sources computed. */
__global__ void csum_box_kernel(struct dte_box_map e, const uint16_t *dst, uint64_t size,
				unsigned long long *sum)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
	unsigned long long s = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < size; i += stride) {
		int64_t at = dst_of(e, i);

		s += dtc_csum_term((uint64_t)at, dst[at]);
	}
	reduce_add(s, sum);
}

/* Run one reduction into the scratch sum and copy it back. */
#define CSUM_RUN(launch, out) do { \
	unsigned long long *dsum_, h_ = 0; \
	int rc_; \
	pthread_mutex_lock(&lk); \
	if (!(dsum_ = (unsigned long long *)scratch(SCR_SMALL, 64))) { \
		pthread_mutex_unlock(&lk); \
		return DTC_ENOMEM; \
	} \
	cudaMemsetAsync(dsum_, 0, sizeof(*dsum_)); \
	launch; \
	rc_ = cu_err(cudaGetLastError()); \
	if (rc_ == DTC_OK) \
		rc_ = cu_err(cudaMemcpy(&h_, dsum_, sizeof(h_), cudaMemcpyDeviceToHost)); \
	pthread_mutex_unlock(&lk); \
	if (rc_ == DTC_OK) \
		*(out) = h_; \
	return rc_; \
} while (0)

static int cu_checksum_buffer(const uint16_t *buf, uint64_t len, uint64_t *sum)
{
	CSUM_RUN((csum_buf_kernel<<<grid_for(len), THREADS>>>(buf, len, dsum_)), sum);
}

static int cu_checksum_entry(const struct dte_box_map *e, const float *param, uint64_t *sum)
{
	uint64_t size = box_size_h(e);

	CSUM_RUN((csum_entry_kernel<<<grid_for(size), THREADS>>>(*e, param, size, dsum_)), sum);
}

static int cu_checksum_box(const struct dte_box_map *e, const uint16_t *dst, uint64_t *sum)
{
	uint64_t size = box_size_h(e);

	CSUM_RUN((csum_box_kernel<<<grid_for(size), THREADS>>>(*e, dst, size, dsum_)), sum);
}

static void *cu_alloc(uint64_t bytes)
{
	void *p = NULL;

	return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

static void cu_free(void *p)
{
	cudaFree(p);
}

static int cu_copy(void *dst, const void *src, uint64_t bytes, int dir)
{
	static const cudaMemcpyKind kinds[3] = {
		cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice
	};

	if (dir < 0 || dir > 2)
		return DTC_EINVAL;
	return cudaMemcpy(dst, src, bytes, kinds[dir]) == cudaSuccess ? DTC_OK : DTC_EDEVICE;
}

static int cu_set(void *dst, int byte, uint64_t bytes)
{
	return check(cudaMemset(dst, byte, bytes));
}

static int cu_time_copy(void *dst, const void *src, uint64_t bytes, int iters, double *ms)
{
	cudaEvent_t a, b;
	float t = 0;
	int rc;

	cudaEventCreate(&a);
	cudaEventCreate(&b);
	cudaEventRecord(a);
	for (int i = 0; i < iters; i++)
		cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
	cudaEventRecord(b);
	rc = check(cudaEventSynchronize(b));
	cudaEventElapsedTime(&t, a, b);
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	*ms = t;
	return rc;
}

/* Opened IPC handles (memory and events), keyed by the handle's bytes. */
struct ipc_open_rec {
	unsigned char handle[64];
	int is_event;
	void *obj;		/* device base, or the cudaEvent_t */
	uint64_t bytes;
	unsigned refs;
	struct ipc_open_rec *next;
};
static struct ipc_open_rec *ipc_list;

static struct ipc_open_rec *ipc_find(const void *handle, int is_event)
{
	for (struct ipc_open_rec *r = ipc_list; r; r = r->next)
		if (r->is_event == is_event && !memcmp(r->handle, handle, 64))
			return r;
	return NULL;
}

static struct ipc_open_rec *ipc_add(const void *handle, int is_event, void *obj, uint64_t bytes)
{
	struct ipc_open_rec *r = (struct ipc_open_rec *)calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	memcpy(r->handle, handle, 64);
	r->is_event = is_event;
	r->obj = obj;
	r->bytes = bytes;
	r->refs = 1;
	r->next = ipc_list;
	ipc_list = r;
	return r;
}

static void ipc_unlink(struct ipc_open_rec *r)
{
	for (struct ipc_open_rec **pp = &ipc_list; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	}
	free(r);
}

/* The allocation's size comes from the driver (cuMemGetAddressRange),
 * reached through cudart so the plugin still links no libcuda. */
typedef CUresult (*addr_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

static int alloc_range(void *p, uint64_t *bytes)
{
	static addr_range_fn fn;
	cudaDriverEntryPointQueryResult q;
	CUdeviceptr base = 0;
	size_t size = 0;

	if (!fn && (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&fn, 12000,
						     cudaEnableDefault, &q) != cudaSuccess ||
		    q != cudaDriverEntryPointSuccess || !fn)) {
		fn = NULL;
		return DTC_EDEVICE;
	}
	if (fn(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS ||
	    (CUdeviceptr)(uintptr_t)p < base || (CUdeviceptr)(uintptr_t)p - base >= size)
		return DTC_EDEVICE;
	*bytes = size - ((CUdeviceptr)(uintptr_t)p - base);
	return DTC_OK;
}

static int cu_ipc_open(const void *handle, uint64_t len, void **base, uint64_t *bytes)
{
	cudaIpcMemHandle_t h;
	struct ipc_open_rec *r;
	void *p = NULL;
	uint64_t size = 0;
	int rc = DTC_OK;

	if (!handle || len != sizeof(h))
		return DTC_EINVAL;
	memcpy(&h, handle, sizeof(h));
	pthread_mutex_lock(&lk);
	if ((r = ipc_find(handle, 0))) {
		r->refs++;
		p = r->obj;
		size = r->bytes;
	} else if ((rc = cu_err(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess))) == DTC_OK) {
		if ((rc = alloc_range(p, &size)) != DTC_OK || !ipc_add(handle, 0, p, size)) {
			cudaIpcCloseMemHandle(p);
			rc = rc != DTC_OK ? rc : DTC_ENOMEM;
		}
	} else {
		cudaGetLastError();
	}
	pthread_mutex_unlock(&lk);
	if (rc == DTC_OK) {
		*base = p;
		*bytes = size;
	}
	return rc;
}

static int cu_ipc_close(void *base)
{
	int rc = DTC_EINVAL;

	pthread_mutex_lock(&lk);
	for (struct ipc_open_rec *r = ipc_list; r; r = r->next) {
		if (r->is_event || r->obj != base)
			continue;
		rc = DTC_OK;
		if (--r->refs == 0) {
			/* Work still queued on the mapping must finish first. */
			cudaDeviceSynchronize();
			rc = cu_err(cudaIpcCloseMemHandle(base));
			ipc_unlink(r);
		}
		break;
	}
	pthread_mutex_unlock(&lk);
	return rc;
}

static int cu_event_open(const void *handle, uint64_t len, void **ev)
{
	cudaIpcEventHandle_t h;
	struct ipc_open_rec *r;
	cudaEvent_t e = NULL;
	int rc = DTC_OK;

	if (!handle || len != sizeof(h))
		return DTC_EINVAL;
	memcpy(&h, handle, sizeof(h));
	pthread_mutex_lock(&lk);
	if ((r = ipc_find(handle, 1))) {
		r->refs++;
		e = (cudaEvent_t)r->obj;
	} else if ((rc = cu_err(cudaIpcOpenEventHandle(&e, h))) == DTC_OK) {
		if (!ipc_add(handle, 1, (void *)e, 0)) {
			cudaEventDestroy(e);
			rc = DTC_ENOMEM;
		}
	} else {
		cudaGetLastError();
	}
	pthread_mutex_unlock(&lk);
	if (rc == DTC_OK)
		*ev = (void *)e;
	return rc;
}

/* Ops run on the legacy default stream, so one wait orders all of them. */
static int cu_event_wait(void *ev)
{
	return cu_err(cudaStreamWaitEvent(0, (cudaEvent_t)ev, 0));
}

static void cu_event_close(void *ev)
{
	pthread_mutex_lock(&lk);
	for (struct ipc_open_rec *r = ipc_list; r; r = r->next) {
		if (!r->is_event || r->obj != ev)
			continue;
		if (--r->refs == 0) {
			cudaEventDestroy((cudaEvent_t)ev);
			ipc_unlink(r);
		}
		break;
	}
	pthread_mutex_unlock(&lk);
}

/* ABI 3: the daemon's side of the two-way handshake.  The trainer's
 * stream waits (cudaStreamWaitEvent on the handle it opened with
 * cudaIpcOpenEventHandle, torch.cuda.Event.from_ipc_handle) on this event,
 * which the daemon records after its capture kernels; interprocess events
 * must be created with cudaEventDisableTiming (CUDA runtime API,
 * cudaIpcGetEventHandle). */
static int cu_event_export(void **ev, void *handle, uint64_t len)
{
	cudaIpcEventHandle_t h;
	cudaEvent_t e = NULL;
	int rc;

	if (!ev || !handle || len < sizeof(h))
		return DTC_EINVAL;
	if ((rc = cu_err(cudaEventCreateWithFlags(&e, cudaEventInterprocess |
						       cudaEventDisableTiming))) != DTC_OK) {
		cudaGetLastError();
		return rc;
	}
	if ((rc = cu_err(cudaIpcGetEventHandle(&h, e))) != DTC_OK) {
		cudaGetLastError();
		cudaEventDestroy(e);
		return rc;
	}
	memcpy(handle, &h, sizeof(h));
	*ev = (void *)e;
	return DTC_OK;
}

/* Ops run on the legacy default stream: recorded there, the event follows
 * every kernel and copy enqueued before it. */
static int cu_event_record(void *ev)
{
	return ev ? cu_err(cudaEventRecord((cudaEvent_t)ev, 0)) : DTC_EINVAL;
}

static void cu_event_destroy(void *ev)
{
	if (ev)
		cudaEventDestroy((cudaEvent_t)ev);
}

static const struct dtc_backend_ops cuda_ops = {
	cu_scan, cu_sparse, cu_extract, cu_scatter, cu_dense_apply, cu_checksum_buffer,
	cu_checksum_entry, cu_alloc, cu_free, cu_copy, cu_set, cu_time_copy, NULL,
	cu_checksum_box, cu_ipc_open, cu_ipc_close, cu_event_open, cu_event_wait, cu_event_close,
	NULL, cu_event_export, cu_event_record, cu_event_destroy,
};

extern "C" int dtc_cuda_plugin_open(unsigned abi, const struct dtc_backend_ops **ops,
				    char *device, unsigned devlen, char *why, unsigned whylen)
{
	struct cudaDeviceProp prop;
	int count = 0;
	cudaError_t e;

	if (abi != DTC_PLUGIN_ABI) {
		snprintf(why, whylen, "plugin ABI %u, caller wants %u", DTC_PLUGIN_ABI, abi);
		return DTC_EINVAL;
	}
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		snprintf(why, whylen, "no CUDA device (%s)",
			 e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
		return DTC_EDEVICE;
	}
	if ((e = cudaSetDevice(0)) != cudaSuccess ||
	    (e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
		snprintf(why, whylen, "CUDA device 0 unusable: %s", cudaGetErrorString(e));
		return DTC_EDEVICE;
	}
	if (prop.major != 9) {
		snprintf(why, whylen, "%s is sm_%d%d; this plugin is built for sm_90", prop.name,
			 prop.major, prop.minor);
		return DTC_EDEVICE;
	}
	snprintf(device, devlen, "%s (sm_%d%d, %.0f GiB)", prop.name, prop.major, prop.minor,
		 prop.totalGlobalMem / 1073741824.0);
	*ops = &cuda_ops;
	return DTC_OK;
}
