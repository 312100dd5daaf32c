/* Storage transport: manifests (round trip, truncation, wrong schema), the
 * chunk codec (round trip, hostile input), corrupted/missing files, the
 * reader's repair from keyframes, and gc keeping what readers need.  Every
 * test runs in its own temporary directory with real files. */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include "daemon/storage/storage.h"
#include "daemon/storage/storage_int.h"
#include "gpu/codec.h"
#include "gpu/elem.h"

#define NT 3
static const uint64_t numel[NT] = { 1000, 70000, 3 };
static const struct dts_model model = { 0x1234abcd5678ef00ull, NT, numel };
#define TOTAL (1000 + 70000 + 3)

static uint64_t seed = 7;

static uint64_t rnd(void)
{
	return dtc_mix64(seed++);
}

/* ---- helpers -------------------------------------------------------- */

struct fx {
	char      root[256];
	uint16_t *ref[64];   /* full state per version */
};

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	return remove(p);
}

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->root, sizeof(f->root), "/tmp/test_storage.XXXXXX");
	assert_non_null(mkdtemp(f->root));
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	nftw(f->root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	for (int i = 0; i < 64; i++)
		free(f->ref[i]);
	free(f);
	return 0;
}

static struct dts_writer *open_writer(struct fx *f, uint32_t keyframe_every, size_t max_chunk)
{
	struct dts_writer_cfg cfg = { 0 };
	struct dts_writer *w;
	char err[256];

	cfg.root = f->root;
	cfg.job = "job";
	cfg.model = model;
	cfg.max_chunk = max_chunk;
	cfg.keyframe_every = keyframe_every;
	assert_int_equal(dts_writer_open(&w, &cfg, err, sizeof(err)), DTS_OK);
	return w;
}

/* Write version v: a random ~2% change of the previous state (kept in
 * f->ref[v]), with the dense snapshot when the writer wants it. */
static void write_version(struct fx *f, struct dts_writer *w, uint64_t v, unsigned flags)
{
	uint16_t *cur = malloc(TOTAL * 2);
	uint64_t *pos = malloc(TOTAL * 8);
	uint16_t *val = malloc(TOTAL * 2);
	char err[256];
	uint64_t off = 0;

	assert_non_null(cur);
	if (v == 0 || !f->ref[v - 1]) {
		for (uint64_t i = 0; i < TOTAL; i++)
			cur[i] = (uint16_t)(0x3c00 + rnd() % 512);
	} else {
		memcpy(cur, f->ref[v - 1], TOTAL * 2);
	}
	assert_int_equal(dts_writer_begin(w, v, flags, err, sizeof(err)), DTS_OK);
	for (uint32_t t = 0; t < NT; t++) {
		uint64_t n = 0;

		for (uint64_t i = 0; i < numel[t]; i++) {
			if (v && rnd() % 50 == 0) {
				uint16_t nv = (uint16_t)(cur[off + i] + 1);

				cur[off + i] = nv;
				pos[n] = i;
				val[n++] = nv;
			}
		}
		if (dts_writer_has_base(w))
			assert_int_equal(dts_writer_put_sparse(w, t, pos, val, n, err, sizeof(err)),
					 DTS_OK);
		off += numel[t];
	}
	if (dts_writer_needs_dense(w)) {
		off = 0;
		for (uint32_t t = 0; t < NT; t++) {
			assert_int_equal(dts_writer_put_dense(w, t, cur + off, err, sizeof(err)),
					 DTS_OK);
			off += numel[t];
		}
	}
	assert_int_equal(dts_writer_commit(w, err, sizeof(err)), DTS_OK);
	free(f->ref[v]);
	f->ref[v] = cur;
	free(pos);
	free(val);
}

static void apply(uint16_t *state, const struct dts_version *v)
{
	uint64_t off = 0;

	for (uint32_t t = 0; t < v->ntensors; t++) {
		for (uint64_t i = 0; i < v->t[t].count; i++)
			state[off + (v->dense ? i : v->t[t].pos[i])] = v->t[t].val[i];
		off += numel[t];
	}
}

static struct dts_reader *open_reader(struct fx *f, const char *name)
{
	struct dts_reader_cfg cfg = { 0 };
	struct dts_reader *r;
	char err[256];

	cfg.root = f->root;
	cfg.job = "job";
	cfg.name = name;
	cfg.model = model;
	assert_int_equal(dts_reader_open(&r, &cfg, err, sizeof(err)), DTS_OK);
	return r;
}

/* One step of a reader: returns the code; applies and acks on success. */
static int step(struct dts_reader *r, uint16_t *state, uint64_t *ver, char *err, size_t errlen)
{
	struct dts_version *v;
	int rc = dts_reader_next(r, &v, err, errlen);

	if (rc == DTS_OK) {
		apply(state, v);
		*ver = v->version;
		assert_int_equal(dts_reader_ack(r, v->version, NULL, 0), DTS_OK);
		dts_version_free(v);
	}
	return rc;
}

static void path_of(struct fx *f, char *buf, size_t len, const char *rel)
{
	snprintf(buf, len, "%s/job/%s", f->root, rel);
}

/* ---- manifest ------------------------------------------------------- */

static char *sample_manifest(void)
{
	static uint64_t nm[2] = { 100, 50 }, ch[2] = { 3, 0 };
	struct dts_mchunk c = { "d00000.dtc", 40, 160, 0xfeedfacecafebeefull };
	struct dts_mchunk k = { "k00000.dtc", 308, 200, 0x0123456789abcdefull };
	struct dts_manifest m;
	char *text;

	memset(&m, 0, sizeof(m));
	m.format = DTS_FORMAT;
	strcpy(m.job, "job-1");
	m.version = 42;
	m.base = 41;
	m.keyframe = 1;
	m.spec_hash = 0xdeadbeef00112233ull;
	m.ntensors = 2;
	m.numel = nm;
	m.changed = ch;
	m.created = 1.5;
	assert_int_equal(dts_mpart_add(&m.delta, &c), DTS_OK);
	assert_int_equal(dts_mpart_add(&m.key, &k), DTS_OK);
	m.delta.elems = 3;
	m.key.elems = 150;
	text = dts_manifest_dump(&m);
	free(m.delta.c);
	free(m.key.c);
	assert_non_null(text);
	return text;
}

static void test_manifest_roundtrip(void **state)
{
	char *text = sample_manifest(), err[256];
	struct dts_manifest m;

	assert_int_equal(dts_manifest_parse(text, strlen(text), &m, err, sizeof(err)), DTS_OK);
	assert_string_equal(m.job, "job-1");
	assert_int_equal(m.version, 42);
	assert_int_equal(m.base, 41);
	assert_true(m.keyframe);
	assert_true(m.spec_hash == 0xdeadbeef00112233ull);
	assert_int_equal(m.ntensors, 2);
	assert_int_equal(m.numel[0], 100);
	assert_int_equal(m.changed[0], 3);
	assert_int_equal(m.delta.n, 1);
	assert_string_equal(m.delta.c[0].file, "d00000.dtc");
	assert_true(m.delta.c[0].xxh3 == 0xfeedfacecafebeefull);
	assert_int_equal(m.delta.c[0].stored, 160);
	assert_int_equal(m.key.n, 1);
	assert_int_equal(m.key.elems, 150);
	assert_true(m.key.c[0].xxh3 == 0x0123456789abcdefull);
	dts_manifest_fini(&m);
	free(text);
}

static void test_manifest_truncated(void **state)
{
	char *text = sample_manifest(), err[256];
	size_t len = strlen(text);

	/* Every strict prefix (as the heap copy of exactly that size). */
	for (size_t n = 0; n < len; n++) {
		char *p = malloc(n ? n : 1);
		struct dts_manifest m;

		memcpy(p, text, n);
		err[0] = 0;
		assert_int_equal(dts_manifest_parse(p, n, &m, err, sizeof(err)), DTS_EMANIFEST);
		assert_true(err[0] != 0);
		assert_null(m.numel);
		free(p);
	}
	free(text);
}

/* Replace the first `from` in the sample with `to` and expect refusal. */
static void expect_refused(const char *from, const char *to, const char *why)
{
	char *text = sample_manifest(), *p = strstr(text, from), buf[4096], err[256];
	struct dts_manifest m;

	assert_non_null(p);
	snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
	err[0] = 0;
	assert_int_equal(dts_manifest_parse(buf, strlen(buf), &m, err, sizeof(err)), DTS_EMANIFEST);
	if (!strstr(err, why))
		fail_msg("'%s' -> '%s': reason \"%s\" lacks \"%s\"", from, to, err, why);
	free(text);
}

static void test_manifest_schema(void **state)
{
	expect_refused("\"format\":1", "\"format\":2", "format 2");
	expect_refused("\"format\":1", "\"fmt\":1", "format");
	expect_refused("\"kind\":\"keyframe\"", "\"kind\":\"full\"", "kind");
	expect_refused("\"base\":41", "\"base\":40", "base");
	expect_refused("\"base\":41", "\"base\":-1", "bare keyframe");
	expect_refused("d00000.dtc", "../../etc", "file name");
	expect_refused("d00000.dtc", "k00000.dtc", "file name");
	expect_refused("\"changed\":[3,0]", "\"changed\":[3,60]", "bad numel/changed");
	expect_refused("\"changed\":[3,0]", "\"changed\":[2,0]", "tensors add up");
	expect_refused("\"numel\":[100,50]", "\"numel\":[100]", "equal");
	expect_refused("\"numel\":[100,50]", "\"numel\":[100,49]", "keyframe has");
	expect_refused("\"spec_hash\":\"deadbeef00112233\"", "\"spec_hash\":\"xyz\"", "hex");
	expect_refused("\"raw\":40,", "\"raw\":41,", "totals");
	expect_refused("\"stored\":160,", "\"stored\":6000000,", "impossible");
	expect_refused("\"stored\":160,", "\"stored\":95,", "impossible");
	expect_refused("\"job\":\"job-1\"", "\"job\":\"a/b\"", "job");
	expect_refused("\"version\":42", "\"version\":42,\"version\":43", "JSON");
	expect_refused("{", "[", "JSON");
}

/* ---- chunk codec ---------------------------------------------------- */

static void decode_into(const struct dts_chunk *c, int kind, uint64_t n_numel, uint64_t cap,
			uint64_t *pos, uint16_t *val, int expect)
{
	struct dts_tensor_data td = { 0, pos, val };
	uint64_t capv = cap, fill = 0;
	struct dts_sink s = { 1, &n_numel, &td, &capv, &fill };
	struct dts_buf raw = { 0 };
	uint8_t *copy;
	char err[256];

	assert_int_equal(dts_chunk_serialize(c, &raw), DTS_OK);
	copy = malloc(raw.len);
	memcpy(copy, raw.p, raw.len);
	assert_int_equal(dts_chunk_decode(copy, raw.len, kind, &s, err, sizeof(err)), expect);
	if (expect == DTS_OK)
		assert_int_equal(fill, cap);
	free(copy);
	dts_buf_fini(&raw);
}

static void test_chunk_roundtrip(void **state)
{
	struct dts_chunk b = { 0 };
	struct dts_buf scratch = { 0 }, raw = { 0 };
	uint64_t n = 20000, box = 1u << 22, *pos = malloc(n * 8), *out = malloc(n * 8), taken, p = 0;
	uint16_t *val = malloc(n * 2), *vout = malloc(n * 2);

	for (uint64_t i = 0; i < n; i++) {
		p += 1 + rnd() % (i % 3 ? 100 : 300);
		pos[i] = p;
		val[i] = (uint16_t)rnd();
	}
	dts_chunk_start(&b, DTS_KIND_SPARSE);
	/* Two segments of one tensor: the split the writer makes. */
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, pos, val, n / 2, 1 << 20,
					      &taken), DTS_OK);
	assert_int_equal(taken, n / 2);
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, pos + n / 2, val + n / 2,
					      n - n / 2, 1 << 20, &taken), DTS_OK);
	decode_into(&b, DTS_KIND_SPARSE, box, n, out, vout, DTS_OK);
	assert_memory_equal(out, pos, n * 8);
	assert_memory_equal(vout, val, n * 2);
	/* Too little room: takes fewer, never overflows the room. */
	dts_chunk_start(&b, DTS_KIND_SPARSE);
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, pos, val, n, 3000, &taken),
			 DTS_OK);
	assert_true(taken > 0 && taken < n);
	assert_int_equal(dts_chunk_serialize(&b, &raw), DTS_OK);
	assert_true(raw.len <= DTS_CHUNK_HDR + 20 + 3000);
	/* Positions beyond the tensor: refused as out of range. */
	dts_chunk_start(&b, DTS_KIND_SPARSE);
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, pos, val, n, 1 << 20, &taken),
			 DTS_OK);
	decode_into(&b, DTS_KIND_SPARSE, pos[n - 1], n, out, vout, DTS_ERANGE);
	/* More elements than the manifest announced: refused, nothing past cap. */
	decode_into(&b, DTS_KIND_SPARSE, box, n - 1, out, vout, DTS_ECORRUPT);
	/* Dense round trip. */
	dts_chunk_start(&b, DTS_KIND_DENSE);
	assert_int_equal(dts_chunk_put_dense(&b, 0, 0, val, 1000), DTS_OK);
	assert_int_equal(dts_chunk_put_dense(&b, 0, 1000, val + 1000, 500), DTS_OK);
	decode_into(&b, DTS_KIND_DENSE, 1500, 1500, NULL, vout, DTS_OK);
	assert_memory_equal(vout, val, 1500 * 2);
	/* Out-of-order dense segments and the wrong kind are refused. */
	decode_into(&b, DTS_KIND_SPARSE, 1500, 1500, out, vout, DTS_ECORRUPT);
	dts_chunk_start(&b, DTS_KIND_DENSE);
	assert_int_equal(dts_chunk_put_dense(&b, 0, 10, val, 100), DTS_OK);
	decode_into(&b, DTS_KIND_DENSE, 1500, 1500, NULL, vout, DTS_ERANGE);
	dts_chunk_fini(&b);
	dts_buf_fini(&scratch);
	dts_buf_fini(&raw);
	free(pos);
	free(out);
	free(val);
	free(vout);
}

/* Every prefix and many single-byte corruptions of a raw chunk decode to
 * an error or to something inside the sink: never out of bounds (ASan). */
static void test_chunk_hostile(void **state)
{
	struct dts_chunk b = { 0 };
	struct dts_buf scratch = { 0 }, raw = { 0 };
	uint64_t n = 300, box = 5000, pos[300], out[300], taken;
	uint16_t val[300], vout[300];

	for (uint64_t i = 0; i < n; i++) {
		pos[i] = i * 16 + rnd() % 16;
		val[i] = (uint16_t)rnd();
	}
	dts_chunk_start(&b, DTS_KIND_SPARSE);
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, pos, val, n, 1 << 16, &taken),
			 DTS_OK);
	assert_int_equal(dts_chunk_serialize(&b, &raw), DTS_OK);
	for (size_t len = 0; len < raw.len; len++) {
		struct dts_tensor_data td = { 0, out, vout };
		uint64_t cap = n, fill = 0;
		struct dts_sink s = { 1, &box, &td, &cap, &fill };
		uint8_t *p = malloc(len ? len : 1);

		memcpy(p, raw.p, len);
		assert_int_not_equal(dts_chunk_decode(p, len, DTS_KIND_SPARSE, &s, NULL, 0) == DTS_OK &&
				     fill == n, 1);
		free(p);
	}
	for (int k = 0; k < 2000; k++) {
		struct dts_tensor_data td = { 0, out, vout };
		uint64_t cap = n, fill = 0;
		struct dts_sink s = { 1, &box, &td, &cap, &fill };
		uint8_t *p = malloc(raw.len);

		memcpy(p, raw.p, raw.len);
		p[rnd() % raw.len] ^= (uint8_t)(1 + rnd() % 255);
		if (dts_chunk_decode(p, raw.len, DTS_KIND_SPARSE, &s, NULL, 0) == DTS_OK) {
			assert_true(fill <= n);
			for (uint64_t i = 0; i < fill; i++)
				assert_true(out[i] < box && (!i || out[i] > out[i - 1]));
		}
		free(p);
	}
	dts_chunk_fini(&b);
	dts_buf_fini(&scratch);
	dts_buf_fini(&raw);
}

/* Found by tests/fuzz/fuzz_manifest: an empty sparse segment for a tensor
 * the manifest lists as unchanged (the reader allocates no arrays for it)
 * did pointer arithmetic on NULL (UB, UBSan aborts).  It must decode as
 * zero elements; a non-empty one must be refused. */
static void test_chunk_empty_segment_unchanged_tensor(void **state)
{
	struct dts_chunk b = { 0 };
	struct dts_buf scratch = { 0 }, raw = { 0 };
	uint64_t box = 64, cap = 0, fill = 0, taken, pos = 3;
	uint16_t val = 7;
	struct dts_tensor_data td = { 0, NULL, NULL };
	struct dts_sink s = { 1, &box, &td, &cap, &fill };
	char err[256];

	dts_chunk_start(&b, DTS_KIND_SPARSE);
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, &pos, &val, 0, 1 << 10, &taken),
			 DTS_OK);
	assert_int_equal(dts_chunk_serialize(&b, &raw), DTS_OK);
	assert_int_equal(dts_chunk_decode(raw.p, raw.len, DTS_KIND_SPARSE, &s, err, sizeof(err)),
			 DTS_OK);
	assert_int_equal(fill, 0);
	dts_chunk_start(&b, DTS_KIND_SPARSE);
	assert_int_equal(dts_chunk_put_sparse(&b, &scratch, 0, box, &pos, &val, 1, 1 << 10, &taken),
			 DTS_OK);
	assert_int_equal(dts_chunk_serialize(&b, &raw), DTS_OK);
	assert_int_not_equal(dts_chunk_decode(raw.p, raw.len, DTS_KIND_SPARSE, &s, err, sizeof(err)),
			     DTS_OK);
	assert_int_equal(fill, 0);
	dts_chunk_fini(&b);
	dts_buf_fini(&scratch);
	dts_buf_fini(&raw);
}

/* ---- writer + reader ------------------------------------------------ */

static void test_write_read_exact(void **state)
{
	struct fx *f = *state;
	struct dts_writer *w = open_writer(f, 4, 8192);	/* small chunks: many splits */
	struct dts_reader *r;
	uint16_t *st = calloc(TOTAL, 2);
	uint64_t ver = 0;
	char err[512];
	int64_t reg;

	assert_int_equal(dts_writer_head(w), -1);
	r = open_reader(f, "r1");
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_EAGAIN);
	for (uint64_t v = 0; v < 10; v++)
		write_version(f, w, v, 0);
	assert_int_equal(dts_writer_head(w), 9);
	/* A committed version cannot be written again. */
	assert_int_equal(dts_writer_begin(w, 9, 0, err, sizeof(err)), DTS_EEXIST);
	/* Fresh: the newest keyframe (8), then 9. */
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 8);
	assert_memory_equal(st, f->ref[8], TOTAL * 2);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 9);
	assert_memory_equal(st, f->ref[9], TOTAL * 2);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_EAGAIN);
	assert_int_equal(dts_reader_registered(f->root, "job", "r1", &reg), DTS_OK);
	assert_int_equal(reg, 9);
	/* An unchanged version still gets a manifest, and applies as nothing. */
	assert_int_equal(dts_writer_begin(w, 10, 0, err, sizeof(err)), DTS_OK);
	assert_int_equal(dts_writer_commit(w, err, sizeof(err)), DTS_OK);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 10);
	assert_memory_equal(st, f->ref[9], TOTAL * 2);
	dts_reader_close(r);
	dts_writer_close(w);
	free(st);
}

static void test_writer_refuses_bad_input(void **state)
{
	struct fx *f = *state;
	struct dts_writer *w = open_writer(f, 0, 0);
	uint64_t pos[3] = { 5, 4, 9 }, big[1] = { 1000 };
	uint16_t val[3] = { 1, 2, 3 };
	char err[512];

	write_version(f, w, 0, 0);
	assert_int_equal(dts_writer_begin(w, 1, 0, err, sizeof(err)), DTS_OK);
	assert_false(dts_writer_needs_dense(w));
	assert_int_equal(dts_writer_put_sparse(w, 0, pos, val, 3, err, sizeof(err)), DTS_ERANGE);
	assert_non_null(strstr(err, "strictly increasing"));
	assert_int_equal(dts_writer_put_sparse(w, 1, big, val, 1, err, sizeof(err)), DTS_OK);
	assert_int_equal(dts_writer_put_sparse(w, 0, big, val, 1, err, sizeof(err)), DTS_EINVAL);
	assert_int_equal(dts_writer_put_sparse(w, 2, big, val, 1, err, sizeof(err)), DTS_ERANGE);
	/* A keyframe must have every tensor. */
	dts_writer_abort(w);
	assert_int_equal(dts_writer_begin(w, 1, DTS_BEGIN_KEYFRAME, err, sizeof(err)), DTS_OK);
	assert_int_equal(dts_writer_commit(w, err, sizeof(err)), DTS_EINVAL);
	dts_writer_close(w);
}

static void corrupt_byte(const char *path, long at)
{
	FILE *fp = fopen(path, "r+b");
	int c;

	assert_non_null(fp);
	fseek(fp, at, at < 0 ? SEEK_END : SEEK_SET);
	c = fgetc(fp);
	fseek(fp, -1, SEEK_CUR);
	fputc(c ^ 0x40, fp);
	fclose(fp);
}

static void test_corrupt_chunk_repaired(void **state)
{
	struct fx *f = *state;
	struct dts_writer *w = open_writer(f, 5, 0);
	struct dts_reader *r;
	uint16_t *st = calloc(TOTAL, 2);
	uint64_t ver;
	char err[512], p[512];
	struct dts_version *v;

	for (uint64_t k = 0; k <= 2; k++)
		write_version(f, w, k, 0);
	r = open_reader(f, "r");
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);	/* keyframe 0 */
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 2);
	write_version(f, w, 3, 0);
	path_of(f, p, sizeof(p), "v3/d00000.dtc");
	corrupt_byte(p, -3);
	assert_int_equal(dts_version_load(f->root, "job", 3, DTS_PART_DELTA, &model, &v, err,
					  sizeof(err)), DTS_ECHECKSUM);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_ECHECKSUM);
	assert_non_null(strstr(err, "v3 chunk d00000.dtc: xxh3 mismatch"));
	assert_memory_equal(st, f->ref[2], TOTAL * 2);	/* nothing applied */
	/* Waiting for a keyframe: 4 is a delta, so nothing to do yet. */
	write_version(f, w, 4, 0);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_EAGAIN);
	write_version(f, w, 5, 0);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 5);
	assert_memory_equal(st, f->ref[5], TOTAL * 2);
	write_version(f, w, 6, 0);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_memory_equal(st, f->ref[6], TOTAL * 2);
	dts_reader_close(r);
	dts_writer_close(w);
	free(st);
}

static void test_truncated_manifest_deleted_chunk_gap(void **state)
{
	struct fx *f = *state;
	struct dts_writer *w = open_writer(f, 3, 0);
	struct dts_reader *r;
	uint16_t *st = calloc(TOTAL, 2);
	uint64_t ver;
	char err[512], p[512];

	for (uint64_t k = 0; k <= 10; k++)
		write_version(f, w, k, 0);
	/* v1: truncated manifest; v4: deleted chunk; v8 missing (a gap). */
	path_of(f, p, sizeof(p), "v1.manifest");
	assert_int_equal(truncate(p, 40), 0);
	path_of(f, p, sizeof(p), "v4/d00000.dtc");
	assert_int_equal(unlink(p), 0);
	path_of(f, p, sizeof(p), "v8.manifest");
	assert_int_equal(unlink(p), 0);
	r = open_reader(f, NULL);
	dts_reader_set_position(r, 0);
	memcpy(st, f->ref[0], TOTAL * 2);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_EMANIFEST);
	assert_non_null(strstr(err, "truncated"));
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 3);
	assert_memory_equal(st, f->ref[3], TOTAL * 2);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_ECHUNK);
	assert_non_null(strstr(err, "v4 chunk d00000.dtc: file missing"));
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 6);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 7);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_EGAP);
	assert_non_null(strstr(err, "v8 is missing"));
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 9);
	assert_int_equal(step(r, st, &ver, err, sizeof(err)), DTS_OK);
	assert_int_equal(ver, 10);
	assert_memory_equal(st, f->ref[10], TOTAL * 2);
	dts_reader_close(r);
	dts_writer_close(w);
	free(st);
}

static void test_spec_mismatch(void **state)
{
	struct fx *f = *state;
	struct dts_writer *w = open_writer(f, 0, 0);
	struct dts_version *v;
	uint64_t other_numel[NT] = { 1000, 70000, 4 };
	struct dts_model other = { model.spec_hash, NT, other_numel };
	struct dts_model other_hash = { 1, NT, numel };
	char err[512];

	write_version(f, w, 0, 0);
	assert_int_equal(dts_version_load(f->root, "job", 0, DTS_PART_KEYFRAME, &other, &v, err,
					  sizeof(err)), DTS_ESPEC);
	assert_non_null(strstr(err, "tensor 2"));
	assert_int_equal(dts_version_load(f->root, "job", 0, DTS_PART_KEYFRAME, &other_hash, &v,
					  err, sizeof(err)), DTS_ESPEC);
	assert_non_null(strstr(err, "hash"));
	assert_int_equal(dts_version_load(f->root, "job", 0, DTS_PART_KEYFRAME, &model, &v, err,
					  sizeof(err)), DTS_OK);
	dts_version_free(v);
	dts_writer_close(w);
}

/* ---- gc ------------------------------------------------------------- */

static int exists(struct fx *f, const char *rel)
{
	char p[512];
	struct stat st;

	path_of(f, p, sizeof(p), rel);
	return stat(p, &st) == 0;
}

static void write_reader_file(struct fx *f, const char *name, int64_t version, double updated)
{
	char p[512];
	FILE *fp;

	path_of(f, p, sizeof(p), "readers");
	mkdir(p, 0755);
	snprintf(p + strlen(p), sizeof(p) - strlen(p), "/%s", name);
	fp = fopen(p, "w");
	assert_non_null(fp);
	fprintf(fp, "{\"name\":\"%s\",\"version\":%lld,\"updated\":%f}", name, (long long)version,
		updated);
	fclose(fp);
}

static void test_gc_keeps_reader_needs(void **state)
{
	struct fx *f = *state;
	struct dts_writer *w = open_writer(f, 5, 0);
	struct dts_gc_cfg cfg = { 3, 1, 600, 0 };
	struct dts_gc_result res;
	struct dts_catalog cat;
	char err[512], p[512];

	for (uint64_t k = 0; k < 20; k++)
		write_version(f, w, k, 0);
	/* An uncommitted leftover below head, and the version being written. */
	path_of(f, p, sizeof(p), "v25");
	mkdir(p, 0755);
	path_of(f, p, sizeof(p), ".v7.manifest.tmp.123");
	fclose(fopen(p, "w"));
	write_reader_file(f, "slow", 7, dts_now());
	write_reader_file(f, "gone", 2, dts_now() - 3600);	/* stale: ignored */
	assert_int_equal(dts_gc(f->root, "job", &cfg, &res, err, sizeof(err)), DTS_OK);
	/* min(head-K+1 = 17, newest keyframe 15, slow reader needs 8) */
	assert_int_equal(res.floor, 8);
	assert_int_equal(res.reader_floor, 8);
	assert_int_equal(res.removed, 8);
	assert_false(exists(f, "v7.manifest"));
	assert_false(exists(f, "v7"));
	assert_true(exists(f, "v8.manifest"));
	assert_true(exists(f, "v8/d00000.dtc"));
	assert_true(exists(f, "v25"));	/* above head: a writer may be at it */
	assert_false(exists(f, ".v7.manifest.tmp.123"));
	/* The slow reader moves on; two keyframes are asked for: 10 and 15. */
	write_reader_file(f, "slow", 19, dts_now());
	cfg.keep_keyframes = 2;
	assert_int_equal(dts_gc(f->root, "job", &cfg, &res, err, sizeof(err)), DTS_OK);
	assert_int_equal(res.floor, 10);
	assert_true(exists(f, "v10.manifest"));
	assert_false(exists(f, "v9.manifest"));
	/* Dry run removes nothing but says what it would. */
	cfg.keep_keyframes = 1;
	cfg.dry_run = 1;
	assert_int_equal(dts_gc(f->root, "job", &cfg, &res, err, sizeof(err)), DTS_OK);
	assert_int_equal(res.floor, 15);
	assert_int_equal(res.removed, 5);
	assert_true(res.removed_bytes > 0);
	assert_true(exists(f, "v10.manifest"));
	/* ls sees what is left, the keyframes and the readers. */
	assert_int_equal(dts_catalog_load(&cat, f->root, "job", 600, err, sizeof(err)), DTS_OK);
	assert_int_equal(cat.nv, 10);
	assert_int_equal(cat.head, 19);
	assert_int_equal(cat.v[0].version, 10);
	assert_true(cat.v[0].keyframe);
	assert_int_equal(cat.nr, 2);
	for (size_t i = 0; i < cat.nr; i++)
		assert_int_equal(cat.r[i].stale, !strcmp(cat.r[i].name, "gone"));
	dts_catalog_fini(&cat);
	/* Bad policy. */
	cfg.keep = 0;
	assert_int_equal(dts_gc(f->root, "job", &cfg, &res, err, sizeof(err)), DTS_EINVAL);
	dts_writer_close(w);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_manifest_roundtrip),
		cmocka_unit_test(test_manifest_truncated),
		cmocka_unit_test(test_manifest_schema),
		cmocka_unit_test(test_chunk_roundtrip),
		cmocka_unit_test(test_chunk_hostile),
		cmocka_unit_test(test_chunk_empty_segment_unchanged_tensor),
		cmocka_unit_test_setup_teardown(test_write_read_exact, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_writer_refuses_bad_input, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_corrupt_chunk_repaired, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_truncated_manifest_deleted_chunk_gap, fx_setup,
						fx_teardown),
		cmocka_unit_test_setup_teardown(test_spec_mismatch, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_gc_keeps_reader_needs, fx_setup, fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
