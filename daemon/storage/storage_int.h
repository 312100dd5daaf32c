/* daemon/storage/storage_int.h — pieces shared inside daemon/storage:
 * the chunk codec, the manifest, and file-system helpers. */
#ifndef DTE_STORAGE_INT_H
#define DTE_STORAGE_INT_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/storage/storage.h"

#define DTS_ERR(err, errlen, ...) \
	do { if ((err) && (errlen)) snprintf((err), (errlen), __VA_ARGS__); } while (0)

#define DTS_MANIFEST_MAX  (64u << 20)    /* bytes of one manifest file */
#define DTS_TENSORS_MAX   (1u << 22)
#define DTS_CHUNKS_MAX    (1u << 20)
#define DTS_CHUNK_NAME    16

/* ---- chunk codec (chunk.c) ------------------------------------------
 * Logical raw chunk (what dts_chunk_decode reads):
 *     "DTSC" | format u8 (2) | kind u8 (0 sparse, 1 dense) | 2 zero bytes |
 *     meta_len varint | n varint | meta[meta_len] | high[n] | low[n]
 * meta is a list of segments; their values, in order, are the n entries
 * of two byte planes: high bytes (sign, exponent) and low bytes (mantissa)
 * of each BF16 value.
 *     sparse segment: tensor varint | glen varint | gpu/codec.h's sparse
 *                     encoding without its values (count, gap codes)[glen]
 *     dense segment:  tensor varint | start varint | count varint
 * The chunk file holds three gpu/codec.h chunk frames (zstd + xxh3 each):
 * [header, lengths, meta], high plane, low plane — separate frames so that
 * zstd keeps separate statistics for each (measured on AdamW updates at lr
 * 1e-6: 2.25 instead of 2.65 bytes per changed element in one frame).
 */
#define DTS_CHUNK_MAGIC   "DTSC"
#define DTS_CHUNK_FORMAT  2
#define DTS_CHUNK_HDR     8
#define DTS_KIND_SPARSE   0
#define DTS_KIND_DENSE    1
#define DTS_SEG_HDR_MAX   20

struct dts_buf {
	uint8_t *p;
	size_t   len, cap;
};

void dts_buf_fini(struct dts_buf *b);
int dts_buf_reserve(struct dts_buf *b, size_t more);

/* A chunk being built: meta and the two planes. */
struct dts_chunk {
	int            kind;
	struct dts_buf meta, hi, lo;
};

void dts_chunk_start(struct dts_chunk *c, int kind);
void dts_chunk_fini(struct dts_chunk *c);
int dts_chunk_empty(const struct dts_chunk *c);

/* Upper bound of the logical raw size so far. */
size_t dts_chunk_size(const struct dts_chunk *c);

/* Append a sparse segment of at most `count` elements that grows the raw
 * chunk by at most `room` bytes; *taken is how many went in (0: not even
 * one fits). */
int dts_chunk_put_sparse(struct dts_chunk *c, struct dts_buf *scratch, uint32_t tensor,
			 uint64_t numel, const uint64_t *pos, const uint16_t *val,
			 uint64_t count, size_t room, uint64_t *taken);

/* Append a dense segment: values [start, start+count) of a tensor. */
int dts_chunk_put_dense(struct dts_chunk *c, uint32_t tensor, uint64_t start,
			const uint16_t *val, uint64_t count);

/* The logical raw chunk in one buffer (tests, fuzz seeds). */
int dts_chunk_serialize(const struct dts_chunk *c, struct dts_buf *raw);

/* The chunk file (three frames) into file; *rawlen: logical raw size.
 * head is scratch space. */
int dts_chunk_pack(const struct dts_chunk *c, int zlevel, struct dts_buf *head,
		   struct dts_buf *file, uint64_t *rawlen);

/* Chunk file back to the logical raw chunk of exactly rawlen bytes,
 * checking every frame's xxh3 and zstd integrity. */
int dts_chunk_unpack(const uint8_t *file, size_t len, uint64_t rawlen, struct dts_buf *raw,
		     char *err, size_t errlen);

/* Where decoded segments go: per tensor, `cap` elements (the manifest's
 * count, or numel for dense), `fill` so far.  Decoding checks positions
 * against numel and against the previous segment of that tensor, and
 * never writes past cap. */
struct dts_sink {
	uint32_t                ntensors;
	const uint64_t         *numel;
	struct dts_tensor_data *t;
	uint64_t               *cap;
	uint64_t               *fill;
};

int dts_chunk_decode(const uint8_t *raw, size_t len, int kind, struct dts_sink *s,
		     char *err, size_t errlen);

/* Map a gpu/codec.h status to a storage one. */
int dts_from_dtc(int rc);

/* ---- manifest (manifest.c) ----------------------------------------- */

struct dts_mchunk {
	char     file[DTS_CHUNK_NAME];
	uint64_t raw, stored, xxh3;
};

struct dts_mpart {
	struct dts_mchunk *c;
	size_t             n;
	uint64_t           raw, stored, elems;
};

struct dts_manifest {
	uint32_t         format;
	char             job[DTS_JOB_NAME_MAX];
	uint64_t         version;
	int64_t          base;       /* -1: no base (keyframe only) */
	int              keyframe;
	uint64_t         spec_hash;
	uint32_t         ntensors;
	uint64_t        *numel;
	uint64_t        *changed;    /* per tensor, in the delta */
	struct dts_mpart delta;      /* elems = Σ changed */
	struct dts_mpart key;        /* elems = Σ numel when keyframe */
	double           created;
};

void dts_manifest_fini(struct dts_manifest *m);

/* Strict parse + schema check; on error *m is left empty. */
int dts_manifest_parse(const char *text, size_t len, struct dts_manifest *m,
		       char *err, size_t errlen);

/* JSON text (malloc'd, NUL-terminated), NULL on allocation failure. */
char *dts_manifest_dump(const struct dts_manifest *m);

int dts_manifest_load(const char *path, struct dts_manifest *m, char *err, size_t errlen);

/* Whether the manifest agrees with `expect` (job, version checked by caller). */
int dts_manifest_check_model(const struct dts_manifest *m, const struct dts_model *expect,
			     char *err, size_t errlen);

int dts_mpart_add(struct dts_mpart *p, const struct dts_mchunk *c);

/* ---- files (fsutil.c) ----------------------------------------------- */

/* Where a write may be held half way (after an fsync, so the partial
 * bytes are really there): the chunk or the manifest file. */
/* DTS_HOOK_READ_MISS: a reader found the manifest it wants missing and is
 * about to look for newer versions (reader.c, dts_reader_next). */
enum dts_hook { DTS_HOOK_NONE = 0, DTS_HOOK_CHUNK, DTS_HOOK_MANIFEST, DTS_HOOK_READ_MISS };

/* The test hook's extension point.  NULL in production: no production
 * binary reads DTE_STORAGE_HOOK.  tests/faults/testhook_storage.c,
 * linked only into the test builds (tests/faults/faults.mk:
 * $(B)/tests/dted-faults, $(B)/tests/dte-storage-faults), sets it before
 * main() runs: armed() says which file the env DTE_STORAGE_HOOK holds
 * ("chunk-pause", "manifest-pause": until killed; "chunk-slow": the first
 * chunk, 2 s), reached() is called half way through that file. */
struct dts_fs_hook {
	enum dts_hook (*armed)(void);
	void (*reached)(enum dts_hook hook, const char *path);
};
extern const struct dts_fs_hook *dts_fs_hook;

/* Write `name` in `dir` atomically: temp file, fsync, rename, fsync dir. */
int dts_write_atomic(const char *dir, const char *name, const void *data, size_t len,
		     enum dts_hook hook, char *err, size_t errlen);

/* Write a new file (O_EXCL) and fsync it; the caller fsyncs the dir. */
int dts_write_file(const char *path, const void *data, size_t len, enum dts_hook hook,
		   char *err, size_t errlen);

int dts_read_file(const char *path, size_t cap, uint8_t **data, size_t *len,
		  char *err, size_t errlen);
int dts_fsync_dir(const char *dir);
int dts_mkdir(const char *path, char *err, size_t errlen);

/* Remove the files in a version directory, then the directory. */
int dts_rm_version_dir(const char *dir, uint64_t *bytes);

/* Committed versions (v<N>.manifest), ascending; uncommitted v<N>/ dirs. */
int dts_scan(const char *jobdir, uint64_t **committed, size_t *nc,
	     uint64_t **dirs, size_t *nd, char *err, size_t errlen);

/* "<root>/<job>" etc. into buf; DTS_EINVAL when it does not fit. */
int dts_path(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Parse "v<N>" + suffix exactly (decimal, no sign, no leading zeros). */
int dts_parse_vname(const char *name, const char *suffix, uint64_t *v);

double dts_now(void);

#endif
