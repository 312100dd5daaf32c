/* client/dte.c — libdte: connection, framing, request/reply round trip. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>
#include "client/dte_internal.h"
#include "proto/cmdtab.h"
#include "proto/frame.h"

struct dte {
	pthread_mutex_t lock;
	int fd;                     /* -1 once the stream is unusable */
	uint32_t next_id;
	uint32_t version;           /* negotiated protocol version */
	unsigned timeout_ms;        /* per request (dte_set_timeout) */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char err[256];
	/* Async publishes, oldest first, whose accept reply is not read yet
	 * (DTE_PEND_SENT) or was read and is not yet collected by
	 * dte_wait_captured (DTE_PEND_READ); dte.h, "pipelined". */
	struct dte_pending pend[DTE_PENDING_MAX];
	size_t npend;
};

static __thread char connect_err[256];

static const char *const err_text[] = {
	[0] = "success",
	[-DTE_ERR_INVAL] = "invalid argument",
	[-DTE_ERR_NOMEM] = "out of memory",
	[-DTE_ERR_UNREACHABLE] = "daemon unreachable",
	[-DTE_ERR_IO] = "connection to the daemon lost",
	[-DTE_ERR_TIMEOUT] = "timed out",
	[-DTE_ERR_PROTOCOL] = "protocol error",
	[-DTE_ERR_VERSION] = "no common protocol version",
	[-DTE_ERR_DENIED] = "permission denied",
	[-DTE_ERR_UNKNOWN_COMMAND] = "unknown command",
	[-DTE_ERR_BAD_REQUEST] = "invalid request",
	[-DTE_ERR_NOT_FOUND] = "not found",
	[-DTE_ERR_BUSY] = "daemon busy",
	[-DTE_ERR_UNIMPLEMENTED] = "not implemented by the daemon",
	[-DTE_ERR_INTERNAL] = "daemon internal error",
};

const char *dte_strerror(int err)
{
	if (err > 0 || (size_t)-err >= sizeof(err_text) / sizeof(err_text[0]))
		return "unknown error";
	return err_text[-err];
}

static int seterr(char *buf, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int seterr(char *buf, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, 256, fmt, ap);
	va_end(ap);
	return err;
}

const char *dte_errmsg(const dte_t *h)
{
	return h ? h->err : connect_err;
}

int dte__status_to_err(Dte__Status code)
{
	switch (code) {
	case DTE__STATUS__STATUS_OK: return DTE_OK;
	case DTE__STATUS__STATUS_ERR_PROTOCOL: return DTE_ERR_PROTOCOL;
	case DTE__STATUS__STATUS_ERR_VERSION: return DTE_ERR_VERSION;
	case DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND: return DTE_ERR_UNKNOWN_COMMAND;
	case DTE__STATUS__STATUS_ERR_DENIED: return DTE_ERR_DENIED;
	case DTE__STATUS__STATUS_ERR_INVALID: return DTE_ERR_BAD_REQUEST;
	case DTE__STATUS__STATUS_ERR_NOT_FOUND: return DTE_ERR_NOT_FOUND;
	case DTE__STATUS__STATUS_ERR_BUSY: return DTE_ERR_BUSY;
	case DTE__STATUS__STATUS_ERR_UNIMPLEMENTED: return DTE_ERR_UNIMPLEMENTED;
	case DTE__STATUS__STATUS_ERR_INTERNAL: return DTE_ERR_INTERNAL;
	case DTE__STATUS__STATUS_ERR_TIMEOUT: return DTE_ERR_TIMEOUT;
	default: return DTE_ERR_PROTOCOL;
	}
}

static int set_timeouts(int fd, unsigned ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		return -1;
	return 0;
}

int dte_set_timeout(dte_t *h, unsigned ms)
{
	int rc = DTE_OK;

	if (!h)
		return DTE_ERR_INVAL;
	pthread_mutex_lock(&h->lock);
	if (h->fd >= 0 && set_timeouts(h->fd, ms) < 0)
		rc = seterr(h->err, DTE_ERR_IO, "setsockopt: %s", strerror(errno));
	else
		h->timeout_ms = ms;
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* After a timeout or a short read the stream position is unknown: the
 * handle stops being usable rather than pairing replies wrongly. */
static int broken(dte_t *h, int err, const char *what, int e)
{
	if (h->fd >= 0) {
		close(h->fd);
		h->fd = -1;
	}
	if (err == DTE_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK))
		err = DTE_ERR_TIMEOUT;
	return seterr(h->err, err, "%s %s: %s", what, h->path,
		      e ? strerror(e) : "connection closed by the daemon");
}

/* The first bytes carry the descriptor (SCM_RIGHTS), so it arrives with
 * the frame it belongs to. */
static int send_fd_first(dte_t *h, const uint8_t *p, size_t n, int fd, size_t *sent)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)p, .iov_len = n };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c;
	ssize_t w;

	memset(&u, 0, sizeof(u));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	do
		w = sendmsg(h->fd, &msg, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	if (w <= 0)
		return broken(h, DTE_ERR_IO, "sending to", w < 0 ? errno : 0);
	*sent = (size_t)w;
	return DTE_OK;
}

static int send_all(dte_t *h, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = send(h->fd, p, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return broken(h, DTE_ERR_IO, "sending to", w < 0 ? errno : 0);
		p += w;
		n -= (size_t)w;
	}
	return DTE_OK;
}

static int recv_frame(dte_t *h, Dte__Response **resp)
{
	struct dte_frame_reader rd;
	uint8_t chunk[4096];
	size_t have = 0, off = 0;
	int rc;

	dte_frame_reader_init(&rd, DTE_CLIENT_MAX_FRAME);
	for (;;) {
		const uint8_t *body;
		uint32_t len;
		size_t used;

		if (off == have) {
			/* Never read past one frame: the next belongs to the next call. */
			size_t want = rd.hdr_have < DTE_FRAME_HDR ? DTE_FRAME_HDR - rd.hdr_have :
				      rd.want - rd.have;
			ssize_t r;

			if (want > sizeof(chunk))
				want = sizeof(chunk);
			r = recv(h->fd, chunk, want, 0);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				rc = broken(h, DTE_ERR_IO, "reading from", r < 0 ? errno : 0);
				goto out;
			}
			have = (size_t)r;
			off = 0;
		}
		rc = dte_frame_feed(&rd, chunk + off, have - off, &used, &body, &len);
		off += used;
		if (rc < 0) {
			rc = broken(h, DTE_ERR_PROTOCOL, dte_frame_strerror(rc), 0);
			goto out;
		}
		if (rc == DTE_FRAME_READY) {
			*resp = dte__response__unpack(NULL, len, body);
			rc = *resp ? DTE_OK : broken(h, DTE_ERR_PROTOCOL, "undecodable reply from", 0);
			goto out;
		}
	}
out:
	dte_frame_reader_fini(&rd);
	return rc;
}

/* Reads the accept replies of the async publishes sent and not yet
 * answered, oldest first, into their pending entries (the stream's next
 * frames are theirs: every call drains them before its own request).  A
 * refusal is kept in its entry for dte_wait_captured; only a broken
 * stream fails here. */
static int drain_locked(dte_t *h)
{
	for (size_t i = 0; i < h->npend; i++) {
		struct dte_pending *p = &h->pend[i];
		Dte__Response *resp = NULL;
		int rc;

		if (p->state != DTE_PEND_SENT)
			continue;
		if (h->fd < 0)
			return seterr(h->err, DTE_ERR_IO, "connection to %s was lost earlier", h->path);
		if ((rc = recv_frame(h, &resp)) < 0)
			return rc;
		if (resp->id != p->id && resp->code == DTE__STATUS__STATUS_OK) {
			dte__response__free_unpacked(resp, NULL);
			return broken(h, DTE_ERR_PROTOCOL, "reply out of sequence from", 0);
		}
		if (resp->code != DTE__STATUS__STATUS_OK) {
			p->rc = dte__status_to_err(resp->code);
			snprintf(p->err, sizeof(p->err), "%s", resp->message && resp->message[0] ?
				 resp->message : dte_strerror(p->rc));
		} else if (resp->body_case != DTE__RESPONSE__BODY_PUBLISH) {
			p->rc = DTE_ERR_PROTOCOL;
			snprintf(p->err, sizeof(p->err), "reply carries the wrong body");
		} else {
			size_t n = resp->publish->cuda_capture_event.len;

			p->rc = DTE_OK;
			p->cuda_event_len = 0;
			if (n && n <= sizeof(p->cuda_event)) {
				memcpy(p->cuda_event, resp->publish->cuda_capture_event.data, n);
				p->cuda_event_len = (uint32_t)n;
			}
		}
		p->state = DTE_PEND_READ;
		dte__response__free_unpacked(resp, NULL);
	}
	return DTE_OK;
}

static int send_locked(dte_t *h, Dte__Request *req, int fd)
{
	uint8_t *buf;
	size_t len, sent = 0;
	int rc;

	req->id = ++h->next_id;
	rc = dte_frame_pack(&req->base, DTE_CLIENT_MAX_FRAME, &buf, &len);
	if (rc < 0)
		return seterr(h->err, rc == DTE_FRAME_ENOMEM ? DTE_ERR_NOMEM : DTE_ERR_INVAL,
			      "cannot encode request: %s", dte_frame_strerror(rc));
	rc = fd >= 0 ? send_fd_first(h, buf, len, fd, &sent) : DTE_OK;
	if (rc == DTE_OK)
		rc = send_all(h, buf + sent, len - sent);
	free(buf);
	return rc;
}

static int call_locked(dte_t *h, Dte__Request *req, int fd, Dte__Response **out)
{
	Dte__Response *resp = NULL;
	int rc;

	if (h->fd < 0)
		return seterr(h->err, DTE_ERR_IO, "connection to %s was lost earlier", h->path);
	if ((rc = drain_locked(h)) < 0)
		return rc;
	if ((rc = send_locked(h, req, fd)) < 0)
		return rc;
	rc = recv_frame(h, &resp);
	if (rc < 0)
		return rc;
	if (resp->id != req->id && resp->code == DTE__STATUS__STATUS_OK) {
		dte__response__free_unpacked(resp, NULL);
		return broken(h, DTE_ERR_PROTOCOL, "reply out of sequence from", 0);
	}
	if (resp->code != DTE__STATUS__STATUS_OK) {
		rc = seterr(h->err, dte__status_to_err(resp->code), "%s",
			    resp->message && resp->message[0] ? resp->message :
			    dte_strerror(dte__status_to_err(resp->code)));
		dte__response__free_unpacked(resp, NULL);
		return rc;
	}
	if ((uint32_t)resp->body_case != (uint32_t)req->cmd_case) {
		dte__response__free_unpacked(resp, NULL);
		return seterr(h->err, DTE_ERR_PROTOCOL, "reply carries the wrong body");
	}
	h->err[0] = '\0';
	*out = resp;
	return DTE_OK;
}

int dte__call(dte_t *h, Dte__Request *req, Dte__Response **resp)
{
	int rc;

	if (!h || !req || !resp)
		return DTE_ERR_INVAL;
	pthread_mutex_lock(&h->lock);
	rc = call_locked(h, req, -1, resp);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int dte__call_ex(dte_t *h, Dte__Request *req, int fd, unsigned wait_ms, Dte__Response **resp)
{
	unsigned ms;
	int rc;

	if (!h || !req || !resp)
		return DTE_ERR_INVAL;
	pthread_mutex_lock(&h->lock);
	/* A call the daemon answers only after wait_ms must not time out first. */
	ms = h->timeout_ms && wait_ms ? h->timeout_ms + wait_ms : h->timeout_ms;
	if (wait_ms && h->fd >= 0)
		set_timeouts(h->fd, ms);
	rc = call_locked(h, req, fd, resp);
	if (wait_ms && h->fd >= 0)
		set_timeouts(h->fd, h->timeout_ms);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

static void pend_drop(dte_t *h, size_t i)
{
	free(h->pend[i].job);
	memmove(&h->pend[i], &h->pend[i + 1], (h->npend - i - 1) * sizeof(h->pend[0]));
	h->npend--;
}

int dte__send_async(dte_t *h, Dte__Request *req)
{
	const Dte__PublishRequest *pr = req ? req->publish : NULL;
	struct dte_pending *p;
	char *job;
	int rc;

	if (!h || !pr || req->cmd_case != DTE__REQUEST__CMD_PUBLISH || !pr->async || !pr->job)
		return DTE_ERR_INVAL;
	if (!(job = strdup(pr->job)))
		return DTE_ERR_NOMEM;
	pthread_mutex_lock(&h->lock);
	if (h->fd < 0) {
		rc = seterr(h->err, DTE_ERR_IO, "connection to %s was lost earlier", h->path);
		goto out;
	}
	if (h->npend == DTE_PENDING_MAX) {
		/* Make room: read what is pending, forget the oldest accept
		 * nobody waited for; refusals wait for their dte_wait_captured. */
		if ((rc = drain_locked(h)) < 0)
			goto out;
		for (size_t i = 0; i < h->npend; i++)
			if (h->pend[i].rc == DTE_OK) {
				pend_drop(h, i);
				break;
			}
		if (h->npend == DTE_PENDING_MAX) {
			rc = seterr(h->err, DTE_ERR_BUSY, "%d refused async publishes not yet "
				    "collected by dte_wait_captured", DTE_PENDING_MAX);
			goto out;
		}
	}
	if ((rc = send_locked(h, req, -1)) < 0)
		goto out;
	p = &h->pend[h->npend++];
	memset(p, 0, sizeof(*p));
	p->id = req->id;
	p->state = DTE_PEND_SENT;
	p->job = job;
	p->participant = pr->participant;
	p->version = pr->version;
	job = NULL;
	h->err[0] = '\0';
out:
	pthread_mutex_unlock(&h->lock);
	free(job);
	return rc;
}

int dte__take_pending(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		      struct dte_pending *out)
{
	size_t at = (size_t)-1;
	int rc;

	if (!h || !job || !out)
		return DTE_ERR_INVAL;
	pthread_mutex_lock(&h->lock);
	rc = drain_locked(h);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < h->npend; i++)
		if (h->pend[i].participant == participant && !strcmp(h->pend[i].job, job) &&
		    (version ? h->pend[i].version == version :
		     at == (size_t)-1 || h->pend[i].version > h->pend[at].version))
			at = i;
	if (at == (size_t)-1)
		goto out;
	*out = h->pend[at];
	out->job = NULL;
	version = h->pend[at].version;
	pend_drop(h, at);
	/* Older accepts of the participant are covered by this one. */
	for (size_t i = h->npend; i-- > 0;)
		if (h->pend[i].participant == participant && h->pend[i].rc == DTE_OK &&
		    h->pend[i].version < version && !strcmp(h->pend[i].job, job))
			pend_drop(h, i);
	rc = out->rc < 0 ? seterr(h->err, out->rc, "%s", out->err) : 1;
out:
	pthread_mutex_unlock(&h->lock);
	return rc;
}

static void copy_str(char *dst, size_t cap, const char *s)
{
	snprintf(dst, cap, "%s", s ? s : "");
}

/* Field fits in what the caller's (possibly older, smaller) struct has. */
#define FITS(type, out, f) (offsetof(type, f) + sizeof((out)->f) <= (out)->size)

uint32_t dte__version(const dte_t *h)
{
	return h ? h->version : 0;
}

int dte_hello(dte_t *h, struct dte_hello_info *out)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__HelloRequest hello = DTE__HELLO_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || (out && out->size < offsetof(struct dte_hello_info, version)))
		return DTE_ERR_INVAL;
	hello.min_version = DTE_PROTO_MIN_VERSION;
	hello.max_version = DTE_PROTO_VERSION;
	hello.client = "libdte " DTE_VERSION;
	req.cmd_case = DTE__REQUEST__CMD_HELLO;
	req.hello = &hello;
	pthread_mutex_lock(&h->lock);
	rc = call_locked(h, &req, -1, &resp);
	if (rc == DTE_OK) {
		const Dte__HelloReply *r = resp->hello;

		if (r->version < DTE_PROTO_MIN_VERSION || r->version > DTE_PROTO_VERSION) {
			rc = seterr(h->err, DTE_ERR_VERSION, "daemon chose protocol %u, outside %u..%u",
				    r->version, DTE_PROTO_MIN_VERSION, DTE_PROTO_VERSION);
		} else {
			h->version = r->version;
			if (out) {
				typedef struct dte_hello_info T;

				out->field_mask = 0;
				if (FITS(T, out, version)) {
					out->version = r->version;
					out->field_mask |= DTE_HELLO_VERSION;
				}
				if (FITS(T, out, daemon_max)) {
					out->daemon_min = r->daemon_min;
					out->daemon_max = r->daemon_max;
					out->field_mask |= DTE_HELLO_DAEMON_RANGE;
				}
				if (FITS(T, out, daemon_version)) {
					copy_str(out->daemon_version, sizeof(out->daemon_version),
						 r->daemon_version);
					out->field_mask |= DTE_HELLO_DAEMON_VERSION;
				}
				if (FITS(T, out, node_name)) {
					copy_str(out->node_name, sizeof(out->node_name), r->node_name);
					out->field_mask |= DTE_HELLO_NODE_NAME;
				}
			}
		}
		dte__response__free_unpacked(resp, NULL);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int dte_connect(const char *path, dte_t **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	dte_t *h;
	int rc, e;

	if (!out)
		return seterr(connect_err, DTE_ERR_INVAL, "dte_connect: out is NULL");
	if (!path || !*path)
		path = getenv(DTE_SOCKET_ENV);
	if (!path || !*path)
		path = DTE_DEFAULT_SOCKET;
	if (strlen(path) >= sizeof(sa.sun_path))
		return seterr(connect_err, DTE_ERR_INVAL, "socket path too long: %s", path);
	h = calloc(1, sizeof(*h));
	if (!h)
		return seterr(connect_err, DTE_ERR_NOMEM, "out of memory");
	pthread_mutex_init(&h->lock, NULL);
	snprintf(h->path, sizeof(h->path), "%s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	h->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (h->fd < 0) {
		rc = seterr(connect_err, DTE_ERR_IO, "socket: %s", strerror(errno));
		goto fail;
	}
	if (connect(h->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		rc = seterr(connect_err, e == EACCES || e == EPERM ? DTE_ERR_DENIED : DTE_ERR_UNREACHABLE,
			    "cannot connect to dted at %s: %s", path, strerror(e));
		goto fail;
	}
	h->timeout_ms = 30000;
	if (set_timeouts(h->fd, h->timeout_ms) < 0) {
		rc = seterr(connect_err, DTE_ERR_IO, "setsockopt: %s", strerror(errno));
		goto fail;
	}
	rc = dte_hello(h, NULL);
	if (rc < 0) {
		seterr(connect_err, rc, "%s", h->err);
		goto fail;
	}
	*out = h;
	return DTE_OK;
fail:
	dte_close(h);
	return rc;
}

void dte_close(dte_t *h)
{
	if (!h)
		return;
	if (h->fd >= 0)
		close(h->fd);
	while (h->npend)
		pend_drop(h, h->npend - 1);
	pthread_mutex_destroy(&h->lock);
	free(h);
}
