/* daemon/storage/storage.h — cross-cluster transport through shared storage
 * (DESIGN §5 "Cross-cluster").
 *
 * Layout of one job under a root that both clusters mount:
 *
 *     <root>/<job>/v<N>/d<part>-<k>.dtc    delta chunks (canonical sparse)
 *     <root>/<job>/v<N>/k<part>-<k>.dtc    keyframe chunks (canonical dense)
 *     <root>/<job>/v<N>.manifest           committed LAST (temp, fsync,
 *                                          rename, fsync dir)
 *     <root>/<job>/readers/<name>          a reader's applied position
 *
 * A version is visible only once its manifest exists; a manifest names its
 * base (N-1 for a delta), the model-spec hash, per-tensor changed counts,
 * and every chunk with sizes and an xxh3-64 of the file.  A keyframe
 * version carries a dense snapshot in addition to the delta from N-1 (when
 * it has a base), so a reader that follows along reads only the delta and
 * a late or broken reader restarts from the snapshot.  Unchanged versions
 * get a manifest with no delta chunks, so versions stay contiguous.
 *
 * Everything the engine hands over or gets back is *canonical*: per model
 * spec tensor (in spec order), sorted flat element indices and BF16 bits,
 * or all numel values for dense.
 *
 * Functions return 0 or a negative DTS_E* code; where they take err/errlen
 * the first function that sees a problem writes a one-line reason there.
 */
#ifndef DTE_STORAGE_H
#define DTE_STORAGE_H

#include <stddef.h>
#include <stdint.h>

enum {
	DTS_OK = 0,
	DTS_EINVAL = -1,     /* bad argument */
	DTS_EIO = -2,        /* file system error */
	DTS_ENOMEM = -3,
	DTS_EAGAIN = -4,     /* nothing (new) committed yet: try again later */
	DTS_EMANIFEST = -5,  /* manifest unreadable, truncated, or wrong schema */
	DTS_ESPEC = -6,      /* model-spec hash or tensor sizes differ */
	DTS_EBASE = -7,      /* base version is not the one the reader holds */
	DTS_ECHUNK = -8,     /* chunk missing or of the wrong size */
	DTS_ECHECKSUM = -9,  /* chunk bytes do not match their xxh3 */
	DTS_ECORRUPT = -10,  /* chunk framing, zstd frame or payload malformed */
	DTS_ERANGE = -11,    /* a position is outside its tensor or unsorted */
	DTS_EGAP = -12,      /* a version is missing from the chain */
	DTS_EEXIST = -13,    /* the version is already committed */
};

const char *dts_strerror(int code);

#define DTS_FORMAT           1
#define DTS_MAX_CHUNK_DEFAULT (64u << 20)
#define DTS_MAX_CHUNK_MIN    4096u
#define DTS_MAX_CHUNK_MAX    (1u << 30)
#define DTS_JOB_NAME_MAX     128

/* What both sides must agree on: the spec hash and every tensor's size. */
struct dts_model {
	uint64_t        spec_hash;
	uint32_t        ntensors;
	const uint64_t *numel;     /* [ntensors] */
};

/* One job name is one directory component: [A-Za-z0-9._-], not "." or "..". */
int dts_job_name_ok(const char *job);

/* ---- writer ---------------------------------------------------------- */

struct dts_writer;

struct dts_writer_cfg {
	const char      *root;
	const char      *job;
	struct dts_model model;
	size_t           max_chunk;      /* raw bytes per chunk; 0: 64 MiB */
	int              zlevel;         /* zstd 1..3; 0: 3 */
	uint32_t         keyframe_every; /* 0: only first version and on request */
};

int dts_writer_open(struct dts_writer **w, const struct dts_writer_cfg *cfg,
		    char *err, size_t errlen);
void dts_writer_close(struct dts_writer *w);

/* Newest committed version, -1 when the job has none. */
int64_t dts_writer_head(const struct dts_writer *w);

/* Whether `version` must carry a keyframe: the first version, a version
 * that does not follow head, or every keyframe_every-th version. */
int dts_writer_keyframe_due(const struct dts_writer *w, uint64_t version);

#define DTS_BEGIN_KEYFRAME 1u   /* write a keyframe even if not due */
#define DTS_BEGIN_NOBASE   2u   /* a keyframe without base even at head+1: the
				   caller does not know head's content */

/* Start version `version`: head+1 (delta from head, plus a keyframe when
 * due), or any later version as a keyframe without base (a writer that
 * lost its state).  Leftovers of an uncommitted attempt are removed. */
int dts_writer_begin(struct dts_writer *w, uint64_t version, unsigned flags,
		     char *err, size_t errlen);

/* Whether the version begun needs dense data (dts_writer_put_dense for
 * every tensor) and whether it takes a delta (it has a base). */
int dts_writer_needs_dense(const struct dts_writer *w);
int dts_writer_has_base(const struct dts_writer *w);

/* The changed elements of one tensor: strictly increasing flat indices
 * < numel and their new BF16 bits.  Tensors in increasing id order, each
 * at most once; tensors not given are unchanged. */
int dts_writer_put_sparse(struct dts_writer *w, uint32_t tensor, const uint64_t *pos,
			  const uint16_t *val, uint64_t count, char *err, size_t errlen);

/* All numel values of one tensor, for the keyframe (increasing ids). */
int dts_writer_put_dense(struct dts_writer *w, uint32_t tensor, const uint16_t *val,
			 char *err, size_t errlen);

/* Flush chunks, fsync them, then commit the manifest. */
int dts_writer_commit(struct dts_writer *w, char *err, size_t errlen);

/* Drop the version begun (its chunk files are removed). */
void dts_writer_abort(struct dts_writer *w);

/* Keyframe on request, from any process that sees the directory: a
 * request file <root>/<job>/keyframe.request that the writer consumes
 * (dts_keyframe_take: 1 when there was one, and it is removed). */
int dts_keyframe_request(const char *root, const char *job, char *err, size_t errlen);
int dts_keyframe_take(const char *root, const char *job);

/* ---- reader ---------------------------------------------------------- */

/* One verified version, ready to apply.  dense: every tensor has all numel
 * values (pos == NULL); otherwise sorted positions and values. */
struct dts_tensor_data {
	uint64_t  count;
	uint64_t *pos;
	uint16_t *val;
};

struct dts_version {
	uint64_t                version;
	int64_t                 base;      /* -1 for a dense restart */
	int                     dense;
	uint32_t                ntensors;
	struct dts_tensor_data *t;
	uint64_t                changed;   /* elements given */
	uint64_t                stored;    /* chunk bytes read */
};

void dts_version_free(struct dts_version *v);

struct dts_reader;

struct dts_reader_cfg {
	const char      *root;
	const char      *job;
	const char      *name;     /* registration under readers/; NULL: none */
	struct dts_model model;
};

int dts_reader_open(struct dts_reader **r, const struct dts_reader_cfg *cfg,
		    char *err, size_t errlen);
void dts_reader_close(struct dts_reader *r);

/* Last version applied (-1: nothing yet; the next is a keyframe). */
int64_t dts_reader_position(const struct dts_reader *r);

/* Resume: the caller holds `version` (e.g. from its registration). */
void dts_reader_set_position(struct dts_reader *r, int64_t version);

/* Registered position of `name`, -1 when not registered. */
int dts_reader_registered(const char *root, const char *job, const char *name,
			  int64_t *version);

/* The next version to apply, fully verified, in *out (caller frees).
 * DTS_EAGAIN: nothing new yet (or waiting for a keyframe after a broken
 * link).  Any other error is a broken link, with the reason in err: the
 * reader stays where it was and from then on looks for a keyframe newer
 * than the broken version, so calling again repairs the chain. */
int dts_reader_next(struct dts_reader *r, struct dts_version **out, char *err, size_t errlen);

/* The caller applied `version`: advance and record it (atomically) in
 * readers/<name> so that gc keeps what this reader still needs. */
int dts_reader_ack(struct dts_reader *r, uint64_t version, char *err, size_t errlen);

/* ---- verification of one committed version ------------------------- */

enum dts_part { DTS_PART_DELTA = 0, DTS_PART_KEYFRAME = 1 };

/* Load and fully verify one part of a committed version.  `expect` may be
 * NULL (then the manifest's own tensor sizes are used). */
int dts_version_load(const char *root, const char *job, uint64_t version, enum dts_part part,
		     const struct dts_model *expect, struct dts_version **out,
		     char *err, size_t errlen);

/* ---- catalog (ls) and retention (gc) -------------------------------- */

struct dts_cat_version {
	uint64_t version;
	int64_t  base;
	int      keyframe;
	int      bad;            /* manifest unreadable; err below */
	char     err[160];
	uint64_t changed;
	uint64_t delta_chunks, delta_stored, delta_raw;
	uint64_t key_chunks, key_stored, key_raw;
	uint64_t total_elems;
	double   created;
};

struct dts_cat_reader {
	char    name[128];
	int64_t version;
	double  updated;
	int     stale;
};

struct dts_catalog {
	char                    job[DTS_JOB_NAME_MAX];
	struct dts_cat_version *v;         /* ascending */
	size_t                  nv;
	struct dts_cat_reader  *r;
	size_t                  nr;
	int64_t                 head;      /* -1: none */
	uint64_t                orphans;   /* uncommitted version dirs */
};

int dts_catalog_load(struct dts_catalog *cat, const char *root, const char *job,
		     double stale_after_s, char *err, size_t errlen);
void dts_catalog_fini(struct dts_catalog *cat);

struct dts_gc_cfg {
	uint32_t keep;            /* last K versions (≥ 1) */
	uint32_t keep_keyframes;  /* M newest keyframes with their chains (≥ 1) */
	double   stale_after_s;   /* readers not updated for this long are ignored; 0: never */
	int      dry_run;
};

struct dts_gc_result {
	int64_t  floor;           /* oldest version kept (-1: nothing kept) */
	uint64_t removed;         /* versions removed */
	uint64_t removed_bytes;
	uint64_t orphans_removed;
	int64_t  reader_floor;    /* lowest version a live reader needs, -1: none */
};

/* Remove every version below floor = min(head-K+1, M-th newest keyframe,
 * oldest version a live reader still needs); also uncommitted leftovers at
 * or below head.  The manifest goes first, so a version is never visible
 * without its chunks. */
int dts_gc(const char *root, const char *job, const struct dts_gc_cfg *cfg,
	   struct dts_gc_result *res, char *err, size_t errlen);

#endif
