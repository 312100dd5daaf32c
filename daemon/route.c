/* daemon/route.c — the two transports a record can take (the local
 * delivery queue here, the remote one installed by route_ucx_engine.c) and
 * the dispatch between them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "daemon/log.h"
#include "daemon/route.h"
#include "proto/peer_auth.h"

struct rec {
	struct rec *next;
	Dtep__PeerMsgType type;
	uint8_t *hdr;
	size_t hdrlen;
	uint8_t *data;
	size_t len;
	/* data given (route_send_given), not copied: release(data, rarg)
	 * when the record goes, release(NULL, rarg) when a receiver took it */
	void (*release)(void *data, void *rarg);
	void *rarg;
};

static struct {
	int init;
	uv_loop_t *loop;
	uv_idle_t idle;
	int idle_on;
	struct rec *head, *tail;
	size_t pending;
	struct route_transport inner;   /* the remote transport installed */
	struct route_transport remote;  /* ...as sends go through it (decorated) */
	int have_remote;
	const void *lend;        /* data of the record being delivered, takeable */
	const struct route_transport *lender;   /* ...from this transport's take */
	char node[64];
	char address[96];
} rt;

/* Outside rt: installed before route_init, which clears rt. */
static const struct route_decorator *dec;
/* The receiver of every record and node-down (route_set_receiver); NULL
 * until the engine registers: a record is then dropped. */
static route_recv_fn recv_fn;
static route_down_fn down_fn;
static void *recv_ctx;
static route_seal_fn seal_fn;
static void *seal_ctx;

static const struct route_transport local_transport;

static void rec_free(struct rec *r)
{
	free(r->hdr);
	if (r->release)
		r->release(r->data, r->rarg);
	else
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
		rt.lender = &local_transport;
		if (recv_fn)
			recv_fn(recv_ctx, rt.node, r->type, r->hdr, r->hdrlen, r->data, r->len);
		if (r->data && !rt.lend)
			r->data = NULL;	/* taken (route_take_data) */
		rt.lend = NULL;
		rt.lender = NULL;
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
	int e;

	memset(&rt, 0, sizeof(rt));
	rt.loop = loop;
	snprintf(rt.node, sizeof(rt.node), "%s", self_node ? self_node : "");
	snprintf(rt.address, sizeof(rt.address), "%s", self_address ? self_address : "");
	if ((e = uv_idle_init(loop, &rt.idle)) < 0)
		return e;	/* libuv's errors are negative errnos */
	if (dec && dec->init && dec->init(loop) < 0) {
		/* A test build's decorator refused its configuration. */
		uv_close((uv_handle_t *)&rt.idle, NULL);
		return -EINVAL;
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
	if (dec && dec->fini)
		dec->fini();
	rt.init = 0;
}

void route_set_decorator(const struct route_decorator *d)
{
	dec = d;
}

void route_set_remote(const struct route_transport *remote)
{
	if (remote) {
		rt.inner = *remote;
		if (dec && dec->wrap)
			dec->wrap(&rt.inner, &rt.remote);
		else
			rt.remote = rt.inner;
		rt.have_remote = 1;
	} else {
		memset(&rt.inner, 0, sizeof(rt.inner));
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

/* The local transport: records for this daemon wait in a queue drained
 * from the loop (never a direct call: a handler that sends never re-enters
 * another one).  hdr is copied into the queue; data is copied once
 * (local_send) or, given, queued as it is (local_send_given: a dense part
 * is 32 MiB, and copying it here, on the loop, stalled every client); the
 * receiver may then take it (local_take) instead of copying it again. */
static int local_queue(Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen,
		       const void *data, size_t len, void (*release)(void *data, void *rarg),
		       void *rarg)
{
	struct rec *r = calloc(1, sizeof(*r));

	if (!r) {
		if (release)
			release((void *)(uintptr_t)data, rarg);
		return -ENOMEM;
	}
	r->type = type;
	r->hdrlen = hdrlen;
	r->hdr = malloc(hdrlen ? hdrlen : 1);
	if (release) {
		r->data = (void *)(uintptr_t)data;
		r->release = release;
		r->rarg = rarg;
	} else if (len) {
		r->data = malloc(len);
		if (r->data)
			memcpy(r->data, data, len);
	}
	if (!r->hdr || (len && !r->data)) {
		rec_free(r);
		return -ENOMEM;
	}
	memcpy(r->hdr, hdr, hdrlen);
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

static int local_send(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		      const uint8_t *hdr, size_t hdrlen, const void *data, size_t len)
{
	return local_queue(type, hdr, hdrlen, data, len, NULL, NULL);
}

static int local_send_given(void *arg, const char *node, const char *address,
			    Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen, void *data,
			    size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	return local_queue(type, hdr, hdrlen, data, len, release, rarg);
}

/* A queued record's data is its own malloc'ed copy or given data (whose
 * release then hears NULL): hand it over. */
static void *local_take(void *arg, const void *data)
{
	return (void *)(uintptr_t)data;
}

static const struct route_transport local_transport = {
	.name = "local", .send = local_send, .send_given = local_send_given, .take = local_take,
};

/* Pack msg into stackbuf or a malloc'ed buffer (*hdr); a record leaving
 * for another daemon is sealed first (route_set_sealer): packed with its
 * MAC (peer_auth_mac_field), the caller's record left as it was. */
static int pack(int remote, Dtep__PeerMsgType type, const ProtobufCMessage *msg, const void *data,
		size_t len, uint8_t *stackbuf, size_t stacklen, uint8_t **hdr, size_t *hdrlen)
{
	ProtobufCBinaryData *field = NULL, keep = { 0, NULL };
	uint8_t mac[PEER_AUTH_MACBYTES];
	int rc;

	if (remote && seal_fn) {
		if ((rc = seal_fn(seal_ctx, type, msg, data, len, mac)) < 0)
			return rc;
		if (rc > 0 && (field = peer_auth_mac_field(msg))) {
			keep = *field;
			field->data = mac;
			field->len = sizeof(mac);
		}
	}
	*hdrlen = protobuf_c_message_get_packed_size(msg);
	*hdr = *hdrlen <= stacklen ? stackbuf : malloc(*hdrlen);
	if (*hdr)
		protobuf_c_message_pack(msg, *hdr);
	if (field)
		*field = keep;
	return *hdr ? 0 : -ENOMEM;
}

int route_send(const char *node, const char *address, Dtep__PeerMsgType type,
	       const ProtobufCMessage *msg, const void *data, size_t len)
{
	const struct route_transport *t = &local_transport;
	uint8_t stackbuf[512], *hdr;
	size_t hdrlen;
	int rc;

	if (!msg || (len && !data))
		return -EINVAL;
	if (!route_is_self(node, address)) {
		if (!rt.have_remote) {
			DLOG_W("route: no peer transport; cannot reach %s%s%s", node ? node : "",
			       node && address ? " at " : "", address ? address : "");
			return -EHOSTUNREACH;
		}
		t = &rt.remote;
	}
	if ((rc = pack(t != &local_transport, type, msg, data, len, stackbuf, sizeof(stackbuf),
		       &hdr, &hdrlen)) < 0)
		return rc;
	rc = t->send(t->arg, node, address, type, hdr, hdrlen, data, len);
	if (hdr != stackbuf)
		free(hdr);
	return rc;
}

int route_send_given(const char *node, const char *address, Dtep__PeerMsgType type,
		     const ProtobufCMessage *msg, void *data, size_t len,
		     void (*release)(void *data, void *rarg), void *rarg)
{
	const struct route_transport *t = &local_transport;
	uint8_t stackbuf[512], *hdr;
	size_t hdrlen;
	int rc;

	if (!route_is_self(node, address))
		t = rt.have_remote && rt.remote.send_given ? &rt.remote : NULL;
	if (!release || !data || !len || !t) {
		rc = route_send(node, address, type, msg, data, len);
		if (release)
			release(data, rarg);
		return rc;
	}
	if (!msg) {
		release(data, rarg);
		return -EINVAL;
	}
	if ((rc = pack(t != &local_transport, type, msg, data, len, stackbuf, sizeof(stackbuf),
		       &hdr, &hdrlen)) < 0) {
		release(data, rarg);
		return rc;
	}
	rc = t->send_given(t->arg, node, address, type, hdr, hdrlen, data, len, release, rarg);
	if (hdr != stackbuf)
		free(hdr);
	return rc;
}

unsigned long long route_record_key(const uint8_t *hdr, size_t hdrlen)
{
	return (unsigned long long)XXH3_64bits(hdr, hdrlen);
}

void route_deliver(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len)
{
	if (dlog_get_level() >= DLOG_DEBUG)
		DLOG_D("route: off the wire: record type %d from %s key %016llx (%zu bytes)",
		       (int)type, from_node, route_record_key(hdr, hdrlen), len);
	/* A decorator may take the record over (a test build's faults:
	 * altered, delivered twice or later). */
	if (dec && dec->deliver && dec->deliver(from_node, type, hdr, hdrlen, data, len))
		return;
	/* Only this direct delivery may take the data: a decorator's
	 * duplicate would read it again after the first delivery. */
	rt.lend = data;
	rt.lender = &rt.remote;
	if (recv_fn)
		recv_fn(recv_ctx, from_node, type, hdr, hdrlen, data, len);
	rt.lend = NULL;
	rt.lender = NULL;
}

void route_receive(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		   size_t hdrlen, const void *data, size_t len)
{
	if (recv_fn)
		recv_fn(recv_ctx, from_node, type, hdr, hdrlen, data, len);
}

void *route_take_data(const void *data)
{
	void *p = NULL;

	if (!data || data != rt.lend || !rt.lender || !rt.lender->take)
		return NULL;
	p = rt.lender->take(rt.lender->arg, data);
	if (p)
		rt.lend = NULL;
	return p;
}

void route_node_down(const char *node)
{
	if (down_fn)
		down_fn(recv_ctx, node);
}

void route_set_receiver(route_recv_fn recv, route_down_fn down, void *ctx)
{
	recv_fn = recv;
	down_fn = down;
	recv_ctx = ctx;
}

void route_set_sealer(route_seal_fn seal, void *ctx)
{
	seal_fn = seal;
	seal_ctx = ctx;
}

void route_unset(void *ctx)
{
	if (recv_ctx == ctx)
		route_set_receiver(NULL, NULL, NULL);
	if (seal_ctx == ctx)
		route_set_sealer(NULL, NULL);
}

size_t route_pending(void)
{
	return rt.pending;
}
