/* tests/fuzz/fuzz_manifest.c — what a destination daemon reads from shared
 * storage (daemon/storage): version manifests and the raw chunk segments
 * they point at.
 *
 * Input: [mode u8][...].  mode bit 0 clear: the rest is a manifest's text
 * (dts_manifest_parse).  Set: [kind u8][ntensors u8][numel u8, cap u8 per
 * tensor][raw chunk...] decoded by dts_chunk_decode into exact-size
 * per-tensor arrays, as the reader sizes them from the manifest.
 *
 * Properties: a manifest is accepted or refused with a message and, when
 * refused, left empty; an accepted one has changed[i] <= numel[i], delta
 * elems = sum(changed), keyframe elems = sum(numel), terminated chunk names,
 * and dumps to JSON that parses back and dumps to the same text.  Chunk
 * decoding never writes past a tensor's cap (ASan: exact-size arrays),
 * never reports more than cap, and sparse positions come out strictly
 * increasing and inside the tensor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/storage/storage_int.h"
#include "tests/fuzz/fuzz_util.h"

#define MAX_TENSORS 4

static void fuzz_text(const uint8_t *p, size_t n)
{
	struct dts_manifest m, m2;
	char err[512] = "";
	char *dump, *dump2;
	uint64_t sum_changed = 0, sum_numel = 0;
	int rc = dts_manifest_parse((const char *)p, n, &m, err, sizeof(err));

	if (rc != DTS_OK) {
		FUZZ_CHECK(err[0], "refused (%d) without a message", rc);
		FUZZ_CHECK(!m.numel && !m.changed && !m.delta.c && !m.key.c && !m.ntensors,
			   "refused manifest not left empty");
		return;
	}
	for (uint32_t i = 0; i < m.ntensors; i++) {
		FUZZ_CHECK(m.changed[i] <= m.numel[i], "tensor %u: %llu changed of %llu", i,
			   (unsigned long long)m.changed[i], (unsigned long long)m.numel[i]);
		sum_changed += m.changed[i];
		sum_numel += m.numel[i];
	}
	FUZZ_CHECK(m.delta.elems == sum_changed, "delta elems %llu, changed sum %llu",
		   (unsigned long long)m.delta.elems, (unsigned long long)sum_changed);
	if (m.keyframe)
		FUZZ_CHECK(m.key.elems == sum_numel, "keyframe elems %llu, numel sum %llu",
			   (unsigned long long)m.key.elems, (unsigned long long)sum_numel);
	for (size_t i = 0; i < m.delta.n; i++)
		FUZZ_CHECK(memchr(m.delta.c[i].file, 0, DTS_CHUNK_NAME), "chunk name");
	for (size_t i = 0; i < m.key.n; i++)
		FUZZ_CHECK(memchr(m.key.c[i].file, 0, DTS_CHUNK_NAME), "chunk name");
	dump = dts_manifest_dump(&m);
	FUZZ_CHECK(dump != NULL, "dump failed");
	rc = dts_manifest_parse(dump, strlen(dump), &m2, err, sizeof(err));
	FUZZ_CHECK(rc == DTS_OK, "own dump refused: %s", err);
	dump2 = dts_manifest_dump(&m2);
	FUZZ_CHECK(dump2 && strcmp(dump, dump2) == 0, "dump does not round trip");
	free(dump);
	free(dump2);
	dts_manifest_fini(&m2);
	dts_manifest_fini(&m);
}

static void fuzz_chunk(struct fuzz_in *in)
{
	int kind = fuzz_u8(in) & 1;
	uint32_t nt = 1 + fuzz_u8(in) % MAX_TENSORS;
	uint64_t numel[MAX_TENSORS], cap[MAX_TENSORS], fill[MAX_TENSORS] = { 0 };
	struct dts_tensor_data t[MAX_TENSORS];
	struct dts_sink s = { nt, numel, t, cap, fill };
	char err[512] = "";
	uint8_t *raw;
	int rc;

	memset(t, 0, sizeof(t));
	for (uint32_t i = 0; i < nt; i++) {
		numel[i] = 1 + fuzz_u8(in);
		cap[i] = kind == DTS_KIND_DENSE ? numel[i] : fuzz_u8(in) % (numel[i] + 1);
		t[i].count = cap[i];
		if (!cap[i])
			continue;
		t[i].val = malloc(cap[i] * sizeof(*t[i].val));
		t[i].pos = kind == DTS_KIND_DENSE ? NULL : malloc(cap[i] * sizeof(*t[i].pos));
		if (!t[i].val || (kind != DTS_KIND_DENSE && !t[i].pos))
			abort();
	}
	raw = malloc(in->n ? in->n : 1);
	if (!raw)
		abort();
	memcpy(raw, in->p, in->n);
	rc = dts_chunk_decode(raw, in->n, kind, &s, err, sizeof(err));
	if (rc != DTS_OK)
		FUZZ_CHECK(err[0], "refused (%d) without a message", rc);
	for (uint32_t i = 0; i < nt; i++) {
		FUZZ_CHECK(fill[i] <= cap[i], "tensor %u: fill %llu over cap %llu", i,
			   (unsigned long long)fill[i], (unsigned long long)cap[i]);
		if (rc != DTS_OK || kind == DTS_KIND_DENSE)
			continue;
		for (uint64_t k = 0; k < fill[i]; k++)
			FUZZ_CHECK(t[i].pos[k] < numel[i] && (k == 0 || t[i].pos[k] > t[i].pos[k - 1]),
				   "tensor %u: position %llu is %llu", i, (unsigned long long)k,
				   (unsigned long long)t[i].pos[k]);
	}
	for (uint32_t i = 0; i < nt; i++) {
		free(t[i].val);
		free(t[i].pos);
	}
	free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	uint8_t mode = fuzz_u8(&in);

	if (mode & 1) {
		fuzz_chunk(&in);
	} else {
		/* An exact-size copy, so reading past the text is caught. */
		uint8_t *p = malloc(in.n ? in.n : 1);

		if (!p)
			abort();
		memcpy(p, in.p, in.n);
		fuzz_text(p, in.n);
		free(p);
	}
	return 0;
}
