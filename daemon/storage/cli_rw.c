/* daemon/storage/cli_rw.c — `dte-storage write` (one version from files)
 * and `dte-storage read` (a reader that applies versions to its own copy).
 *
 * Stable output lines:
 *   committed version=N base=B kind=K changed=C delta_bytes=D keyframe_bytes=K chunks=n
 *   applied version=N kind=delta|keyframe base=B changed=C bytes=S xxh3=HEX
 *   refused: CODE: REASON
 *   read: position=N applied=A refused=R
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include <xxhash.h>
#include "daemon/storage/cli_int.h"
#include "daemon/storage/storage_int.h"
#include "daemon/storage/watch.h"

#define DELTA_MAGIC "DTSD1\0\0\0"

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* Feed a --delta file to the writer, checking every length first. */
static int put_delta_file(struct cli *c, struct dts_writer *w)
{
	uint8_t *data = NULL;
	size_t len, off = 16;
	uint64_t *pos = NULL;
	uint16_t *val = NULL;
	char err[512];
	int rc = 1;

	if (dts_read_file(c->delta, (size_t)1 << 40, &data, &len, err, sizeof(err)))
		return cli_err("write: %s", err);
	if (len < 16 || memcmp(data, DELTA_MAGIC, 8) ||
	    (data[8] | data[9] << 8 | data[10] << 16 | (uint32_t)data[11] << 24) !=
		    c->model.ntensors) {
		cli_err("write: %s: not a delta file for %u tensors", c->delta, c->model.ntensors);
		goto out;
	}
	for (uint32_t t = 0; t < c->model.ntensors; t++) {
		uint64_t n;

		if (len - off < 8 || (n = rd64(data + off)) > c->numel[t] ||
		    n > (len - off - 8) / 10) {
			cli_err("write: %s: tensor %u: truncated or count too large", c->delta, t);
			goto out;
		}
		off += 8;
		if (!n)
			continue;
		free(pos);
		free(val);
		pos = malloc(n * 8);
		val = malloc(n * 2);
		if (!pos || !val) {
			cli_err("out of memory");
			goto out;
		}
		memcpy(pos, data + off, n * 8);	/* the file is unaligned */
		memcpy(val, data + off + n * 8, n * 2);
		off += n * 10;
		if (dts_writer_put_sparse(w, t, pos, val, n, err, sizeof(err))) {
			cli_err("write: %s", err);
			goto out;
		}
	}
	if (off != len) {
		cli_err("write: %s: %zu trailing bytes", c->delta, len - off);
		goto out;
	}
	rc = 0;
out:
	free(pos);
	free(val);
	free(data);
	return rc;
}

static int put_dense_file(struct cli *c, struct dts_writer *w)
{
	uint8_t *data;
	size_t len;
	uint64_t off = 0;
	char err[512];
	int rc = 0;

	if (dts_read_file(c->dense, (size_t)1 << 40, &data, &len, err, sizeof(err)))
		return cli_err("write: %s", err);
	if (len != c->total * 2) {
		free(data);
		return cli_err("write: %s: %zu bytes, the model needs %" PRIu64, c->dense, len,
			       c->total * 2);
	}
	for (uint32_t t = 0; t < c->model.ntensors && !rc; t++) {
		if (dts_writer_put_dense(w, t, (const uint16_t *)(void *)(data + off * 2), err,
					 sizeof(err)))
			rc = cli_err("write: %s", err);
		off += c->numel[t];
	}
	free(data);
	return rc;
}

int cli_write(struct cli *c)
{
	struct dts_writer_cfg cfg = { 0 };
	struct dts_writer *w = NULL;
	struct dts_catalog cat;
	char err[512];
	int rc = 1;

	if (cli_load_model(c))
		return 1;
	if (c->version < 0)
		return cli_err("write needs --version N");
	cfg.root = c->pos[0];
	cfg.job = c->pos[1];
	cfg.model = c->model;
	cfg.max_chunk = c->max_chunk;
	cfg.zlevel = c->zlevel;
	cfg.keyframe_every = (uint32_t)c->keyframe_every;
	if (dts_writer_open(&w, &cfg, err, sizeof(err)))
		return cli_err("write: %s", err);
	if (dts_writer_begin(w, (uint64_t)c->version, c->keyframe ? DTS_BEGIN_KEYFRAME : 0, err,
			     sizeof(err))) {
		cli_err("write: %s", err);
		goto out;
	}
	if (dts_writer_has_base(w) && c->delta && put_delta_file(c, w))
		goto out;
	if (dts_writer_needs_dense(w)) {
		if (!c->dense) {
			cli_err("write: version %" PRId64 " is a keyframe: --dense FILE needed",
				c->version);
			goto out;
		}
		if (put_dense_file(c, w))
			goto out;
	}
	if (dts_writer_commit(w, err, sizeof(err))) {
		cli_err("write: %s", err);
		goto out;
	}
	rc = 0;
	if (dts_catalog_load(&cat, c->pos[0], c->pos[1], 0, err, sizeof(err)) == DTS_OK) {
		for (size_t i = 0; i < cat.nv; i++) {
			const struct dts_cat_version *v = &cat.v[i];

			if ((int64_t)v->version != c->version || v->bad)
				continue;
			printf("committed version=%" PRIu64 " base=%" PRId64 " kind=%s changed=%" PRIu64
			       " delta_bytes=%" PRIu64 " keyframe_bytes=%" PRIu64 " chunks=%" PRIu64
			       "\n", v->version, v->base, v->keyframe ? "keyframe" : "delta",
			       v->changed, v->delta_stored, v->key_stored,
			       v->delta_chunks + v->key_chunks);
		}
		dts_catalog_fini(&cat);
	}
out:
	dts_writer_close(w);
	return rc;
}

/* ---- read ----------------------------------------------------------- */

struct rd {
	struct cli         *c;
	struct dts_reader  *r;
	uint16_t           *state;
	uint64_t           *off;      /* [ntensors] element offsets in state */
	struct dts_watch    w;
	uv_timer_t          timeout;
	int                 watching, timer_on, done, rc;
	uint64_t            applied, refused;
	char                lasterr[512];
};

static void apply(struct rd *d, const struct dts_version *v)
{
	for (uint32_t t = 0; t < v->ntensors; t++) {
		uint16_t *dst = d->state + d->off[t];
		const struct dts_tensor_data *td = &v->t[t];

		if (v->dense) {
			if (td->count)
				memcpy(dst, td->val, td->count * 2);
			continue;
		}
		for (uint64_t i = 0; i < td->count; i++)
			dst[td->pos[i]] = td->val[i];	/* pos < numel: checked by the decoder */
	}
}

static void stop(struct rd *d)
{
	d->done = 1;
	if (d->watching) {
		dts_watch_stop(&d->w, NULL);
		d->watching = 0;
	}
	if (d->timer_on) {
		uv_close((uv_handle_t *)&d->timeout, NULL);
		d->timer_on = 0;
	}
}

static void drain(struct rd *d)
{
	char err[512];

	while (!d->done) {
		struct dts_version *v;
		int rc = dts_reader_next(d->r, &v, err, sizeof(err));

		if (rc == DTS_EAGAIN)
			return;
		if (rc != DTS_OK) {
			/* A reason that repeats means no progress: wait for news. */
			if (!strcmp(err, d->lasterr))
				return;
			snprintf(d->lasterr, sizeof(d->lasterr), "%s", err);
			d->refused++;
			printf("refused: %s: %s\n", dts_strerror(rc), err);
			fflush(stdout);
			continue;
		}
		apply(d, v);
		if (dts_reader_ack(d->r, v->version, err, sizeof(err)) != DTS_OK)
			fprintf(stderr, "dte-storage: read: cannot register position: %s\n", err);
		d->applied++;
		d->lasterr[0] = 0;
		printf("applied version=%" PRIu64 " kind=%s base=%" PRId64 " changed=%" PRIu64
		       " bytes=%" PRIu64 " xxh3=%016" PRIx64 "\n", v->version,
		       v->dense ? "keyframe" : "delta", v->base, v->changed, v->stored,
		       (uint64_t)XXH3_64bits(d->state, d->c->total * 2));
		fflush(stdout);
		if (d->c->until >= 0 && (int64_t)v->version >= d->c->until) {
			d->rc = 0;
			stop(d);
		}
		dts_version_free(v);
	}
}

static void on_watch(struct dts_watch *w)
{
	drain(w->data);
}

static void on_timeout(uv_timer_t *t)
{
	struct rd *d = t->data;

	fprintf(stderr, "dte-storage: read: timeout at version %" PRId64 "\n",
		dts_reader_position(d->r));
	d->rc = 1;
	stop(d);
}

/* Resume from --state when the registration says where it stands. */
static int resume(struct rd *d)
{
	struct cli *c = d->c;
	int64_t pos = -1;
	uint8_t *data;
	size_t len;

	if (!c->state || !c->name ||
	    dts_reader_registered(c->pos[0], c->pos[1], c->name, &pos) != DTS_OK || pos < 0)
		return 0;
	if (dts_read_file(c->state, c->total * 2, &data, &len, NULL, 0) != DTS_OK)
		return 0;
	if (len == c->total * 2) {
		memcpy(d->state, data, len);
		dts_reader_set_position(d->r, pos);
		fprintf(stderr, "dte-storage: read: resuming at version %" PRId64 "\n", pos);
	}
	free(data);
	return 0;
}

static int save_state(struct rd *d)
{
	char dir[4096], name[256], err[512];
	const char *slash = strrchr(d->c->state, '/');

	if (slash) {
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - d->c->state), d->c->state);
		snprintf(name, sizeof(name), "%s", slash + 1);
	} else {
		snprintf(dir, sizeof(dir), ".");
		snprintf(name, sizeof(name), "%s", d->c->state);
	}
	if (dts_write_atomic(dir[0] ? dir : "/", name, d->state, d->c->total * 2, DTS_HOOK_NONE,
			     err, sizeof(err)))
		return cli_err("read: %s", err);
	return 0;
}

int cli_read(struct cli *c)
{
	struct dts_reader_cfg cfg = { 0 };
	struct rd d = { 0 };
	uv_loop_t loop;
	char err[512], jobdir[4096];
	int mode = DTS_WATCH_INOTIFY, rc = 1, uvrc;

	if (cli_load_model(c))
		return 1;
	if (c->watch && strcmp(c->watch, "none") && (mode = dts_watch_mode_parse(c->watch)) < 0)
		return cli_err("read: --watch inotify|poll|none");
	if (c->total > ((uint64_t)1 << 36))
		return cli_err("read: model too large for an in-memory copy");
	d.c = c;
	d.rc = 1;
	d.state = calloc(c->total ? c->total : 1, 2);
	d.off = calloc(c->model.ntensors, sizeof(*d.off));
	if (!d.state || !d.off) {
		rc = cli_err("out of memory");
		goto out;
	}
	for (uint32_t t = 1; t < c->model.ntensors; t++)
		d.off[t] = d.off[t - 1] + c->numel[t - 1];
	cfg.root = c->pos[0];
	cfg.job = c->pos[1];
	cfg.name = c->name;
	cfg.model = c->model;
	if (dts_reader_open(&d.r, &cfg, err, sizeof(err))) {
		rc = cli_err("read: %s", err);
		goto out;
	}
	resume(&d);
	if (c->watch && !strcmp(c->watch, "none")) {
		drain(&d);
		rc = c->until >= 0 && dts_reader_position(d.r) < c->until;
		goto report;
	}
	if (uv_loop_init(&loop) < 0) {
		rc = cli_err("read: cannot start the event loop");
		goto out;
	}
	snprintf(jobdir, sizeof(jobdir), "%s/%s", c->pos[0], c->pos[1]);
	if ((uvrc = dts_watch_start(&d.w, &loop, jobdir, mode, c->interval_ms, on_watch, &d)) < 0) {
		cli_err("read: watch %s: %s", jobdir, uv_strerror(uvrc));
		uv_run(&loop, UV_RUN_DEFAULT);
		uv_loop_close(&loop);
		goto out;
	}
	d.watching = 1;
	if (c->timeout > 0) {
		uv_timer_init(&loop, &d.timeout);
		d.timeout.data = &d;
		uv_timer_start(&d.timeout, on_timeout, (uint64_t)(c->timeout * 1000), 0);
		d.timer_on = 1;
	}
	drain(&d);	/* whatever is there already */
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_loop_close(&loop);
	rc = d.rc;
report:
	printf("read: position=%" PRId64 " applied=%" PRIu64 " refused=%" PRIu64 "\n",
	       dts_reader_position(d.r), d.applied, d.refused);
	if (c->state && save_state(&d))
		rc = 1;
out:
	dts_reader_close(d.r);
	free(d.state);
	free(d.off);
	return rc;
}
