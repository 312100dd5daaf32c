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
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/codec.h"

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

int main(int argc, char **argv)
{
	uint64_t numel[MAX_TENSORS], changed = 0, dense = 0;
	uint8_t *in = NULL, *raw = NULL, *chunk = NULL;
	size_t len = 0, off = 16, raw_n = 0, cap = 0, zlen = 0;
	uint32_t nt = 0, n = 0;
	int rc = 1;
	char *s, *end;

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
