/* daemon/route.c — local delivery queue and the remote router hook. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/route.h"
#include "daemon/testhook.h"

struct rec {
	struct rec *next;
	Dtep__PeerMsgType type;
	uint8_t *hdr;
	size_t hdrlen;
	uint8_t *data;
	size_t len;
};

static struct {
	int init;
	uv_loop_t *loop;
	uv_idle_t idle;
	int idle_on;
	struct rec *head, *tail;
	size_t pending;
	struct route_remote remote;
	int have_remote;
	const void *lend;        /* data of the record being delivered, takeable */
	int lend_local;          /* ...and it is a local record's own copy */
	char node[64];
	char address[96];
} rt;

static void rec_free(struct rec *r)
{
	free(r->hdr);
	free(r->data);
	free(r);
}

/* Drain what is queued now; records queued meanwhile wait for the next
 * turn so two chatty handlers cannot starve the loop. */
static void on_idle(uv_idle_t *h)
{
	struct rec *r = rt.head;

	rt.head = rt.tail = NULL;
	rt.pending = 0;
	while (r) {
		struct rec *next = r->next;

		rt.lend = r->data;
		rt.lend_local = 1;
		job_peer_recv(rt.node, r->type, r->hdr, r->hdrlen, r->data, r->len);
		if (r->data && !rt.lend)
			r->data = NULL;	/* taken (route_take_data) */
		rt.lend = NULL;
		rt.lend_local = 0;
		rec_free(r);
		r = next;
	}
	if (!rt.head && rt.idle_on) {
		uv_idle_stop(&rt.idle);
		rt.idle_on = 0;
	}
}

int route_init(uv_loop_t *loop, const char *self_node, const char *self_address)
{
	memset(&rt, 0, sizeof(rt));
	rt.loop = loop;
	snprintf(rt.node, sizeof(rt.node), "%s", self_node ? self_node : "");
	snprintf(rt.address, sizeof(rt.address), "%s", self_address ? self_address : "");
	if (uv_idle_init(loop, &rt.idle) < 0)
		return -1;
	if (testhook_init(loop) < 0) {
		uv_close((uv_handle_t *)&rt.idle, NULL);
		return -1;
	}
	rt.init = 1;
	return 0;
}

void route_fini(void)
{
	struct rec *r = rt.head;

	if (!rt.init)
		return;
	while (r) {
		struct rec *next = r->next;

		rec_free(r);
		r = next;
	}
	rt.head = rt.tail = NULL;
	rt.pending = 0;
	uv_close((uv_handle_t *)&rt.idle, NULL);
	testhook_fini();
	rt.init = 0;
}

void route_set_remote(const struct route_remote *remote)
{
	if (remote) {
		rt.remote = *remote;
		rt.have_remote = 1;
	} else {
		memset(&rt.remote, 0, sizeof(rt.remote));
		rt.have_remote = 0;
	}
}

const char *route_self_node(void)
{
	return rt.node;
}

void route_set_self_address(const char *address)
{
	snprintf(rt.address, sizeof(rt.address), "%s", address ? address : "");
}

const char *route_self_address(void)
{
	return rt.address;
}

int route_is_self(const char *node, const char *address)
{
	if (node && *node)
		return strcmp(node, rt.node) == 0;
	return !address || !*address || !strcmp(address, "local") ||
	       (rt.address[0] && !strcmp(address, rt.address));
}

int route_node_is_at(const char *node, const char *address)
{
	if (!node || !*node)
		return 0;
	if (!strcmp(node, rt.node))
		return route_is_self(NULL, address);
	return rt.have_remote && rt.remote.node_is_at && address && *address &&
	       rt.remote.node_is_at(rt.remote.arg, node, address);
}

static int enqueue(Dtep__PeerMsgType type, const ProtobufCMessage *msg, const void *data,
		   size_t len)
{
	struct rec *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->type = type;
	r->hdrlen = protobuf_c_message_get_packed_size(msg);
	r->hdr = malloc(r->hdrlen ? r->hdrlen : 1);
	if (len) {
		r->data = malloc(len);
		if (r->data)
			memcpy(r->data, data, len);
	}
	if (!r->hdr || (len && !r->data)) {
		rec_free(r);
		return -ENOMEM;
	}
	protobuf_c_message_pack(msg, r->hdr);
	r->len = len;
	if (rt.tail)
		rt.tail->next = r;
	else
		rt.head = r;
	rt.tail = r;
	rt.pending++;
	if (!rt.idle_on && rt.init) {
		uv_idle_start(&rt.idle, on_idle);
		rt.idle_on = 1;
	}
	return 0;
}

int route_send(const char *node, const char *address, Dtep__PeerMsgType type,
	       const ProtobufCMessage *msg, const void *data, size_t len)
{
	uint8_t stackbuf[512], *hdr;
	size_t hdrlen;
	int rc;

	if (!msg || (len && !data))
		return -EINVAL;
	if (route_is_self(node, address))
		return enqueue(type, msg, data, len);
	if (!rt.have_remote) {
		DLOG_W("route: no peer transport; cannot reach %s%s%s", node ? node : "",
		       node && address ? " at " : "", address ? address : "");
		return -EHOSTUNREACH;
	}
	hdrlen = protobuf_c_message_get_packed_size(msg);
	hdr = hdrlen <= sizeof(stackbuf) ? stackbuf : malloc(hdrlen);
	if (!hdr)
		return -ENOMEM;
	protobuf_c_message_pack(msg, hdr);
	/* A test hook may drop it (the daemon is dying on purpose). */
	rc = testhook_send(type, hdr, hdrlen) ? 0 :
	     rt.remote.send(rt.remote.arg, node, address, type, hdr, hdrlen, data, len);
	if (hdr != stackbuf)
		free(hdr);
	return rc;
}

int route_send_given(const char *node, const char *address, Dtep__PeerMsgType type,
		     const ProtobufCMessage *msg, void *data, size_t len,
		     void (*release)(void *data, void *rarg), void *rarg)
{
	uint8_t stackbuf[512], *hdr;
	size_t hdrlen;
	int rc;

	if (!release || !data || !len || route_is_self(node, address) || !rt.have_remote ||
	    !rt.remote.send_given) {
		rc = route_send(node, address, type, msg, data, len);
		if (release)
			release(data, rarg);
		return rc;
	}
	if (!msg) {
		release(data, rarg);
		return -EINVAL;
	}
	hdrlen = protobuf_c_message_get_packed_size(msg);
	hdr = hdrlen <= sizeof(stackbuf) ? stackbuf : malloc(hdrlen);
	if (!hdr) {
		release(data, rarg);
		return -ENOMEM;
	}
	protobuf_c_message_pack(msg, hdr);
	if (testhook_send(type, hdr, hdrlen)) {
		release(data, rarg);
		rc = 0;
	} else {
		rc = rt.remote.send_given(rt.remote.arg, node, address, type, hdr, hdrlen, data,
					  len, release, rarg);
	}
	if (hdr != stackbuf)
		free(hdr);
	return rc;
}

void route_deliver(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len)
{
	/* A test hook may corrupt, duplicate or hold back remote records. */
	if (testhook_deliver(from_node, type, hdr, hdrlen, data, len))
		return;
	/* Only this direct delivery may take the data: a hook's duplicate
	 * would read it again after the first delivery. */
	rt.lend = data;
	job_peer_recv(from_node, type, hdr, hdrlen, data, len);
	rt.lend = NULL;
}

void *route_take_data(const void *data)
{
	void *p = NULL;

	if (!data || data != rt.lend)
		return NULL;
	if (rt.lend_local)
		p = (void *)(uintptr_t)data;
	else if (rt.have_remote && rt.remote.take)
		p = rt.remote.take(rt.remote.arg, data);
	if (p)
		rt.lend = NULL;
	return p;
}

void route_node_down(const char *node)
{
	job_peer_down(node);
}

size_t route_pending(void)
{
	return rt.pending;
}
