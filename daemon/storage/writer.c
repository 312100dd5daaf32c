/* Storage writer: chunks first (each fsynced), the manifest last, so a
 * version is either fully there or not visible at all. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/storage/storage_int.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "gpu/xxh.h"

#define DTS_CHUNK_FILES_MAX 99999u

struct dts_writer {
	char                jobdir[4096];
	char                vdir[4096];
	char                job[DTS_JOB_NAME_MAX];
	uint64_t            spec_hash;
	uint32_t            ntensors;
	uint64_t           *numel;
	size_t              max_chunk;
	int                 zlevel;
	uint32_t            keyframe_every;
	int64_t             head;

	/* the version begun */
	int                 active;
	struct dts_manifest m;
	int64_t             last_sparse;   /* tensor id, -1 before the first */
	uint32_t            next_dense;
	struct dts_chunk    dch, kch;
	struct dts_buf      scratch, hbuf, packed;
};

static int64_t newest(const char *jobdir, char *err, size_t errlen, int *rc)
{
	uint64_t *v = NULL;
	size_t n = 0;
	int64_t head = -1;

	*rc = dts_scan(jobdir, &v, &n, NULL, NULL, err, errlen);
	if (*rc == DTS_OK && n)
		head = (int64_t)v[n - 1];
	free(v);
	return head;
}

int dts_writer_open(struct dts_writer **out, const struct dts_writer_cfg *cfg,
		    char *err, size_t errlen)
{
	struct dts_writer *w;
	int rc = DTS_EINVAL;

	*out = NULL;
	if (!cfg || !cfg->root || !dts_job_name_ok(cfg->job) || !cfg->model.ntensors ||
	    cfg->model.ntensors > DTS_TENSORS_MAX || !cfg->model.numel || cfg->zlevel < 0 ||
	    cfg->zlevel > 3 ||
	    (cfg->max_chunk && (cfg->max_chunk < DTS_MAX_CHUNK_MIN ||
				cfg->max_chunk > DTS_MAX_CHUNK_MAX))) {
		DTS_ERR(err, errlen, "writer: bad configuration (root, job name, model, "
			"zstd level 0-3, max chunk %u..%u)", DTS_MAX_CHUNK_MIN, DTS_MAX_CHUNK_MAX);
		return DTS_EINVAL;
	}
	for (uint32_t i = 0; i < cfg->model.ntensors; i++) {
		if (!cfg->model.numel[i] || cfg->model.numel[i] > INT64_MAX / 2) {
			DTS_ERR(err, errlen, "writer: tensor %u has %" PRIu64 " elements", i,
				cfg->model.numel[i]);
			return DTS_EINVAL;
		}
	}
	if (!(w = calloc(1, sizeof(*w))))
		return DTS_ENOMEM;
	w->ntensors = cfg->model.ntensors;
	w->numel = malloc(w->ntensors * sizeof(*w->numel));
	w->m.numel = malloc(w->ntensors * sizeof(*w->numel));
	w->m.changed = calloc(w->ntensors, sizeof(*w->m.changed));
	if (!w->numel || !w->m.numel || !w->m.changed) {
		rc = DTS_ENOMEM;
		goto fail;
	}
	memcpy(w->numel, cfg->model.numel, w->ntensors * sizeof(*w->numel));
	memcpy(w->m.numel, cfg->model.numel, w->ntensors * sizeof(*w->numel));
	snprintf(w->job, sizeof(w->job), "%s", cfg->job);
	w->spec_hash = cfg->model.spec_hash;
	w->max_chunk = cfg->max_chunk ? cfg->max_chunk : DTS_MAX_CHUNK_DEFAULT;
	w->zlevel = cfg->zlevel ? cfg->zlevel : 3;
	w->keyframe_every = cfg->keyframe_every;
	if (dts_path(w->jobdir, sizeof(w->jobdir), "%s/%s", cfg->root, cfg->job)) {
		DTS_ERR(err, errlen, "writer: root path too long");
		goto fail;
	}
	if ((rc = dts_mkdir(w->jobdir, err, errlen)) != DTS_OK)
		goto fail;
	w->head = newest(w->jobdir, err, errlen, &rc);
	if (rc != DTS_OK)
		goto fail;
	*out = w;
	return DTS_OK;
fail:
	dts_writer_close(w);
	return rc;
}

void dts_writer_close(struct dts_writer *w)
{
	if (!w)
		return;
	if (w->active)
		dts_writer_abort(w);
	dts_manifest_fini(&w->m);
	dts_chunk_fini(&w->dch);
	dts_chunk_fini(&w->kch);
	dts_buf_fini(&w->scratch);
	dts_buf_fini(&w->hbuf);
	dts_buf_fini(&w->packed);
	free(w->numel);
	free(w);
}

int64_t dts_writer_head(const struct dts_writer *w)
{
	return w->head;
}

int dts_writer_keyframe_due(const struct dts_writer *w, uint64_t version)
{
	if (w->head < 0 || version != (uint64_t)w->head + 1)
		return 1;
	return w->keyframe_every && version % w->keyframe_every == 0;
}

int dts_writer_needs_dense(const struct dts_writer *w)
{
	return w->active && w->m.keyframe;
}

int dts_writer_has_base(const struct dts_writer *w)
{
	return w->active && w->m.base >= 0;
}

static void reset_version(struct dts_writer *w)
{
	free(w->m.delta.c);
	free(w->m.key.c);
	memset(&w->m.delta, 0, sizeof(w->m.delta));
	memset(&w->m.key, 0, sizeof(w->m.key));
	memset(w->m.changed, 0, w->ntensors * sizeof(*w->m.changed));
	dts_chunk_start(&w->dch, DTS_KIND_SPARSE);
	dts_chunk_start(&w->kch, DTS_KIND_DENSE);
	w->last_sparse = -1;
	w->next_dense = 0;
}

int dts_writer_begin(struct dts_writer *w, uint64_t version, unsigned flags,
		     char *err, size_t errlen)
{
	int rc;

	if (w->active) {
		DTS_ERR(err, errlen, "writer: version %" PRIu64 " is still open", w->m.version);
		return DTS_EINVAL;
	}
	if (version > INT64_MAX - 1) {
		DTS_ERR(err, errlen, "writer: version out of range");
		return DTS_EINVAL;
	}
	if (w->head >= 0 && version <= (uint64_t)w->head) {
		DTS_ERR(err, errlen, "writer: version %" PRIu64 " is committed (head %" PRId64 ")",
			version, w->head);
		return DTS_EEXIST;
	}
	reset_version(w);
	w->m.format = DTS_FORMAT;
	snprintf(w->m.job, sizeof(w->m.job), "%s", w->job);
	w->m.version = version;
	w->m.base = w->head >= 0 && version == (uint64_t)w->head + 1 &&
		    !(flags & DTS_BEGIN_NOBASE) ? w->head : -1;
	w->m.keyframe = (flags & (DTS_BEGIN_KEYFRAME | DTS_BEGIN_NOBASE)) ||
			dts_writer_keyframe_due(w, version);
	w->m.spec_hash = w->spec_hash;
	w->m.ntensors = w->ntensors;
	/* A writer killed before its commit leaves chunks nobody refers to. */
	if (dts_path(w->vdir, sizeof(w->vdir), "%s/v%" PRIu64, w->jobdir, version)) {
		DTS_ERR(err, errlen, "writer: path too long");
		return DTS_EINVAL;
	}
	if (dts_rm_version_dir(w->vdir, NULL) != DTS_OK) {
		DTS_ERR(err, errlen, "writer: cannot clear leftovers in %s", w->vdir);
		return DTS_EIO;
	}
	if ((rc = dts_mkdir(w->vdir, err, errlen)) != DTS_OK)
		return rc;
	w->active = 1;
	return DTS_OK;
}

/* Compress the chunk being built, write it as the next file of `part`. */
static int flush(struct dts_writer *w, struct dts_chunk *ch, struct dts_mpart *part,
		 char letter, char *err, size_t errlen)
{
	struct dts_mchunk c;
	char path[4096 + 32];
	int rc;

	if (dts_chunk_empty(ch))
		return DTS_OK;
	if (part->n >= DTS_CHUNK_FILES_MAX) {
		DTS_ERR(err, errlen, "writer: more than %u chunks in one version; raise max chunk",
			DTS_CHUNK_FILES_MAX);
		return DTS_EINVAL;
	}
	memset(&c, 0, sizeof(c));
	if ((rc = dts_chunk_pack(ch, w->zlevel, &w->hbuf, &w->packed, &c.raw)) != DTS_OK) {
		DTS_ERR(err, errlen, "writer: chunk pack: %s", dts_strerror(rc));
		return rc;
	}
	snprintf(c.file, sizeof(c.file), "%c%05zu.dtc", letter, part->n);
	c.stored = w->packed.len;
	c.xxh3 = XXH3_64bits(w->packed.p, w->packed.len);
	snprintf(path, sizeof(path), "%s/%s", w->vdir, c.file);
	if ((rc = dts_write_file(path, w->packed.p, w->packed.len, DTS_HOOK_CHUNK, err, errlen)))
		return rc;
	if ((rc = dts_mpart_add(part, &c)) != DTS_OK)
		return rc;
	dts_chunk_start(ch, ch->kind);
	return DTS_OK;
}

int dts_writer_put_sparse(struct dts_writer *w, uint32_t tensor, const uint64_t *pos,
			  const uint16_t *val, uint64_t count, char *err, size_t errlen)
{
	int rc;

	if (!w->active || w->m.base < 0) {
		DTS_ERR(err, errlen, "writer: no delta version begun (a version without base "
			"is a bare keyframe)");
		return DTS_EINVAL;
	}
	if (tensor >= w->ntensors || (int64_t)tensor <= w->last_sparse ||
	    count > w->numel[tensor] || (count && (!pos || !val))) {
		DTS_ERR(err, errlen, "writer: tensor %u: out of order, unknown or too many "
			"elements", tensor);
		return DTS_EINVAL;
	}
	/* Checked whole here: chunk splits restart the gap coder at zero. */
	for (uint64_t i = 0; i < count; i++) {
		if (pos[i] >= w->numel[tensor] || (i && pos[i] <= pos[i - 1])) {
			DTS_ERR(err, errlen, "writer: tensor %u: position %" PRIu64 " at %" PRIu64
				" not strictly increasing or not below %" PRIu64, tensor, pos[i], i,
				w->numel[tensor]);
			return DTS_ERANGE;
		}
	}
	w->last_sparse = tensor;
	w->m.changed[tensor] = count;
	while (count) {
		uint64_t taken;

		size_t used = dts_chunk_size(&w->dch);

		rc = dts_chunk_put_sparse(&w->dch, &w->scratch, tensor, w->numel[tensor], pos,
					  val, count, used < w->max_chunk ? w->max_chunk - used : 0,
					  &taken);
		if (rc != DTS_OK) {
			DTS_ERR(err, errlen, "writer: tensor %u: positions must be strictly "
				"increasing and below %" PRIu64 " (%s)", tensor, w->numel[tensor],
				dts_strerror(rc));
			return rc;
		}
		if (!taken) {
			if (dts_chunk_empty(&w->dch)) {
				DTS_ERR(err, errlen, "writer: max chunk too small");
				return DTS_EINVAL;
			}
			if ((rc = flush(w, &w->dch, &w->m.delta, 'd', err, errlen)))
				return rc;
			continue;
		}
		pos += taken;
		val += taken;
		count -= taken;
	}
	return DTS_OK;
}

int dts_writer_put_dense(struct dts_writer *w, uint32_t tensor, const uint16_t *val,
			 char *err, size_t errlen)
{
	uint64_t start = 0;
	int rc;

	if (!w->active || !w->m.keyframe || tensor != w->next_dense || !val) {
		DTS_ERR(err, errlen, "writer: dense tensor %u not expected (keyframe: %d, next %u)",
			tensor, w->active && w->m.keyframe, w->next_dense);
		return DTS_EINVAL;
	}
	while (start < w->numel[tensor]) {
		size_t used = dts_chunk_size(&w->kch), room;
		uint64_t n;

		room = used < w->max_chunk ? w->max_chunk - used : 0;
		n = room > DTS_SEG_HDR_MAX + 10 ? (room - DTS_SEG_HDR_MAX - 10) / 2 : 0;
		if (n > w->numel[tensor] - start)
			n = w->numel[tensor] - start;
		if (n < 64 && n < w->numel[tensor] - start) {
			if ((rc = flush(w, &w->kch, &w->m.key, 'k', err, errlen)))
				return rc;
			continue;
		}
		if ((rc = dts_chunk_put_dense(&w->kch, tensor, start, val + start, n)))
			return rc;
		start += n;
	}
	w->next_dense++;
	return DTS_OK;
}

int dts_writer_commit(struct dts_writer *w, char *err, size_t errlen)
{
	char name[64];
	char *text;
	int rc;

	if (!w->active) {
		DTS_ERR(err, errlen, "writer: no version begun");
		return DTS_EINVAL;
	}
	if (w->m.keyframe && w->next_dense != w->ntensors) {
		DTS_ERR(err, errlen, "writer: keyframe %" PRIu64 " needs all %u tensors, got %u",
			w->m.version, w->ntensors, w->next_dense);
		return DTS_EINVAL;
	}
	if ((rc = flush(w, &w->dch, &w->m.delta, 'd', err, errlen)) ||
	    (rc = flush(w, &w->kch, &w->m.key, 'k', err, errlen)))
		return rc;
	if (dts_fsync_dir(w->vdir) != DTS_OK) {
		DTS_ERR(err, errlen, "writer: fsync %s failed", w->vdir);
		return DTS_EIO;
	}
	w->m.delta.elems = 0;
	w->m.key.elems = 0;
	for (uint32_t i = 0; i < w->ntensors; i++) {
		w->m.delta.elems += w->m.changed[i];
		if (w->m.keyframe)
			w->m.key.elems += w->numel[i];
	}
	w->m.created = dts_now();
	if (!(text = dts_manifest_dump(&w->m)))
		return DTS_ENOMEM;
	snprintf(name, sizeof(name), "v%" PRIu64 ".manifest", w->m.version);
	rc = dts_write_atomic(w->jobdir, name, text, strlen(text), DTS_HOOK_MANIFEST,
			      err, errlen);
	free(text);
	if (rc != DTS_OK)
		return rc;
	w->head = (int64_t)w->m.version;
	w->active = 0;
	return DTS_OK;
}

void dts_writer_abort(struct dts_writer *w)
{
	if (!w->active)
		return;
	dts_rm_version_dir(w->vdir, NULL);
	w->active = 0;
}

#define KEYFRAME_REQUEST "keyframe.request"

int dts_keyframe_request(const char *root, const char *job, char *err, size_t errlen)
{
	char dir[4096];
	const char *text = "{\"keyframe\":true}\n";

	if (!root || !dts_job_name_ok(job) || dts_path(dir, sizeof(dir), "%s/%s", root, job)) {
		DTS_ERR(err, errlen, "keyframe request: bad root or job");
		return DTS_EINVAL;
	}
	return dts_write_atomic(dir, KEYFRAME_REQUEST, text, strlen(text), DTS_HOOK_NONE, err,
				errlen);
}

int dts_keyframe_take(const char *root, const char *job)
{
	char path[4096];

	if (!root || !dts_job_name_ok(job) ||
	    dts_path(path, sizeof(path), "%s/%s/" KEYFRAME_REQUEST, root, job))
		return 0;
	return unlink(path) == 0;
}
