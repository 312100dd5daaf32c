/* What a job directory holds (ls) and the retention policy (gc). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "daemon/storage/storage_int.h"

static int load_readers(struct dts_catalog *cat, const char *jobdir, double stale_after_s)
{
	char dir[4096 + 16], path[8192];
	struct dirent *e;
	size_t cap = 0;
	DIR *d;
	double now = dts_now();

	snprintf(dir, sizeof(dir), "%s/readers", jobdir);
	if (!(d = opendir(dir)))
		return errno == ENOENT ? DTS_OK : DTS_EIO;
	while ((e = readdir(d))) {
		struct dts_cat_reader *r;
		json_t *o, *jv, *ju;
		uint8_t *data;
		size_t len;

		if (e->d_name[0] == '.' || !dts_job_name_ok(e->d_name))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (dts_read_file(path, 65536, &data, &len, NULL, 0) != DTS_OK)
			continue;
		o = json_loadb((const char *)data, len, 0, NULL);
		free(data);
		jv = json_object_get(o, "version");
		ju = json_object_get(o, "updated");
		if (!json_is_integer(jv) || !json_is_number(ju)) {
			json_decref(o);
			continue;
		}
		if (cat->nr == cap) {
			size_t nc = cap ? 2 * cap : 8;
			struct dts_cat_reader *n = realloc(cat->r, nc * sizeof(*n));

			if (!n) {
				json_decref(o);
				closedir(d);
				return DTS_ENOMEM;
			}
			cat->r = n;
			cap = nc;
		}
		r = &cat->r[cat->nr++];
		memset(r, 0, sizeof(*r));
		memcpy(r->name, e->d_name, strlen(e->d_name) + 1);	/* < 128: name_ok */
		r->version = json_integer_value(jv);
		r->updated = json_number_value(ju);
		r->stale = stale_after_s > 0 && now - r->updated > stale_after_s;
		json_decref(o);
	}
	closedir(d);
	return DTS_OK;
}

int dts_catalog_load(struct dts_catalog *cat, const char *root, const char *job,
		     double stale_after_s, char *err, size_t errlen)
{
	char jobdir[4096], path[4096 + 32];
	uint64_t *v = NULL, *o = NULL;
	size_t n = 0, no = 0;
	int rc;

	memset(cat, 0, sizeof(*cat));
	cat->head = -1;
	if (!root || !dts_job_name_ok(job) || dts_path(jobdir, sizeof(jobdir), "%s/%s", root, job)) {
		DTS_ERR(err, errlen, "bad root or job name");
		return DTS_EINVAL;
	}
	snprintf(cat->job, sizeof(cat->job), "%s", job);
	if ((rc = dts_scan(jobdir, &v, &n, &o, &no, err, errlen)) != DTS_OK)
		return rc;
	cat->orphans = no;
	free(o);
	if (n && !(cat->v = calloc(n, sizeof(*cat->v)))) {
		free(v);
		return DTS_ENOMEM;
	}
	cat->nv = n;
	for (size_t i = 0; i < n; i++) {
		struct dts_cat_version *c = &cat->v[i];
		struct dts_manifest m;

		c->version = v[i];
		snprintf(path, sizeof(path), "%s/v%" PRIu64 ".manifest", jobdir, v[i]);
		if (dts_manifest_load(path, &m, c->err, sizeof(c->err)) != DTS_OK ||
		    m.version != v[i] || strcmp(m.job, job)) {
			if (!c->err[0])
				snprintf(c->err, sizeof(c->err), "manifest names another version/job");
			c->bad = 1;
			c->base = -1;
			dts_manifest_fini(&m);
			continue;
		}
		c->base = m.base;
		c->keyframe = m.keyframe;
		c->changed = m.delta.elems;
		c->delta_chunks = m.delta.n;
		c->delta_stored = m.delta.stored;
		c->delta_raw = m.delta.raw;
		c->key_chunks = m.key.n;
		c->key_stored = m.key.stored;
		c->key_raw = m.key.raw;
		for (uint32_t t = 0; t < m.ntensors; t++)
			c->total_elems += m.numel[t];
		c->created = m.created;
		dts_manifest_fini(&m);
	}
	if (n)
		cat->head = (int64_t)v[n - 1];
	free(v);
	if ((rc = load_readers(cat, jobdir, stale_after_s)) != DTS_OK) {
		DTS_ERR(err, errlen, "cannot read %s/readers", jobdir);
		dts_catalog_fini(cat);
		return rc;
	}
	return DTS_OK;
}

void dts_catalog_fini(struct dts_catalog *cat)
{
	free(cat->v);
	free(cat->r);
	memset(cat, 0, sizeof(*cat));
}

static uint64_t file_size(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Manifest first: from then on the version is invisible to readers. */
static int remove_version(const char *jobdir, uint64_t v, int has_manifest, int dry_run,
			  uint64_t *bytes)
{
	char path[4096 + 32];

	if (has_manifest) {
		snprintf(path, sizeof(path), "%s/v%" PRIu64 ".manifest", jobdir, v);
		*bytes += file_size(path);
		if (!dry_run && unlink(path) < 0 && errno != ENOENT)
			return DTS_EIO;
		if (!dry_run)
			dts_fsync_dir(jobdir);
	}
	snprintf(path, sizeof(path), "%s/v%" PRIu64, jobdir, v);
	if (dry_run) {
		DIR *d = opendir(path);
		struct dirent *e;
		char f[8192];

		while (d && (e = readdir(d))) {
			snprintf(f, sizeof(f), "%s/%s", path, e->d_name);
			if (e->d_name[0] != '.')
				*bytes += file_size(f);
		}
		if (d)
			closedir(d);
		return DTS_OK;
	}
	return dts_rm_version_dir(path, bytes);
}

/* Temp manifests of writers that died before their rename. */
static void remove_stale_temps(const char *jobdir, int64_t head)
{
	DIR *d = opendir(jobdir);
	struct dirent *e;
	char path[8192];

	while (d && (e = readdir(d))) {
		uint64_t v;
		char name[64];
		const char *t;

		if (e->d_name[0] != '.' || !(t = strstr(e->d_name, ".manifest.tmp.")))
			continue;
		if ((size_t)(t - e->d_name) >= sizeof(name) - 10)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(t - e->d_name - 1), e->d_name + 1);
		if (dts_parse_vname(name, "", &v) && (int64_t)v <= head) {
			snprintf(path, sizeof(path), "%s/%s", jobdir, e->d_name);
			unlink(path);
		}
	}
	if (d)
		closedir(d);
}

int dts_gc(const char *root, const char *job, const struct dts_gc_cfg *cfg,
	   struct dts_gc_result *res, char *err, size_t errlen)
{
	struct dts_catalog cat;
	char jobdir[4096];
	uint64_t *committed = NULL, *orphans = NULL;
	size_t nc = 0, no = 0;
	int64_t floor, kf = -1;
	uint32_t nkf = 0;
	int rc;

	memset(res, 0, sizeof(*res));
	res->floor = res->reader_floor = -1;
	if (!cfg || cfg->keep < 1 || cfg->keep_keyframes < 1) {
		DTS_ERR(err, errlen, "gc: keep and keep-keyframes must be at least 1");
		return DTS_EINVAL;
	}
	if ((rc = dts_catalog_load(&cat, root, job, cfg->stale_after_s, err, errlen)) != DTS_OK)
		return rc;
	snprintf(jobdir, sizeof(jobdir), "%s/%s", root, job);
	if (cat.head < 0)
		goto out;
	floor = cat.head - (int64_t)cfg->keep + 1;
	/* The M newest keyframes stay, with the chain from each to head. */
	for (size_t i = cat.nv; i-- > 0 && nkf < cfg->keep_keyframes;) {
		if (!cat.v[i].bad && cat.v[i].keyframe) {
			kf = (int64_t)cat.v[i].version;
			nkf++;
		}
	}
	if (kf >= 0 && kf < floor)
		floor = kf;
	for (size_t i = 0; i < cat.nr; i++) {
		int64_t need = cat.r[i].version + 1;

		if (cat.r[i].stale || cat.r[i].version < 0)
			continue;
		if (res->reader_floor < 0 || need < res->reader_floor)
			res->reader_floor = need;
	}
	if (res->reader_floor >= 0 && res->reader_floor < floor)
		floor = res->reader_floor;
	if (floor < 0)
		floor = 0;
	res->floor = floor;
	for (size_t i = 0; i < cat.nv && (int64_t)cat.v[i].version < floor; i++) {
		if ((rc = remove_version(jobdir, cat.v[i].version, 1, cfg->dry_run,
					 &res->removed_bytes)) != DTS_OK) {
			DTS_ERR(err, errlen, "gc: cannot remove v%" PRIu64 ": %s", cat.v[i].version,
				strerror(errno));
			goto out;
		}
		res->removed++;
	}
	/* Leftovers of uncommitted attempts; never the version being written. */
	if ((rc = dts_scan(jobdir, &committed, &nc, &orphans, &no, err, errlen)) != DTS_OK)
		goto out;
	for (size_t i = 0; i < no; i++) {
		if ((int64_t)orphans[i] > cat.head)
			continue;
		if (remove_version(jobdir, orphans[i], 0, cfg->dry_run, &res->removed_bytes) ==
		    DTS_OK)
			res->orphans_removed++;
	}
	if (!cfg->dry_run)
		remove_stale_temps(jobdir, cat.head);
out:
	free(committed);
	free(orphans);
	dts_catalog_fini(&cat);
	return rc;
}
