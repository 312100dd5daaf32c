/* File-system helpers: atomic commit, bounded reads, directory scans. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "daemon/storage/storage_int.h"

const char *dts_strerror(int code)
{
	switch (code) {
	case DTS_OK:        return "ok";
	case DTS_EINVAL:    return "invalid argument";
	case DTS_EIO:       return "file system error";
	case DTS_ENOMEM:    return "out of memory";
	case DTS_EAGAIN:    return "nothing new yet";
	case DTS_EMANIFEST: return "bad manifest";
	case DTS_ESPEC:     return "model spec mismatch";
	case DTS_EBASE:     return "base version mismatch";
	case DTS_ECHUNK:    return "chunk missing or wrong size";
	case DTS_ECHECKSUM: return "chunk checksum mismatch";
	case DTS_ECORRUPT:  return "chunk corrupt";
	case DTS_ERANGE:    return "position out of range";
	case DTS_EGAP:      return "version missing from the chain";
	case DTS_EEXIST:    return "version already committed";
	default:            return "unknown error";
	}
}

int dts_job_name_ok(const char *job)
{
	size_t n;

	if (!job || !(n = strlen(job)) || n >= DTS_JOB_NAME_MAX || !strcmp(job, ".") ||
	    !strcmp(job, ".."))
		return 0;
	return strspn(job, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

double dts_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int dts_path(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	return n < 0 || (size_t)n >= len ? DTS_EINVAL : DTS_OK;
}

int dts_parse_vname(const char *name, const char *suffix, uint64_t *v)
{
	const char *p = name + 1;
	uint64_t r = 0;
	size_t nd;

	if (name[0] != 'v')
		return 0;
	nd = strspn(p, "0123456789");
	if (nd == 0 || nd > 18 || (nd > 1 && p[0] == '0') || strcmp(p + nd, suffix))
		return 0;
	for (size_t i = 0; i < nd; i++)
		r = r * 10 + (uint64_t)(p[i] - '0');
	*v = r;
	return 1;
}

/* The test hook (storage_int.h); NULL in every production binary. */
const struct dts_fs_hook *dts_fs_hook;

static int write_n(int fd, const uint8_t *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int write_all(int fd, const void *data, size_t len, enum dts_hook hook,
		     const char *path)
{
	const struct dts_fs_hook *h = dts_fs_hook;
	size_t half = h && hook != DTS_HOOK_NONE && hook == h->armed() ? len / 2 : 0;

	if (half) {
		if (write_n(fd, data, half) < 0 || fsync(fd) < 0)
			return -1;
		h->reached(hook, path);	/* returns for "chunk-slow" only */
	}
	return write_n(fd, (const uint8_t *)data + half, len - half);
}

int dts_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;

	if (fd < 0)
		return DTS_EIO;
	rc = fsync(fd);
	close(fd);
	return rc < 0 ? DTS_EIO : DTS_OK;
}

int dts_write_file(const char *path, const void *data, size_t len, enum dts_hook hook,
		   char *err, size_t errlen)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);

	if (fd < 0) {
		DTS_ERR(err, errlen, "create %s: %s", path, strerror(errno));
		return DTS_EIO;
	}
	if (write_all(fd, data, len, hook, path) < 0 || fsync(fd) < 0) {
		DTS_ERR(err, errlen, "write %s: %s", path, strerror(errno));
		close(fd);
		unlink(path);
		return DTS_EIO;
	}
	if (close(fd) < 0) {
		DTS_ERR(err, errlen, "close %s: %s", path, strerror(errno));
		unlink(path);
		return DTS_EIO;
	}
	return DTS_OK;
}

int dts_write_atomic(const char *dir, const char *name, const void *data, size_t len,
		     enum dts_hook hook, char *err, size_t errlen)
{
	char tmp[4096], dst[4096];
	int fd;

	if (dts_path(tmp, sizeof(tmp), "%s/.%s.tmp.%ld", dir, name, (long)getpid()) ||
	    dts_path(dst, sizeof(dst), "%s/%s", dir, name)) {
		DTS_ERR(err, errlen, "path too long under %s", dir);
		return DTS_EINVAL;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		DTS_ERR(err, errlen, "create %s: %s", tmp, strerror(errno));
		return DTS_EIO;
	}
	if (write_all(fd, data, len, hook, tmp) < 0 || fsync(fd) < 0 || close(fd) < 0) {
		DTS_ERR(err, errlen, "write %s: %s", tmp, strerror(errno));
		close(fd);
		unlink(tmp);
		return DTS_EIO;
	}
	if (rename(tmp, dst) < 0) {
		DTS_ERR(err, errlen, "rename %s: %s", dst, strerror(errno));
		unlink(tmp);
		return DTS_EIO;
	}
	if (dts_fsync_dir(dir) != DTS_OK) {
		DTS_ERR(err, errlen, "fsync %s: %s", dir, strerror(errno));
		return DTS_EIO;
	}
	return DTS_OK;
}

int dts_read_file(const char *path, size_t cap, uint8_t **data, size_t *len,
		  char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	uint8_t *buf = NULL;
	size_t got = 0;

	if (fd < 0) {
		int e = errno;

		DTS_ERR(err, errlen, "open %s: %s", path, strerror(e));
		return e == ENOENT ? DTS_EAGAIN : DTS_EIO;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > cap) {
		DTS_ERR(err, errlen, "%s: not a regular file under %zu bytes", path, cap);
		close(fd);
		return DTS_ECHUNK;
	}
	if (!(buf = malloc((size_t)st.st_size + 1))) {
		close(fd);
		return DTS_ENOMEM;
	}
	/* Read at most the size seen; a file that grows meanwhile is the
	 * caller's to reject by its recorded size. */
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			DTS_ERR(err, errlen, "read %s: %s", path, strerror(errno));
			free(buf);
			close(fd);
			return DTS_EIO;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	buf[got] = 0;
	*data = buf;
	*len = got;
	return DTS_OK;
}

int dts_mkdir(const char *path, char *err, size_t errlen)
{
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		DTS_ERR(err, errlen, "mkdir %s: %s", path, strerror(errno));
		return DTS_EIO;
	}
	return DTS_OK;
}

int dts_rm_version_dir(const char *dir, uint64_t *bytes)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[4096];
	int rc = DTS_OK;

	if (!d)
		return errno == ENOENT ? DTS_OK : DTS_EIO;
	while ((e = readdir(d))) {
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (dts_path(p, sizeof(p), "%s/%s", dir, e->d_name))
			continue;
		if (bytes && lstat(p, &st) == 0)
			*bytes += (uint64_t)st.st_size;
		if (unlink(p) < 0 && errno != ENOENT)
			rc = DTS_EIO;
	}
	closedir(d);
	if (rmdir(dir) < 0 && errno != ENOENT)
		rc = DTS_EIO;
	return rc;
}

static int push(uint64_t **a, size_t *n, size_t *cap, uint64_t v)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		uint64_t *na = realloc(*a, nc * sizeof(*na));

		if (!na)
			return DTS_ENOMEM;
		*a = na;
		*cap = nc;
	}
	(*a)[(*n)++] = v;
	return DTS_OK;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int dts_scan(const char *jobdir, uint64_t **committed, size_t *nc,
	     uint64_t **dirs, size_t *nd, char *err, size_t errlen)
{
	DIR *d = opendir(jobdir);
	struct dirent *e;
	uint64_t *c = NULL, *o = NULL;
	size_t n1 = 0, c1 = 0, n2 = 0, c2 = 0;
	int rc = DTS_OK;

	if (!d) {
		if (errno == ENOENT)
			goto done;
		DTS_ERR(err, errlen, "open %s: %s", jobdir, strerror(errno));
		return DTS_EIO;
	}
	while ((e = readdir(d)) && rc == DTS_OK) {
		uint64_t v;

		if (dts_parse_vname(e->d_name, ".manifest", &v))
			rc = push(&c, &n1, &c1, v);
		else if (dirs && dts_parse_vname(e->d_name, "", &v))
			rc = push(&o, &n2, &c2, v);
	}
	closedir(d);
	if (rc != DTS_OK) {
		free(c);
		free(o);
		return rc;
	}
	if (n1)
		qsort(c, n1, sizeof(*c), cmp_u64);
	if (n2)
		qsort(o, n2, sizeof(*o), cmp_u64);
	/* A directory is an orphan only when its manifest is missing. */
	if (dirs) {
		size_t k = 0;

		for (size_t i = 0; i < n2; i++)
			if (!n1 || !bsearch(&o[i], c, n1, sizeof(*c), cmp_u64))
				o[k++] = o[i];
		n2 = k;
	}
done:
	*committed = c;
	*nc = n1;
	if (dirs) {
		*dirs = o;
		*nd = n2;
	} else {
		free(o);
	}
	return DTS_OK;
}
