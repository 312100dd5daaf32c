/* daemon/job_persist.c — the jobs created on a daemon outlive its process
 * (config [daemon] job_state_dir; docs/SYNC.md, "Restarts").
 *
 * A job is created by a client's job_create; before this file, a
 * coordinator restarted by systemd (or SIGKILLed and restarted) came back
 * without its jobs, so its members rejoined a daemon that answered
 * "unknown job" until someone created the job again.  Now the request that
 * created a job is kept, packed as the control protocol's
 * JobCreateRequest (daemon/wire_job.c packs it: the engine's own types
 * name no wire message), in <job_state_dir>/<name>.job, written whole (a
 * temporary file, fsync, rename: a crash leaves the old file or the new
 * one, never a torn one), mode 0600 in a 0700 directory (it holds the
 * job's token).  At start, before any client or peer is served, every
 * *.job there is created again through job_create, the same checks as a
 * client's request; the job gets a new boot, so its terms supersede the
 * ones the daemon had before (proto/peer_protocol.h).  A file that does
 * not decode or that job_create refuses is renamed *.bad and logged; the
 * daemon starts without that job and keeps serving the others.
 *
 * Jobs live as long as the daemon: there is no job deletion, so a file
 * is never removed here.  With job_state_dir empty (the default) nothing is
 * written or read. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/job.h"
#include "daemon/job_persist.h"
#include "daemon/job_state.h"
#include "daemon/log.h"
#include "daemon/wire_job.h"

/* Where jobs are kept, and whether a restore runs: the engine's persist
 * (struct dte_engine, job_state.h). */

int jpersist_init(struct dte_engine *eng, const char *path, char *err, size_t errlen)
{
	eng->persist.dir[0] = '\0';
	if (!path || !*path)
		return 0;
	if (strlen(path) >= sizeof(eng->persist.dir) - 80) {
		snprintf(err, errlen, "job_state_dir %s: path too long", path);
		return -ENAMETOOLONG;
	}
	if (mkdir(path, 0700) < 0 && errno != EEXIST) {
		int e = errno;

		snprintf(err, errlen, "job_state_dir %s: %s", path, strerror(e));
		return -e;
	}
	snprintf(eng->persist.dir, sizeof(eng->persist.dir), "%s", path);
	return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

void jpersist_save(struct dte_engine *e, const struct jcreate_args *rq)
{
	char path[4200], tmp[4200];
	size_t n = 0;
	uint8_t *buf = NULL;
	int fd, rc;

	if (!e->persist.dir[0] || e->persist.restoring)
		return;
	if (wire_jcreate_pack(rq, &buf, &n) < 0) {
		DLOG_W("job %s: not kept in %s: out of memory", rq->name, e->persist.dir);
		return;
	}
	snprintf(path, sizeof(path), "%s/%s.job", e->persist.dir, rq->name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.job.tmp", e->persist.dir, rq->name);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	rc = fd < 0 ? -errno : write_all(fd, buf, n);
	if (fd >= 0 && rc == 0 && fsync(fd) < 0)
		rc = -errno;
	if (fd >= 0 && close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0) {
		DLOG_W("job %s: not kept in %s (%s): a restart of this daemon loses it", rq->name,
		       e->persist.dir, strerror(-rc));
		unlink(tmp);
	} else {
		DLOG_I("job %s: kept in %s", rq->name, path);
	}
	free(buf);
}

static void set_aside(const char *path, const char *why)
{
	char bad[4200];

	snprintf(bad, sizeof(bad), "%.*s.bad", (int)(strlen(path) - 4), path);
	DLOG_E("job state %s: %s; set aside as %s, the daemon starts without it", path, why, bad);
	if (rename(path, bad) < 0)
		DLOG_E("job state %s: cannot set it aside: %s", path, strerror(errno));
}

static void restore_one(struct dte_engine *e, const char *path)
{
	struct jcreate_args a;
	struct jcreate_res rep = { 0 };
	void *rq;
	char err[512];
	uint8_t *buf = NULL;
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t got = -1;

	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size > (64 << 20) ||
	    !(buf = malloc((size_t)st.st_size)) ||
	    (got = read(fd, buf, (size_t)st.st_size)) != st.st_size) {
		if (fd >= 0)
			close(fd);
		free(buf);
		set_aside(path, got < 0 && errno ? strerror(errno) : "empty, too large or short");
		return;
	}
	close(fd);
	rq = wire_jcreate_unpack(buf, (size_t)st.st_size, &a);
	free(buf);
	if (!rq || !a.name || !*a.name) {
		wire_jcreate_free(rq);
		set_aside(path, "not a JobCreateRequest");
		return;
	}
	if (job_create(e, &a, &rep, err, sizeof(err)) != 0) {
		char why[600];

		snprintf(why, sizeof(why), "job %s refused: %s", a.name, err);
		set_aside(path, why);
	} else {
		DLOG_N("job %s restored from %s (a new boot: members rejoin under new terms)",
		       a.name, path);
	}
	wire_jcreate_free(rq);
}

int jpersist_restore(struct dte_engine *e)
{
	struct dirent **ents = NULL;
	int n, restored = 0;

	if (!e->persist.dir[0])
		return 0;
	n = scandir(e->persist.dir, &ents, NULL, alphasort);
	if (n < 0) {
		DLOG_E("job_state_dir %s: %s; no job restored", e->persist.dir, strerror(errno));
		return 0;
	}
	e->persist.restoring = 1;
	for (int i = 0; i < n; i++) {
		const char *name = ents[i]->d_name;
		size_t len = strlen(name);
		char path[4200];

		if (len > 4 && name[0] != '.' && !strcmp(name + len - 4, ".job")) {
			snprintf(path, sizeof(path), "%s/%s", e->persist.dir, name);
			restore_one(e, path);
			restored++;
		}
		free(ents[i]);
	}
	free(ents);
	e->persist.restoring = 0;
	return restored;
}
