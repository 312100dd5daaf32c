/* daemon/buf.c — registered buffers: validate, map, own, release. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/buf.h"
#include "daemon/derr.h"
#include "daemon/log.h"
#include "gpu/compute.h"

#define FAIL(rc, ...) derr_fail(err, errlen, rc, __VA_ARGS__)

/* No single registration may claim more than this (a sanity cap, not a
 * memory policy: the memory is the client's). */
#define DBUF_MAX_BYTES (1ull << 40)

static struct {
	struct dbuf *list;
	uint64_t next_id;
	uint64_t maps;		/* mappings made, for map_hint() */
} bufs;

/* Each mapping apart from the others (gpu/compute.h: the scan streams θ,
 * m and v side by side, and adjacent mappings alias). */
/* Installed by the GPU path (buf.h). */
static const struct dbuf_dev_ops *devops;

void dbuf_set_dev_ops(const struct dbuf_dev_ops *ops)
{
	devops = ops;
}

static void *map_hint(void)
{
	return dtc_spread_hint(++bufs.maps);
}

int dbuf_dtype_parse(const char *s)
{
	if (!s)
		return -EINVAL;
	if (!strcmp(s, "fp32"))
		return DBUF_FP32;
	if (!strcmp(s, "bf16"))
		return DBUF_BF16;
	return -EINVAL;
}

const char *dbuf_dtype_name(int dtype)
{
	return dtype == DBUF_FP32 ? "fp32" : dtype == DBUF_BF16 ? "bf16" : "?";
}

size_t dbuf_elem_size(int dtype)
{
	return dtype == DBUF_FP32 ? 4 : 2;
}

static struct dbuf *add(uint64_t owner, int dtype, uint64_t length, const char *name)
{
	struct dbuf *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->id = ++bufs.next_id;
	b->owner = owner;
	b->dtype = dtype;
	b->length = length;
	snprintf(b->name, sizeof(b->name), "%s", name ? name : "");
	b->next = bufs.list;
	bufs.list = b;
	return b;
}

static void destroy(struct dbuf *b);

static int check_shape(int dtype, uint64_t offset, uint64_t length, char *err, size_t errlen)
{
	size_t es;

	if (dtype != DBUF_FP32 && dtype != DBUF_BF16)
		return FAIL(-EINVAL, "dtype must be fp32 or bf16");
	es = dbuf_elem_size(dtype);
	if (length == 0)
		return FAIL(-EINVAL, "length must be at least one element");
	if (length > DBUF_MAX_BYTES / es)
		return FAIL(-EINVAL, "length %llu elements is over the %llu-byte cap",
			    (unsigned long long)length, (unsigned long long)DBUF_MAX_BYTES);
	if (offset % es)
		return FAIL(-EINVAL, "offset %llu is not a multiple of the %zu-byte element",
			    (unsigned long long)offset, es);
	if (offset > DBUF_MAX_BYTES)
		return FAIL(-EINVAL, "offset %llu is out of range", (unsigned long long)offset);
	return 0;
}

int dbuf_register_fd(uint64_t owner, int fd, uint64_t offset, uint64_t length, int dtype,
		     const char *name, uint64_t *id, char *err, size_t errlen)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t bytes, start, lead;
	struct stat st;
	struct dbuf *b;
	void *map;
	int seals, rc;

	if (fd < 0)
		return FAIL(-EINVAL, "no file descriptor came with the request "
			    "(send it with SCM_RIGHTS alongside the frame)");
	if ((rc = check_shape(dtype, offset, length, err, errlen)) < 0)
		goto out;
	bytes = length * dbuf_elem_size(dtype);
	if (fstat(fd, &st) < 0) {
		rc = FAIL(-EINVAL, "fstat: %s", strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = FAIL(-EINVAL, "the descriptor is not a memfd or shared-memory file");
		goto out;
	}
	/* A client could otherwise truncate the file and turn the daemon's
	 * next access into SIGBUS. */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		rc = FAIL(-EINVAL, "the buffer must be a memfd sealed with F_SEAL_SHRINK "
			  "(an unsealed file could shrink under the daemon's mapping)");
		goto out;
	}
	if (offset + bytes > (uint64_t)st.st_size) {
		rc = FAIL(-EINVAL, "range [%llu, %llu) is outside the %lld-byte buffer",
			(unsigned long long)offset, (unsigned long long)(offset + bytes),
			(long long)st.st_size);
		goto out;
	}
	start = offset / (uint64_t)page * (uint64_t)page;
	lead = offset - start;
	map = mmap(map_hint(), lead + bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (map == MAP_FAILED) {
		/* Out of address space is ours; a descriptor that cannot be
		 * mapped read-write (EACCES, ENODEV) is the client's. */
		rc = FAIL(errno == ENOMEM ? -ENOMEM : -EINVAL, "mmap: %s", strerror(errno));
		goto out;
	}
	b = add(owner, dtype, length, name);
	if (!b) {
		munmap(map, lead + bytes);
		rc = FAIL(-ENOMEM, "out of memory");
		goto out;
	}
	b->map = map;
	b->map_len = lead + bytes;
	b->ptr = (uint8_t *)map + lead;
	*id = b->id;
	DLOG_D("buffer %llu: %s %llu elements at offset %llu (%s), connection %llu",
	       (unsigned long long)b->id, dbuf_dtype_name(dtype), (unsigned long long)length,
	       (unsigned long long)offset, b->name, (unsigned long long)owner);
	rc = 0;
out:
	close(fd);
	return rc;
}

int dbuf_register_cuda(uint64_t owner, const char *backend, const void *handle,
		       size_t handle_len, const void *event, size_t event_len, uint64_t offset,
		       uint64_t length, int dtype, int device, const char *name, uint64_t *id,
		       char *err, size_t errlen)
{
	struct dbuf *b;
	int rc;

	if (!backend || strcmp(backend, "cuda"))
		return FAIL(-EOPNOTSUPP, "no CUDA device: this daemon computes on the %s "
			    "backend and cannot open CUDA IPC handles", backend ? backend : "?");
	if ((rc = check_shape(dtype, offset, length, err, errlen)) < 0)
		return rc;
	if (!handle || handle_len == 0 || handle_len > DBUF_IPC_HANDLE_MAX)
		return FAIL(-EINVAL, "CUDA IPC handle must be 1..%d bytes", DBUF_IPC_HANDLE_MAX);
	if (event_len > DBUF_IPC_HANDLE_MAX)
		return FAIL(-EINVAL, "CUDA IPC event handle over %d bytes", DBUF_IPC_HANDLE_MAX);
	b = add(owner, dtype, length, name);
	if (!b)
		return FAIL(-ENOMEM, "out of memory");
	b->cuda = 1;
	b->device = device;
	b->ipc_offset = offset;
	memcpy(b->ipc_handle, handle, handle_len);
	if (event_len)
		memcpy(b->ipc_event, event, event_len);
	/* Opened now, so a bad handle or range is refused at registration. */
	rc = devops ? devops->open(b, handle, handle_len, event, event_len, offset, err, errlen)
		    : FAIL(-EOPNOTSUPP, "no CUDA device: CUDA IPC handles cannot be opened");
	if (rc < 0) {
		destroy(b);
		return rc;
	}
	*id = b->id;
	return 0;
}

struct dbuf *dbuf_get(uint64_t owner, uint64_t id)
{
	for (struct dbuf *b = bufs.list; b; b = b->next)
		if (b->id == id)
			return b->owner == owner && !b->released ? b : NULL;
	return NULL;
}

static void destroy(struct dbuf *b)
{
	struct dbuf **pp;

	for (pp = &bufs.list; *pp; pp = &(*pp)->next) {
		if (*pp == b) {
			*pp = b->next;
			break;
		}
	}
	if (b->cuda) {
		if (devops)
			devops->close(b);
	}
	else if (b->map)
		munmap(b->map, b->map_len);
	free(b);
}

void dbuf_ref(struct dbuf *b)
{
	b->refs++;
}

void dbuf_unref(struct dbuf *b)
{
	if (b->refs)
		b->refs--;
	if (!b->refs && b->released)
		destroy(b);
}

int dbuf_unregister(uint64_t owner, uint64_t id, char *err, size_t errlen)
{
	struct dbuf *b = dbuf_get(owner, id);

	if (!b)
		return FAIL(-ENOENT, "buffer %llu is not registered on this connection",
			    (unsigned long long)id);
	if (b->refs)
		return FAIL(-EBUSY, "buffer %llu is in use by %u participant(s); detach first",
			    (unsigned long long)id, b->refs);
	destroy(b);
	return 0;
}

void dbuf_release_owner(uint64_t owner)
{
	struct dbuf *b = bufs.list, *next;

	for (; b; b = next) {
		next = b->next;
		if (b->owner != owner || b->released)
			continue;
		b->released = 1;
		if (!b->refs)
			destroy(b);
	}
}

size_t dbuf_count(uint64_t *bytes)
{
	size_t n = 0;
	uint64_t total = 0;

	for (struct dbuf *b = bufs.list; b; b = b->next) {
		if (b->released)
			continue;
		n++;
		total += b->length * dbuf_elem_size(b->dtype);
	}
	if (bytes)
		*bytes = total;
	return n;
}

void dbuf_fini(void)
{
	while (bufs.list)
		destroy(bufs.list);
	bufs.next_id = 0;
}
