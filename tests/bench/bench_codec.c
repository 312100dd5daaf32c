/* bench_codec: the same-cluster payload size of one version's changes.
 *
 * Reads a delta file in dte-storage's format (DTSD1: per tensor, the
 * sorted changed positions and their new BF16 values), encodes every
 * tensor as one plan entry with the wire codec (gpu/codec.h: gap-coded
 * positions + raw BF16 values) exactly as the source daemon does, then
 * frames the whole payload as a chunk the way a remote pair goes (zstd
 * level 1) and a same-node pair goes (raw).  Usage:
 *     bench_codec DELTA NUMEL[,NUMEL...]
 * Output line:
 *     codec-cluster: changed=N raw_bytes=R zstd_bytes=Z dense_bytes=D
 *
 * With --detect, what the daemon really sends for that step: dtc_detect()
 * over the step's FP32 θ, m, v (so the guard band the inverse cannot
 * clear is in the bytes) and, on the same data, AReaL-DTE's rule (the
 * AdamW inverse with a relative margin of 1e-4·|θ_t|, int32 index + BF16
 * value per element).  Usage:
 *     bench_codec --detect STATE NUMEL[,...] LR BETA1 BETA2 EPS WD STEP
 * STATE holds per tensor θ, m, v (FP32) and the BF16 the sink holds
 * (θ_{t-1} rounded), each NUMEL elements, little-endian.  Output line:
 *     codec-detect: changed=C flagged=F raw_bytes=R zstd_bytes=Z zstd_ms=T
 *         unzstd_ms=U dte_flagged=D dte_bytes=E
 * raw_bytes is the chunk as the default configuration frames it
 * (zstd_level 0), zstd_bytes at level 1; zstd_ms / unzstd_ms the time to
 * pack / unpack it on one core (best of 5).  Every changed element must be
 * flagged by both rules (else exit 1).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/detect.h"
#include "gpu/elem.h"

#define MAX_TENSORS 4096

static int read_all(const char *path, uint8_t **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long n;
	uint8_t *p;

	if (!f)
		return -1;
	if (fseek(f, 0, SEEK_END) < 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0) {
		fclose(f);
		return -1;
	}
	p = malloc(n ? (size_t)n : 1);
	if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
		free(p);
		fclose(f);
		return -1;
	}
	fclose(f);
	*out = p;
	*len = (size_t)n;
	return 0;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t x = 0;

	for (int b = 0; b < 8; b++)
		x |= (uint64_t)p[b] << (8 * b);
	return x;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int main_detect(int argc, char **argv)
{
	struct dtc_hparams hp = { 0, 0, 0, 0, 0, 0, DTC_VARIANT_TORCH };
	uint64_t numel[MAX_TENSORS], changed = 0, flagged = 0, dte = 0, off = 0;
	struct dtc_bytes raw = { 0 };
	struct dtc_consts k;
	uint8_t *in = NULL, *chunk = NULL, *back = NULL;
	size_t len = 0, zlen = 0, blen = 0;
	double tz = 1e30, tu = 1e30;
	uint32_t n = 0;
	char *s, *end;
	int rc = 1;

	if (argc != 10) {
		fprintf(stderr, "usage: bench_codec --detect STATE NUMEL[,...] LR BETA1 BETA2 EPS WD "
			"STEP\n");
		return 2;
	}
	for (s = argv[3]; *s && n < MAX_TENSORS; s = *end ? end + 1 : end) {
		numel[n] = strtoull(s, &end, 10);
		if (end == s || (*end && *end != ',') || !numel[n]) {
			fprintf(stderr, "bench_codec: bad tensor size list \"%s\"\n", argv[3]);
			return 2;
		}
		n++;
	}
	hp.lr = strtod(argv[4], NULL);
	hp.beta1 = strtod(argv[5], NULL);
	hp.beta2 = strtod(argv[6], NULL);
	hp.eps = strtod(argv[7], NULL);
	hp.weight_decay = strtod(argv[8], NULL);
	hp.step = strtoll(argv[9], NULL, 10);
	if (dtc_hparams_derive(&hp, &k, NULL, 0) != DTC_OK) {
		fprintf(stderr, "bench_codec: bad hyper-parameters\n");
		return 2;
	}
	if (read_all(argv[2], &in, &len) < 0) {
		fprintf(stderr, "bench_codec: cannot read %s\n", argv[2]);
		return 1;
	}
	raw.n = DTC_CHUNK_HDR;	/* framed as the daemon frames a part */
	for (uint32_t t = 0; t < n; t++) {
		uint64_t nn = numel[t], cnt = 0;
		const float *p, *m, *v;
		const uint16_t *prev;
		struct dte_box_map e;
		struct dtc_src src;
		size_t at;

		if ((len - off) / 14 < nn) {
			fprintf(stderr, "bench_codec: %s too short\n", argv[2]);
			goto out;
		}
		p = (const float *)(const void *)(in + off);
		m = p + nn;
		v = m + nn;
		prev = (const uint16_t *)(const void *)(v + nn);
		off += 14 * nn;
		memset(&e, 0, sizeof(e));
		e.ndim = 1;
		e.extent[0] = (int64_t)nn;
		e.src_stride[0] = e.dst_stride[0] = 1;
		src = (struct dtc_src){ p, m, v, nn };
		if (dtc_bytes_reserve(&raw, 8) != 0)
			goto out;
		at = raw.n;
		raw.n += 8;
		if (dtc_detect(dtc_backend_cpu(), &e, &k, &src, NULL, 0, &raw, &cnt, NULL) != DTC_OK) {
			fprintf(stderr, "bench_codec: detect failed on tensor %u\n", t);
			goto out;
		}
		if (!cnt)
			raw.n = at;	/* an empty entry sends nothing */
		else
			for (int b = 0; b < 8; b++)
				raw.p[at + b] = (uint8_t)((uint64_t)(raw.n - at - 8) >> (8 * b));
		flagged += cnt;
		for (uint64_t i = 0; i < nn; i++) {
			float th = p[i], u = dtc_adamw_u_torch(&k, m[i], v[i]);
			float pv = dtc_adamw_prev(&k, th, u), d = 1e-4f * dtc_fabsf(th);
			uint16_t b = dtc_bf16_rne(th);
			int ch = b != prev[i];
			int f = (dtc_bf16_rne(pv - d) != b) | (dtc_bf16_rne(pv + d) != b) |
				!dtc_f32_finite(th);
			int g = dtc_adamw_flag(&k, th, m[i], v[i]);

			if (ch && (!f || !g)) {
				fprintf(stderr, "bench_codec: tensor %u element %llu changed but not "
					"flagged (dted %d, dte %d)\n", t, (unsigned long long)i, g, f);
				goto out;
			}
			changed += (uint64_t)ch;
			dte += (uint64_t)f;
		}
	}
	chunk = malloc(dtc_chunk_bound(raw.n - DTC_CHUNK_HDR));
	back = malloc(raw.n);
	if (!chunk || !back)
		goto out;
	for (int r = 0; r < 5; r++) {
		double t = now_s();

		if (dtc_chunk_pack(raw.p + DTC_CHUNK_HDR, raw.n - DTC_CHUNK_HDR, 1, chunk,
				   dtc_chunk_bound(raw.n - DTC_CHUNK_HDR), &zlen) != DTC_OK) {
			fprintf(stderr, "bench_codec: chunk framing failed\n");
			goto out;
		}
		t = now_s() - t;
		tz = t < tz ? t : tz;
		t = now_s();
		if (dtc_chunk_unpack(chunk, zlen, back, raw.n, &blen) != DTC_OK ||
		    blen != raw.n - DTC_CHUNK_HDR) {
			fprintf(stderr, "bench_codec: chunk unpack failed\n");
			goto out;
		}
		t = now_s() - t;
		tu = t < tu ? t : tu;
	}
	printf("codec-detect: changed=%" PRIu64 " flagged=%" PRIu64 " raw_bytes=%zu zstd_bytes=%zu "
	       "zstd_ms=%.3f unzstd_ms=%.3f dte_flagged=%" PRIu64 " dte_bytes=%" PRIu64 "\n",
	       changed, flagged, raw.n, zlen, tz * 1e3, tu * 1e3, dte, dte * 6);
	rc = 0;
out:
	free(in);
	free(raw.p);
	free(chunk);
	free(back);
	return rc;
}

int main(int argc, char **argv)
{
	uint64_t numel[MAX_TENSORS], changed = 0, dense = 0;
	uint8_t *in = NULL, *raw = NULL, *chunk = NULL;
	size_t len = 0, off = 16, raw_n = 0, cap = 0, zlen = 0;
	uint32_t nt = 0, n = 0;
	int rc = 1;
	char *s, *end;

	if (argc > 1 && !strcmp(argv[1], "--detect"))
		return main_detect(argc, argv);
	if (argc != 3) {
		fprintf(stderr, "usage: bench_codec DELTA NUMEL[,NUMEL...]\n");
		return 2;
	}
	for (s = argv[2]; *s && n < MAX_TENSORS; s = *end ? end + 1 : end) {
		numel[n] = strtoull(s, &end, 10);
		if (end == s || (*end && *end != ',') || !numel[n]) {
			fprintf(stderr, "bench_codec: bad tensor size list \"%s\"\n", argv[2]);
			return 2;
		}
		dense += 2 * numel[n++];
	}
	if (read_all(argv[1], &in, &len) < 0) {
		fprintf(stderr, "bench_codec: cannot read %s\n", argv[1]);
		return 1;
	}
	if (len < 16 || memcmp(in, "DTSD1\0\0\0", 8)) {
		fprintf(stderr, "bench_codec: %s is not a DTSD1 delta file\n", argv[1]);
		goto out;
	}
	nt = (uint32_t)in[8] | (uint32_t)in[9] << 8 | (uint32_t)in[10] << 16 | (uint32_t)in[11] << 24;
	if (nt != n) {
		fprintf(stderr, "bench_codec: delta has %u tensors, %u sizes given\n", nt, n);
		goto out;
	}
	for (uint32_t t = 0; t < nt; t++) {
		uint64_t cnt, *pos;
		uint16_t *val;
		size_t need, elen = 0;
		int r;

		if (len - off < 8 || (cnt = le64(in + off)) > numel[t] || (len - off - 8) / 10 < cnt) {
			fprintf(stderr, "bench_codec: tensor %u: truncated or bad count\n", t);
			goto out;
		}
		off += 8;
		pos = malloc((cnt ? cnt : 1) * sizeof(*pos));
		val = malloc((cnt ? cnt : 1) * sizeof(*val));
		need = 8 + dtc_sparse_bound(cnt);
		if (raw_n + need > cap) {
			size_t nc = (raw_n + need) * 2;
			uint8_t *np = realloc(raw, nc);

			if (!np) {
				free(pos);
				free(val);
				goto out;
			}
			raw = np;
			cap = nc;
		}
		if (!pos || !val) {
			free(pos);
			free(val);
			goto out;
		}
		for (uint64_t i = 0; i < cnt; i++)
			pos[i] = le64(in + off + 8 * i);
		off += 8 * cnt;
		for (uint64_t i = 0; i < cnt; i++)
			val[i] = (uint16_t)(in[off + 2 * i] | in[off + 2 * i + 1] << 8);
		off += 2 * cnt;
		/* The daemon prefixes every entry's payload with its u64 length. */
		r = dtc_sparse_encode(pos, val, cnt, numel[t], raw + raw_n + 8, cap - raw_n - 8, &elen);
		free(pos);
		free(val);
		if (r) {
			fprintf(stderr, "bench_codec: tensor %u: encode failed (%d)\n", t, r);
			goto out;
		}
		raw_n += 8 + elen;
		changed += cnt;
	}
	chunk = malloc(dtc_chunk_bound(raw_n));
	if (!chunk || dtc_chunk_pack(raw, raw_n, 1, chunk, dtc_chunk_bound(raw_n), &zlen)) {
		fprintf(stderr, "bench_codec: chunk framing failed\n");
		goto out;
	}
	printf("codec-cluster: changed=%" PRIu64 " raw_bytes=%zu zstd_bytes=%zu dense_bytes=%" PRIu64
	       "\n", changed, raw_n + DTC_CHUNK_HDR, zlen, dense);
	rc = 0;
out:
	free(in);
	free(raw);
	free(chunk);
	return rc;
}
