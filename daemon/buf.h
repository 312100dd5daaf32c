/* daemon/buf.h — buffers clients registered over the control socket.
 *
 * Host path: a memfd sealed against shrinking, passed with SCM_RIGHTS; the
 * daemon maps [offset, offset + length * elem) MAP_SHARED after checking it
 * against the fd's size, so every later access stays inside a mapping that
 * cannot shrink under it.  GPU path: a CUDA IPC handle + offset, kept for
 * the cuda backend to open; refused where the backend is not cuda.
 *
 * A buffer belongs to one control connection (owner): only the owner can
 * name it, and dbuf_release_owner() drops all of them when it goes away.
 * Buffers in use by a participant (refs) are unmapped only once released
 * by both.
 */
#ifndef DTED_BUF_H
#define DTED_BUF_H

#include <stddef.h>
#include <stdint.h>

enum dbuf_dtype { DBUF_FP32 = 0, DBUF_BF16 = 1 };

#define DBUF_IPC_HANDLE_MAX 64

struct dbuf {
	uint64_t id;             /* daemon-wide, never reused */
	uint64_t owner;          /* control connection id */
	int      dtype;          /* enum dbuf_dtype */
	uint64_t length;         /* elements */
	int      cuda;           /* GPU path: ptr is a device address */
	void    *ptr;            /* first element (host, or device when cuda) */
	void    *map;            /* the whole mapping, for munmap (cuda: the IPC base) */
	size_t   map_len;
	uint8_t  ipc_handle[DBUF_IPC_HANDLE_MAX];
	uint8_t  ipc_event[DBUF_IPC_HANDLE_MAX];
	uint64_t ipc_offset;
	void    *ipc_ev;         /* opened trainer event (job_cuda.c), or NULL */
	int      device;
	char     name[64];
	unsigned refs;           /* participants using it */
	int      released;       /* owner gone or unregistered: free at refs 0 */
	struct dbuf *next;
};

/* "fp32" / "bf16" -> dtype, -1 when unknown. */
int dbuf_dtype_parse(const char *s);
const char *dbuf_dtype_name(int dtype);
size_t dbuf_elem_size(int dtype);

/* Map a host buffer; takes ownership of fd (closed on every path).
 * 0 and *id, or a negative errno (daemon/derr.h: -EINVAL for a bad
 * request, -ENOMEM) with the reason in err. */
int dbuf_register_fd(uint64_t owner, int fd, uint64_t offset, uint64_t length, int dtype,
		     const char *name, uint64_t *id, char *err, size_t errlen);

/* Record a CUDA IPC buffer; a negative errno with the reason: -EOPNOTSUPP
 * when the compute backend is not cuda (`backend` is its name). */
int dbuf_register_cuda(uint64_t owner, const char *backend, const void *handle,
		       size_t handle_len, const void *event, size_t event_len, uint64_t offset,
		       uint64_t length, int dtype, int device, const char *name, uint64_t *id,
		       char *err, size_t errlen);

/* The owner's live buffer `id`, NULL when it does not exist or belongs to
 * another connection. */
struct dbuf *dbuf_get(uint64_t owner, uint64_t id);

/* Participants pin what they use. */
void dbuf_ref(struct dbuf *b);
void dbuf_unref(struct dbuf *b);

/* A negative errno with the reason: -ENOENT when not the owner's, -EBUSY
 * while still in use. */
int dbuf_unregister(uint64_t owner, uint64_t id, char *err, size_t errlen);
void dbuf_release_owner(uint64_t owner);

/* Live buffers (registered and not released) and their mapped bytes. */
size_t dbuf_count(uint64_t *bytes);

/* Unmap everything (daemon exit). */
void dbuf_fini(void);

/* Device memory (CUDA IPC buffers) is opened and closed by the GPU path
 * (daemon/job_cuda.c), which sits above this file: it installs these at
 * start (jcuda_init), so buffers call nothing above them.  None installed
 * (unit tests, a daemon without the engine): a CUDA buffer is refused
 * with -EOPNOTSUPP.  open: b->ptr becomes the device address of the first
 * element; 0 or a negative errno with the reason. */
struct dbuf_dev_ops {
	int  (*open)(struct dbuf *b, const void *handle, size_t handle_len, const void *event,
		     size_t event_len, uint64_t offset, char *err, size_t errlen);
	void (*close)(struct dbuf *b);
};

void dbuf_set_dev_ops(const struct dbuf_dev_ops *ops);

#endif
