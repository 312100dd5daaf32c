/* dte-cuda.so — the cuda backend as a dlopen()ed plugin (static cudart).
 *
 * Same element math as the cpu backend (gpu/elem.h, built with
 * --fmad=false), so outputs match it bit for bit.  Detect is two passes
 * like the cpu one: scan writes the changed bitmap (a warp's ballot is one
 * 32-bit half of a bitmap word, so no two warps share a word) and the
 * count; sparse_from_bitmap prefix-sums per-word populations (cub) and each
 * set bit writes its output slot, so the output is sorted and deterministic.
 * Every op is synchronous on the legacy default stream for now. */
#include <cuda_runtime.h>
#include <cub/device/device_scan.cuh>
#include <stdio.h>
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

static int check(cudaError_t e)
{
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	if (e != cudaSuccess) {
		fprintf(stderr, "dte-cuda: %s\n", cudaGetErrorString(e));
		return DTC_EDEVICE;
	}
	return DTC_OK;
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
			float ps = p[s], ms = m[s], vs = v[s];

			if (!dtc_adamw_quiet(&k, ps, ms, vs)) {
				float u = VARIANT == DTC_VARIANT_FUSED ? dtc_adamw_u_fused(&k, ms, vs)
								       : dtc_adamw_u_torch(&k, ms, vs);

				f = dtc_adamw_changed_u(&k, ps, u);
			}
		}
		bits = __ballot_sync(0xffffffffu, f);
		if (lane == 0) {
			uint64_t base = i - lane;
			unsigned valid = size - base >= 32 ? 0xffffffffu
							   : (1u << (unsigned)(size - base)) - 1;

			if (mode == DTC_SCAN_OR)
				bits |= bitmap[i / 32] & valid;
			bitmap[i / 32] = bits;
			local += __popc(bits);
		}
	}
	if (lane == 0 && local)
		atomicAdd(count, (unsigned long long)local);
}

static int cu_scan(const struct dte_box_map *e, const struct dtc_consts *k, const float *param,
		   const float *m, const float *v, uint64_t *bitmap, int mode, uint64_t *count)
{
	uint64_t size = box_size_h(e), words = (size + 63) / 64;
	unsigned long long *dcount, hcount = 0;
	uint32_t *bm32 = (uint32_t *)bitmap;
	int rc;

	if (cudaMalloc(&dcount, sizeof(*dcount)) != cudaSuccess)
		return DTC_ENOMEM;
	cudaMemset(dcount, 0, sizeof(*dcount));
	/* No warp covers the upper half of the last word when the box ends in
	 * its lower half; bits past the box end must read as zero. */
	if ((size + 31) / 32 < words * 2)
		cudaMemset(bm32 + words * 2 - 1, 0, 4);
	if (k->variant == DTC_VARIANT_FUSED)
		scan_kernel<DTC_VARIANT_FUSED><<<grid_for(size), THREADS>>>(*e, *k, param, m, v, bm32,
									     mode, size, dcount);
	else
		scan_kernel<DTC_VARIANT_TORCH><<<grid_for(size), THREADS>>>(*e, *k, param, m, v, bm32,
									     mode, size, dcount);
	rc = check(cudaGetLastError());
	if (rc == DTC_OK && cudaMemcpy(&hcount, dcount, sizeof(hcount), cudaMemcpyDeviceToHost) != cudaSuccess)
		rc = DTC_EDEVICE;
	cudaFree(dcount);
	if (rc == DTC_OK)
		*count = hcount;
	return rc;
}

/* Population of each word, masked to the box. */
__global__ void word_count_kernel(const uint64_t *bitmap, uint64_t words, uint64_t size,
				  uint64_t *wc)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
		uint64_t b = bitmap[i];

		if (i == words - 1 && size % 64)
			b &= (1ull << (size % 64)) - 1;
		wc[i] = (uint64_t)__popcll(b);
	}
}

__global__ void fill_kernel(struct dte_box_map e, const uint64_t *bitmap, const uint64_t *off,
			    const float *param, uint64_t size, uint64_t *pos, uint16_t *val)
{
	uint64_t stride = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < size; i += stride) {
		uint64_t w = bitmap[i / 64];
		unsigned b = (unsigned)(i % 64);

		if (w >> b & 1) {
			uint64_t o = off[i / 64] + (uint64_t)__popcll(w & ((1ull << b) - 1));

			pos[o] = i;
			val[o] = dtc_bf16_rne(param[src_of(e, i)]);
		}
	}
}

static int cu_sparse(const struct dte_box_map *e, const uint64_t *bitmap, const float *param,
		     uint64_t *pos, uint16_t *val, uint64_t cap, uint64_t *n)
{
	uint64_t size = box_size_h(e), words = (size + 63) / 64, last_off = 0, last_wc = 0;
	uint64_t *wc = NULL, *off = NULL;
	void *tmp = NULL;
	size_t tmp_bytes = 0;
	int rc = DTC_ENOMEM;

	if (cudaMalloc(&wc, words * 8) != cudaSuccess || cudaMalloc(&off, words * 8) != cudaSuccess)
		goto out;
	word_count_kernel<<<grid_for(words), THREADS>>>(bitmap, words, size, wc);
	cub::DeviceScan::ExclusiveSum(NULL, tmp_bytes, wc, off, (int64_t)words);
	if (cudaMalloc(&tmp, tmp_bytes ? tmp_bytes : 1) != cudaSuccess)
		goto out;
	cub::DeviceScan::ExclusiveSum(tmp, tmp_bytes, wc, off, (int64_t)words);
	if ((rc = check(cudaGetLastError())) != DTC_OK)
		goto out;
	if (cudaMemcpy(&last_off, off + words - 1, 8, cudaMemcpyDeviceToHost) != cudaSuccess ||
	    cudaMemcpy(&last_wc, wc + words - 1, 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
		rc = DTC_EDEVICE;
		goto out;
	}
	if (last_off + last_wc > cap) {
		rc = DTC_ENOSPC;
		goto out;
	}
	if (last_off + last_wc) {
		fill_kernel<<<grid_for(size), THREADS>>>(*e, bitmap, off, param, size, pos, val);
		if ((rc = check(cudaGetLastError())) != DTC_OK)
			goto out;
	}
	*n = last_off + last_wc;
	rc = DTC_OK;
out:
	cudaFree(tmp);
	cudaFree(off);
	cudaFree(wc);
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

	if (cudaMalloc(&dbad, sizeof(int)) != cudaSuccess)
		return DTC_ENOMEM;
	cudaMemset(dbad, 0, sizeof(int));
	range_check_kernel<<<grid_for(n), THREADS>>>(pos, n, box_size_h(e), dbad);
	rc = check(cudaGetLastError());
	if (rc == DTC_OK && cudaMemcpy(&bad, dbad, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess)
		rc = DTC_EDEVICE;
	cudaFree(dbad);
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

static int sum_finish(unsigned long long *dsum, int rc, uint64_t *sum)
{
	unsigned long long h = 0;

	if (rc == DTC_OK && cudaMemcpy(&h, dsum, sizeof(h), cudaMemcpyDeviceToHost) != cudaSuccess)
		rc = DTC_EDEVICE;
	cudaFree(dsum);
	if (rc == DTC_OK)
		*sum = h;
	return rc;
}

static int cu_checksum_buffer(const uint16_t *buf, uint64_t len, uint64_t *sum)
{
	unsigned long long *dsum;

	if (cudaMalloc(&dsum, sizeof(*dsum)) != cudaSuccess)
		return DTC_ENOMEM;
	cudaMemset(dsum, 0, sizeof(*dsum));
	csum_buf_kernel<<<grid_for(len), THREADS>>>(buf, len, dsum);
	return sum_finish(dsum, check(cudaGetLastError()), sum);
}

static int cu_checksum_entry(const struct dte_box_map *e, const float *param, uint64_t *sum)
{
	unsigned long long *dsum;
	uint64_t size = box_size_h(e);

	if (cudaMalloc(&dsum, sizeof(*dsum)) != cudaSuccess)
		return DTC_ENOMEM;
	cudaMemset(dsum, 0, sizeof(*dsum));
	csum_entry_kernel<<<grid_for(size), THREADS>>>(*e, param, size, dsum);
	return sum_finish(dsum, check(cudaGetLastError()), sum);
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

static const struct dtc_backend_ops cuda_ops = {
	cu_scan, cu_sparse, cu_extract, cu_scatter, cu_dense_apply, cu_checksum_buffer,
	cu_checksum_entry, cu_alloc, cu_free, cu_copy, cu_set, cu_time_copy, NULL,
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
