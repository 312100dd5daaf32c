/* daemon/ctl.c — control socket: accept, credentials, frames, replies. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include "daemon/conf.h"
#include "daemon/ctl.h"
#include "daemon/log.h"
#include "proto/frame.h"

#define READ_CHUNK 16384
#define MAX_GROUPS 64

struct conn {
	uv_pipe_t pipe;              /* first: the handle is the connection */
	struct conn *prev, *next;
	struct dte_frame_reader rd;
	struct dsess sess;
	int closing;                 /* no more reads; close once writes drain */
	unsigned pending_writes;
	uint8_t rbuf[READ_CHUNK];    /* libuv reads here, never a claimed size */
};

struct wreq {
	uv_write_t req;
	uint8_t *buf;
};

static struct {
	uv_loop_t *loop;
	struct dsrv *srv;
	uv_pipe_t server;
	int listening;
	int owns_path;               /* unlink at exit (not when activated) */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct conn *conns;
	uint64_t next_conn_id;
} ctl;

static void conn_closed(uv_handle_t *h)
{
	struct conn *c = (struct conn *)h;

	while (c->sess.nfds)
		close(dsess_take_fd(&c->sess));
	/* Buffers and participants die with the connection that made them. */
	if (ctl.srv->conn_gone)
		ctl.srv->conn_gone(ctl.srv->eng, c->sess.conn_id);

	if (c->prev)
		c->prev->next = c->next;
	else
		ctl.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	ctl.srv->clients--;
	dte_frame_reader_fini(&c->rd);
	free(c);
}

/* Freeing happens in conn_closed, after libuv is done with the handle. */
static void conn_close(struct conn *c)
{
	c->closing = 1;
	if (!uv_is_closing((uv_handle_t *)&c->pipe))
		uv_close((uv_handle_t *)&c->pipe, conn_closed);
}

static void conn_close_when_drained(struct conn *c)
{
	c->closing = 1;
	uv_read_stop((uv_stream_t *)&c->pipe);
	if (c->pending_writes == 0)
		conn_close(c);
}

static void on_write(uv_write_t *req, int status)
{
	struct wreq *w = (struct wreq *)req;
	struct conn *c = req->data;

	free(w->buf);
	free(w);
	c->pending_writes--;
	if (status < 0 && status != UV_ECANCELED) {
		DLOG_D("control: write to pid %d failed: %s", (int)c->sess.pid, uv_strerror(status));
		conn_close(c);
		return;
	}
	if (c->closing && c->pending_writes == 0)
		conn_close(c);
}

/* Takes ownership of buf. */
static void conn_send(struct conn *c, uint8_t *buf, size_t len)
{
	struct wreq *w = malloc(sizeof(*w));
	uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
	int rc;

	if (!w) {
		free(buf);
		conn_close(c);
		return;
	}
	w->buf = buf;
	w->req.data = c;
	rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, on_write);
	if (rc < 0) {
		free(buf);
		free(w);
		conn_close(c);
		return;
	}
	c->pending_writes++;
	/* A client that sends but never reads would grow this without bound. */
	if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) >
	    4 * (size_t)ctl.srv->conf->max_frame_bytes) {
		DLOG_W("control: pid %d does not read its replies; closing", (int)c->sess.pid);
		conn_close_when_drained(c);
	}
}

static void send_error(struct conn *c, Dte__Status code, const char *msg)
{
	uint8_t *out;
	size_t len;

	if (ddispatch_error(code, msg, &out, &len) == 0)
		conn_send(c, out, len);
}

static void frame_error(struct conn *c, int rc)
{
	char msg[128];

	snprintf(msg, sizeof(msg), "%s (length %u, cap %u)", dte_frame_strerror(rc),
		 dte_frame_claimed(&c->rd), ctl.srv->conf->max_frame_bytes);
	DLOG_W("control: pid %d uid %u: %s; closing", (int)c->sess.pid, (unsigned)c->sess.uid, msg);
	ctl.srv->bad_frames++;
	send_error(c, DTE__STATUS__STATUS_ERR_PROTOCOL, msg);
	conn_close_when_drained(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct conn *c = (struct conn *)h;

	*buf = uv_buf_init((char *)c->rbuf, sizeof(c->rbuf));
}

static void fd_taken(uv_handle_t *h)
{
	free(h);
}

/* libuv (ipc pipe) received descriptors with SCM_RIGHTS; it hands them out
 * only through uv_accept into a handle, so take each through a throwaway
 * pipe handle and keep a dup.  More than the session holds is abuse. */
static int take_fds(struct conn *c)
{
	while (uv_pipe_pending_count(&c->pipe) > 0) {
		uv_pipe_t *tmp = malloc(sizeof(*tmp));
		uv_os_fd_t fd;
		int dup_fd = -1;

		if (!tmp)
			return -1;
		uv_pipe_init(ctl.loop, tmp, 0);
		if (uv_accept((uv_stream_t *)&c->pipe, (uv_stream_t *)tmp) == 0 &&
		    uv_fileno((uv_handle_t *)tmp, &fd) == 0)
			dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		uv_close((uv_handle_t *)tmp, fd_taken);
		if (dup_fd < 0)
			return -1;
		if (c->sess.nfds >= DSESS_MAX_FDS) {
			close(dup_fd);
			DLOG_W("control: pid %d sent more than %d descriptors without using them; "
			       "closing", (int)c->sess.pid, DSESS_MAX_FDS);
			return -1;
		}
		c->sess.fds[c->sess.nfds++] = dup_fd;
	}
	return 0;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	struct conn *c = (struct conn *)stream;
	const uint8_t *p = (const uint8_t *)buf->base;
	size_t left = nread > 0 ? (size_t)nread : 0;

	if (take_fds(c) < 0) {
		ctl.srv->bad_frames++;
		conn_close(c);
		return;
	}

	if (nread < 0) {
		if (dte_frame_partial(&c->rd))
			DLOG_I("control: pid %d hung up mid-frame", (int)c->sess.pid);
		conn_close(c);
		return;
	}
	while (left && !c->closing) {
		const uint8_t *body;
		uint32_t blen;
		size_t used;
		int rc = dte_frame_feed(&c->rd, p, left, &used, &body, &blen);

		p += used;
		left -= used;
		if (rc < 0) {
			frame_error(c, rc);
			return;
		}
		if (rc == DTE_FRAME_NEED)
			break;

		uint8_t *out;
		size_t olen;

		if (ddispatch(ctl.srv, &c->sess, body, blen, &out, &olen) < 0) {
			conn_close(c);
			return;
		}
		if (out)	/* NULL: the handler answers later (dctl_reply) */
			conn_send(c, out, olen);
		if (c->sess.close_after && !c->closing) {
			if (!c->sess.denied)
				ctl.srv->bad_frames++;
			conn_close_when_drained(c);
		}
	}
}

static void read_creds(struct conn *c)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	gid_t groups[MAX_GROUPS];
	socklen_t glen = sizeof(groups);
	unsigned ng = 0;
	uv_os_fd_t fd;

	c->sess.uid = (uid_t)-1;
	c->sess.gid = (gid_t)-1;
	c->sess.pid = -1;
	if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		/* Unknown peer: refuse rather than guess. */
		c->sess.denied = 1;
		return;
	}
	c->sess.uid = cred.uid;
	c->sess.gid = cred.gid;
	c->sess.pid = cred.pid;
#ifdef SO_PEERGROUPS
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
		ng = glen / sizeof(gid_t);
#endif
	c->sess.denied = !dconf_peer_allowed(ctl.srv->conf, cred.uid, cred.gid, groups, ng);
}

static void on_connection(uv_stream_t *server, int status)
{
	struct conn *c;

	if (status < 0) {
		DLOG_W("control: accept: %s", uv_strerror(status));
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		DLOG_E("control: out of memory accepting a client");
		return;
	}
	/* ipc: libuv reads with recvmsg and keeps SCM_RIGHTS descriptors
	 * (register_buffer) instead of dropping them. */
	uv_pipe_init(ctl.loop, &c->pipe, 1);
	c->sess.conn_id = ++ctl.next_conn_id;
	dte_frame_reader_init(&c->rd, ctl.srv->conf->max_frame_bytes);
	c->next = ctl.conns;
	if (ctl.conns)
		ctl.conns->prev = c;
	ctl.conns = c;
	ctl.srv->clients++;
	if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
		conn_close(c);
		return;
	}
	read_creds(c);
	if (c->sess.denied) {
		/* The client still gets a reply saying why (to its first request). */
		ctl.srv->refused++;
		DLOG_W("control: refused pid %d uid %u gid %u (not in allow_uids/allow_gids)",
		       (int)c->sess.pid, (unsigned)c->sess.uid, (unsigned)c->sess.gid);
	} else if (ctl.srv->clients > ctl.srv->conf->max_clients) {
		DLOG_W("control: %u clients, over max_clients; refusing pid %d",
		       ctl.srv->clients, (int)c->sess.pid);
		send_error(c, DTE__STATUS__STATUS_ERR_BUSY, "too many clients (max_clients)");
		conn_close_when_drained(c);
		return;
	}
	DLOG_D("control: client pid %d uid %u connected", (int)c->sess.pid, (unsigned)c->sess.uid);
	uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* A socket file left by a crashed daemon is removed; one with a live
 * daemon behind it, or anything that is not a socket, is an error. */
static int clear_stale(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, rc;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : (DLOG_E("%s: %s", path, strerror(errno)), -1);
	if (!S_ISSOCK(st.st_mode)) {
		DLOG_E("%s exists and is not a socket; not touching it", path);
		return -1;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	if (rc == 0) {
		DLOG_E("%s: another dted is already listening there", path);
		return -1;
	}
	DLOG_N("removing stale socket %s", path);
	return unlink(path) < 0 && errno != ENOENT ? -1 : 0;
}

static int bind_own(void)
{
	const struct dconf *conf = ctl.srv->conf;
	char dir[sizeof(ctl.path)];
	mode_t old;
	int rc;

	snprintf(ctl.path, sizeof(ctl.path), "%s", conf->socket);
	snprintf(dir, sizeof(dir), "%s", conf->socket);
	if (mkdir(dirname(dir), 0750) < 0 && errno != EEXIST) {
		DLOG_E("cannot create %s: %s", dir, strerror(errno));
		return -1;
	}
	if (clear_stale(ctl.path) < 0)
		return -1;
	uv_pipe_init(ctl.loop, &ctl.server, 0);
	ctl.listening = 1;
	/* umask makes the socket 0660 from birth: no window where others
	 * could connect before a chmod. */
	old = umask(0117);
	rc = uv_pipe_bind(&ctl.server, ctl.path);
	umask(old);
	if (rc < 0) {
		DLOG_E("cannot bind %s: %s", ctl.path, uv_strerror(rc));
		return -1;
	}
	ctl.owns_path = 1;
	if (conf->socket_group[0]) {
		struct group *g = getgrnam(conf->socket_group);
		char *end;
		long gid = strtol(conf->socket_group, &end, 10);

		if (g)
			gid = g->gr_gid;
		else if (*end || gid < 0) {
			DLOG_E("socket_group: unknown group '%s'", conf->socket_group);
			return -1;
		}
		if (chown(ctl.path, (uid_t)-1, (gid_t)gid) < 0) {
			DLOG_E("chown %s to group %ld: %s", ctl.path, gid, strerror(errno));
			return -1;
		}
	}
	return 0;
}

static int adopt_activated(void)
{
	int n = sd_listen_fds(1);

	if (n <= 0)
		return 0;
	for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; fd++) {
		if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0)
			continue;
		uv_pipe_init(ctl.loop, &ctl.server, 0);
		ctl.listening = 1;
		if (uv_pipe_open(&ctl.server, fd) < 0)
			return -1;
		snprintf(ctl.path, sizeof(ctl.path), "(socket activation)");
		DLOG_N("using the control socket passed by systemd (fd %d)", fd);
		return 1;
	}
	DLOG_W("systemd passed %d fds but none is a listening Unix stream socket", n);
	return 0;
}

int dctl_init(uv_loop_t *loop, struct dsrv *srv)
{
	int rc;

	memset(&ctl, 0, sizeof(ctl));
	ctl.loop = loop;
	ctl.srv = srv;
	rc = adopt_activated();
	if (rc == 0)
		rc = bind_own() < 0 ? -1 : 1;
	if (rc < 0)
		goto fail;
	rc = uv_listen((uv_stream_t *)&ctl.server, 128, on_connection);
	if (rc < 0) {
		DLOG_E("listen on %s: %s", ctl.path, uv_strerror(rc));
		goto fail;
	}
	return 0;
fail:
	dctl_fini();
	return -1;
}

void dctl_fini(void)
{
	for (struct conn *c = ctl.conns; c; c = c->next)
		conn_close(c);
	if (ctl.listening) {
		uv_close((uv_handle_t *)&ctl.server, NULL);
		ctl.listening = 0;
	}
	if (ctl.owns_path) {
		unlink(ctl.path);
		ctl.owns_path = 0;
	}
}

int dctl_reply(uint64_t conn_id, Dte__Response *resp)
{
	uint8_t *out;
	size_t len;

	for (struct conn *c = ctl.conns; c; c = c->next) {
		if (c->sess.conn_id != conn_id)
			continue;
		c->sess.deferred = 0;
		if (c->closing)
			return -1;
		if (ddispatch_pack(resp, ctl.srv->conf->max_frame_bytes, &out, &len) < 0) {
			conn_close(c);
			return -1;
		}
		conn_send(c, out, len);
		return 0;
	}
	return -1;
}

const char *dctl_path(void)
{
	return ctl.path;
}
