/* daemon/http_metrics.c — GET /metrics over a minimal HTTP/1.1 (libuv). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/conf.h"
#include "daemon/http_metrics.h"
#include "daemon/log.h"
#include "daemon/metrics.h"

enum { H_READING, H_WRITING, H_DRAINING };

struct hconn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t wr;
	uv_shutdown_t sd;
	int state;
	int open_handles;          /* tcp + timer; freed when both closed */
	int closing;
	int eof;                   /* the client finished sending */
	char *reply;
	size_t len;
	char buf[DHTTP_MAX_REQUEST];
	struct hconn *next, **pprev;
};

static uv_tcp_t server;
static int server_on;
static int bound_port;
static char bound_addr[80];
static char listen_error[160];
static struct hconn *conns;
static unsigned nconns;
/* Whatever a client sends after its request is read here and dropped. */
static char drain_buf[4096];

static void on_handle_closed(uv_handle_t *h)
{
	struct hconn *c = h->data;

	if (--c->open_handles)
		return;
	free(c->reply);
	free(c);
}

static void conn_close(struct hconn *c)
{
	if (c->closing)
		return;
	c->closing = 1;
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	nconns--;
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *)&c->timer, on_handle_closed);
	uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static void on_timeout(uv_timer_t *t)
{
	struct hconn *c = t->data;

	if (c->state == H_READING)
		DLOG_I("metrics http: request not complete within %d ms, closing", DHTTP_TIMEOUT_MS);
	conn_close(c);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
	struct hconn *c = req->data;

	if (status < 0 || c->eof)
		conn_close(c);
	/* else wait for the client's EOF (or the deadline) in on_read */
}

static void on_written(uv_write_t *req, int status)
{
	struct hconn *c = req->data;

	if (status < 0 || c->closing) {
		conn_close(c);
		return;
	}
	/* FIN after the reply, then drain: closing with unread request bytes
	 * would reset the connection and could destroy the reply in flight. */
	c->state = H_DRAINING;
	c->sd.data = c;
	if (uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, on_shutdown) < 0)
		conn_close(c);
}

static void respond(struct hconn *c, int code, const char *reason, const char *ctype,
		    const char *body, size_t blen, int head_only)
{
	int n;
	size_t hl;
	uv_buf_t b;

	/* Reading goes on into drain_buf: a client still sending a huge
	 * request must not block before it gets to read this reply. */
	c->state = H_WRITING;
	c->reply = malloc(256 + blen);
	if (!c->reply) {
		conn_close(c);
		return;
	}
	n = snprintf(c->reply, 256, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		     "Connection: close\r\n\r\n", code, reason, ctype, blen);
	if (n < 0 || n >= 256) {
		conn_close(c);
		return;
	}
	hl = (size_t)n;
	if (!head_only)
		memcpy(c->reply + hl, body, blen);
	b = uv_buf_init(c->reply, (unsigned)(hl + (head_only ? 0 : blen)));
	c->wr.data = c;
	if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0)
		conn_close(c);
}

static void error_reply(struct hconn *c, int code, const char *reason)
{
	char body[128];
	int n = snprintf(body, sizeof(body), "%d %s\n", code, reason);

	respond(c, code, reason, "text/plain; charset=utf-8", body, (size_t)n, 0);
}

/* The request head is complete (or over the cap): answer it. */
static void handle(struct hconn *c, size_t head_len)
{
	char *line = c->buf, *eol, *sp1, *sp2, *target;
	int head;

	if (!head_len) {
		DLOG_I("metrics http: request head over %d bytes refused", DHTTP_MAX_REQUEST);
		error_reply(c, 431, "Request Header Fields Too Large");
		return;
	}
	eol = memchr(line, '\n', head_len);
	if (!eol) {
		error_reply(c, 400, "Bad Request");
		return;
	}
	*eol = '\0';
	if (eol > line && eol[-1] == '\r')
		eol[-1] = '\0';
	sp1 = strchr(line, ' ');
	sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
	if (!sp1 || !sp2 || strncmp(sp2 + 1, "HTTP/1.", 7)) {
		error_reply(c, 400, "Bad Request");
		return;
	}
	*sp1 = *sp2 = '\0';
	target = sp1 + 1;
	head = !strcmp(line, "HEAD");
	if (strcmp(line, "GET") && !head) {
		error_reply(c, 405, "Method Not Allowed");
		return;
	}
	if (strcmp(target, "/metrics") && strncmp(target, "/metrics?", 9)) {
		error_reply(c, 404, "Not Found");
		return;
	}
	{
		size_t len = 0;
		char *text = dmetrics_render(&len);

		if (!text) {
			error_reply(c, 500, "Internal Server Error");
			return;
		}
		respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len, head);
		free(text);
	}
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
	struct hconn *c = h->data;

	if (c->state != H_READING)
		*b = uv_buf_init(drain_buf, sizeof(drain_buf));
	else
		*b = uv_buf_init(c->buf + c->len, (unsigned)(sizeof(c->buf) - c->len));
}

/* Length of the head including its blank line, 0 when not complete. */
static size_t head_end(const char *p, size_t n)
{
	for (size_t i = 0; i + 1 < n; i++) {
		if (p[i] == '\n' && p[i + 1] == '\n')
			return i + 2;
		if (i + 3 < n && !memcmp(p + i, "\r\n\r\n", 4))
			return i + 4;
	}
	return 0;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
	struct hconn *c = s->data;
	size_t end;

	if (nread < 0) {
		/* A client may half-close after its request: the reply still
		 * goes out, the connection closes after it. */
		if (nread == UV_EOF && c->state == H_WRITING)
			c->eof = 1;
		else
			conn_close(c);
		return;
	}
	if (c->state != H_READING || nread == 0)
		return;
	c->len += (size_t)nread;
	end = head_end(c->buf, c->len);
	if (end)
		handle(c, end);
	else if (c->len == sizeof(c->buf))
		handle(c, 0);
}

static void on_connection(uv_stream_t *srv, int status)
{
	struct hconn *c;

	if (status < 0)
		return;
	c = calloc(1, sizeof(*c));
	if (!c)
		return;
	uv_tcp_init(srv->loop, &c->tcp);
	uv_timer_init(srv->loop, &c->timer);
	c->tcp.data = c->timer.data = c;
	c->open_handles = 2;
	c->next = conns;
	c->pprev = &conns;
	if (conns)
		conns->pprev = &c->next;
	conns = c;
	nconns++;
	if (uv_accept(srv, (uv_stream_t *)&c->tcp) < 0) {
		conn_close(c);
		return;
	}
	if (nconns > DHTTP_MAX_CONNS) {
		DLOG_W("metrics http: more than %d connections, refusing one", DHTTP_MAX_CONNS);
		conn_close(c);
		return;
	}
	uv_timer_start(&c->timer, on_timeout, DHTTP_TIMEOUT_MS, 0);
	if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
		conn_close(c);
}

int dhttp_init(uv_loop_t *loop, const char *hostport)
{
	char host[64];
	uint16_t port;
	struct sockaddr_storage ss;
	int namelen = sizeof(ss), rc;

	bound_addr[0] = listen_error[0] = '\0';
	if (dconf_parse_hostport(hostport, host, sizeof(host), &port) < 0) {
		snprintf(listen_error, sizeof(listen_error), "'%s' is not HOST:PORT", hostport);
		DLOG_E("metrics http: %s", listen_error);
		return -1;
	}
	if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) < 0 &&
	    uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) < 0) {
		snprintf(listen_error, sizeof(listen_error),
			 "'%s' is not a numeric IPv4 or IPv6 address", host);
		DLOG_E("metrics http: %s", listen_error);
		return -1;
	}
	uv_tcp_init(loop, &server);
	server_on = 1;
	if ((rc = uv_tcp_bind(&server, (struct sockaddr *)&ss, 0)) < 0 ||
	    (rc = uv_listen((uv_stream_t *)&server, 64, on_connection)) < 0 ||
	    (rc = uv_tcp_getsockname(&server, (struct sockaddr *)&ss, &namelen)) < 0) {
		dhttp_fini();
		snprintf(listen_error, sizeof(listen_error), "cannot listen on %s: %s", hostport,
			 uv_strerror(rc));
		DLOG_E("metrics http: %s", listen_error);
		return -1;
	}
	bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port :
			   ((struct sockaddr_in *)&ss)->sin_port);
	snprintf(bound_addr, sizeof(bound_addr), "%s%s%s:%d", strchr(host, ':') ? "[" : "", host,
		 strchr(host, ':') ? "]" : "", bound_port);
	DLOG_N("metrics: serving http://%s/metrics", bound_addr);
	return 0;
}

void dhttp_fini(void)
{
	while (conns)
		conn_close(conns);
	if (server_on)
		uv_close((uv_handle_t *)&server, NULL);
	server_on = 0;
	bound_port = 0;
	bound_addr[0] = '\0';
}

int dhttp_port(void)
{
	return bound_port;
}

const char *dhttp_address(void)
{
	return bound_addr;
}

const char *dhttp_error(void)
{
	return listen_error;
}
