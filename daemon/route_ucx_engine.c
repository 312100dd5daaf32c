/* daemon/route_ucx_engine.c — the UCX router as daemon/route.h's remote
 * transport (kept apart so tools and tests use the router without the
 * engine). */
#include "daemon/route.h"
#include "daemon/route_ucx.h"

static int engine_send(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		       const uint8_t *hdr, size_t hdrlen, const void *data, size_t len)
{
	return droute_ucx_send_packed(arg, node, address, (unsigned)type, hdr, hdrlen, data, len);
}

static void engine_recv(void *arg, const char *from, unsigned type, const uint8_t *msg,
			size_t msglen, const void *data, size_t len)
{
	route_deliver(from, (Dtep__PeerMsgType)type, msg, msglen, data, len);
}

static int engine_send_given(void *arg, const char *node, const char *address,
			     Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen, void *data,
			     size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	return droute_ucx_send_given(arg, node, address, (unsigned)type, hdr, hdrlen, data, len,
				     release, rarg);
}

static void *engine_take(void *arg, const void *data)
{
	return droute_ucx_take(arg, data);
}

static int engine_node_is_at(void *arg, const char *node, const char *address)
{
	return droute_ucx_node_is_at(arg, node, address);
}

static void engine_down(void *arg, const char *node, const char *reason)
{
	route_node_down(node);
}

void droute_ucx_attach_engine(struct droute_ucx *r)
{
	struct route_transport rr = { .name = "ucx", .send = engine_send,
				      .send_given = engine_send_given, .take = engine_take,
				      .node_is_at = engine_node_is_at, .arg = r };

	if (!r) {
		route_set_remote(NULL);
		return;
	}
	droute_ucx_set_handlers(r, engine_recv, engine_down, r);
	route_set_remote(&rr);
}
