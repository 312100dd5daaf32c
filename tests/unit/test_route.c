/* tests/unit/test_route.c — daemon/route.c: the dispatch between the
 * local queue and the remote transport, the local path's hand-over
 * without a copy, and a decorator wrapping the remote transport both ways
 * (the shape the test build's fault injection takes; production installs
 * none).  The engine's entry points are doubles defined here, so route.o
 * is linked alone. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <uv.h>
#include "daemon/route.h"

#define TY_COUNTS DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS
#define TY_PAYLOAD DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD

/* ------------------------------------------------------ engine double */
static struct {
	unsigned calls;
	char from[64];
	uint64_t version;
	size_t len;
	uint8_t first;            /* data[0] as delivered */
	int take;                 /* take the data when delivered */
	void *taken;              /* what route_take_data returned */
	const void *seen;         /* the data pointer delivered */
	unsigned down;
} eng;

/* The engine's stand-in, registered with route_set_receiver (setup), its
 * context &eng: the router passes it back with every call. */
static void engine_recv(void *ctx, const char *from_node, Dtep__PeerMsgType type,
			const uint8_t *hdr, size_t hdrlen, const void *data, size_t len)
{
	Dtep__Counts *c = dtep__counts__unpack(NULL, hdrlen, hdr);

	assert_ptr_equal(ctx, &eng);
	eng.calls++;
	snprintf(eng.from, sizeof(eng.from), "%s", from_node ? from_node : "");
	eng.version = c ? c->version : 0;
	if (c)
		dtep__counts__free_unpacked(c, NULL);
	eng.len = len;
	eng.seen = data;
	eng.first = len ? ((const uint8_t *)data)[0] : 0;
	if (eng.take) {
		eng.taken = route_take_data(data);
		/* A second take of the same record gets nothing. */
		assert_null(route_take_data(data));
	}
}

static void engine_down(void *ctx, const char *node)
{
	assert_ptr_equal(ctx, &eng);
	eng.down++;
}

/* --------------------------------------------------- remote transport */
static struct {
	unsigned sends, givens, takes;
	char node[64];
	uint64_t version;
	size_t len;
	int rc;
	void *take_ret;
} ft;

static uint64_t hdr_version(const uint8_t *hdr, size_t hdrlen)
{
	Dtep__Counts *c = dtep__counts__unpack(NULL, hdrlen, hdr);
	uint64_t v = c ? c->version : 0;

	if (c)
		dtep__counts__free_unpacked(c, NULL);
	return v;
}

static int ft_send(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		   const uint8_t *hdr, size_t hdrlen, const void *data, size_t len)
{
	assert_ptr_equal(arg, &ft);
	ft.sends++;
	snprintf(ft.node, sizeof(ft.node), "%s", node ? node : "");
	ft.version = hdr_version(hdr, hdrlen);
	ft.len = len;
	return ft.rc;
}

static int ft_send_given(void *arg, const char *node, const char *address,
			 Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen, void *data,
			 size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	ft.givens++;
	ft.version = hdr_version(hdr, hdrlen);
	ft.len = len;
	release(data, rarg);
	return ft.rc;
}

static void *ft_take(void *arg, const void *data)
{
	ft.takes++;
	return ft.take_ret;
}

static const struct route_transport fake = {
	.name = "fake", .send = ft_send, .send_given = ft_send_given, .take = ft_take, .arg = &ft,
};

/* ---------------------------------------------------------- decorator */
static struct {
	unsigned inits, finis, wraps, sends, delivers, takes;
	int init_rc;
	int drop_version;         /* sends of this version are dropped */
	int own_version;          /* deliveries of this version: decorator's */
	struct route_transport inner;
} dc;

static int dc_init(uv_loop_t *loop)
{
	assert_non_null(loop);
	dc.inits++;
	return dc.init_rc;
}

static void dc_fini(void)
{
	dc.finis++;
}

static int dc_send(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		   const uint8_t *hdr, size_t hdrlen, const void *data, size_t len)
{
	dc.sends++;
	if (hdr_version(hdr, hdrlen) == (uint64_t)dc.drop_version)
		return 0;
	return dc.inner.send(dc.inner.arg, node, address, type, hdr, hdrlen, data, len);
}

static void *dc_take(void *arg, const void *data)
{
	dc.takes++;
	return dc.inner.take(dc.inner.arg, data);
}

static void dc_wrap(const struct route_transport *inner, struct route_transport *outer)
{
	dc.wraps++;
	dc.inner = *inner;
	memset(outer, 0, sizeof(*outer));
	outer->name = inner->name;
	outer->send = dc_send;
	outer->take = inner->take ? dc_take : NULL;
}

static int dc_deliver(const char *from, Dtep__PeerMsgType type, const uint8_t *hdr,
		      size_t hdrlen, const void *data, size_t len)
{
	uint8_t flipped = 0;

	dc.delivers++;
	if (hdr_version(hdr, hdrlen) != (uint64_t)dc.own_version)
		return 0;
	/* Taken over: delivered altered (the first data byte flipped). */
	if (len)
		flipped = ((const uint8_t *)data)[0] ^ 0xff;
	engine_recv(&eng, from, type, hdr, hdrlen, len ? &flipped : NULL, len ? 1 : 0);
	return 1;
}

static const struct route_decorator decorator = {
	.init = dc_init, .fini = dc_fini, .wrap = dc_wrap, .deliver = dc_deliver,
};

/* ------------------------------------------------------------ helpers */
static int send_counts(const char *node, uint64_t version, const void *data, size_t len)
{
	Dtep__Counts c = DTEP__COUNTS__INIT;

	c.version = version;
	return route_send(node, NULL, TY_COUNTS, &c.base, data, len);
}

static void deliver_counts(uint64_t version, const void *data, size_t len)
{
	Dtep__Counts c = DTEP__COUNTS__INIT;
	uint8_t buf[64];
	size_t n;

	c.version = version;
	n = dtep__counts__pack(&c, buf);
	route_deliver("peer", TY_COUNTS, buf, n, data, len);
}

static unsigned released;
static void *released_data;

static void release_cb(void *data, void *rarg)
{
	released++;
	released_data = data;
	assert_ptr_equal(rarg, &released);
}

static void reset(void)
{
	memset(&eng, 0, sizeof(eng));
	memset(&ft, 0, sizeof(ft));
	memset(&dc, 0, sizeof(dc));
	released = 0;
}

static void finish(uv_loop_t *loop)
{
	route_set_remote(NULL);
	route_fini();
	route_set_decorator(NULL);
	uv_run(loop, UV_RUN_NOWAIT);
}

/* -------------------------------------------------------------- tests */

/* A record for this daemon goes through the local queue: never delivered
 * inside route_send, delivered from the loop, and its data handed over
 * without a copy (the queue's own buffer). */
static void test_local_queue_hands_over(void **state)
{
	uv_loop_t *loop = *state;
	uint8_t data[3] = { 7, 8, 9 };

	reset();
	assert_int_equal(route_init(loop, "me", "10.0.0.1:7000"), 0);
	route_set_remote(&fake);
	assert_int_equal(send_counts("me", 11, data, sizeof(data)), 0);
	assert_int_equal(send_counts(NULL, 12, NULL, 0), 0);   /* no node: "local" */
	assert_int_equal(route_pending(), 2);
	assert_int_equal(eng.calls, 0);
	uv_run(loop, UV_RUN_NOWAIT);
	assert_int_equal(eng.calls, 2);
	assert_int_equal(route_pending(), 0);
	assert_string_equal(eng.from, "me");
	assert_int_equal(eng.version, 12);
	assert_int_equal(ft.sends + ft.givens + ft.takes, 0);   /* remote untouched */
	finish(loop);

	/* The taken buffer is the queued copy: malloc'ed, ours to free. */
	reset();
	assert_int_equal(route_init(loop, "me", ""), 0);
	eng.take = 1;
	assert_int_equal(send_counts("me", 13, data, sizeof(data)), 0);
	uv_run(loop, UV_RUN_NOWAIT);
	assert_int_equal(eng.calls, 1);
	assert_non_null(eng.taken);
	assert_ptr_equal(eng.taken, eng.seen);
	assert_ptr_not_equal(eng.taken, data);
	assert_memory_equal(eng.taken, data, sizeof(data));
	free(eng.taken);
	/* Given data to this daemon: queued as it is (a dense part is 32 MiB:
	 * no copy on the loop); released with its pointer when the record goes
	 * untaken, with NULL when the receiver took it. */
	{
		Dtep__Counts c = DTEP__COUNTS__INIT;
		uint8_t *given = malloc(4);

		memcpy(given, "abcd", 4);
		c.version = 14;
		assert_int_equal(route_send_given("me", NULL, TY_PAYLOAD, &c.base, given, 4,
						  release_cb, &released), 0);
		assert_int_equal(released, 0);
		eng.take = 0;
		uv_run(loop, UV_RUN_NOWAIT);
		assert_int_equal(eng.calls, 2);
		assert_int_equal(eng.first, 'a');
		assert_ptr_equal(eng.seen, given);	/* not copied */
		assert_int_equal(released, 1);
		assert_ptr_equal(released_data, given);
		free(given);

		given = malloc(4);
		memcpy(given, "wxyz", 4);
		c.version = 15;
		assert_int_equal(route_send_given("me", NULL, TY_PAYLOAD, &c.base, given, 4,
						  release_cb, &released), 0);
		eng.take = 1;
		uv_run(loop, UV_RUN_NOWAIT);
		assert_int_equal(eng.calls, 3);
		assert_ptr_equal(eng.taken, given);
		assert_int_equal(released, 2);
		assert_null(released_data);
		free(eng.taken);
	}
	finish(loop);
}

/* Records for another node go to the remote transport; with none, the
 * send fails and nothing is queued. */
static void test_remote_dispatch(void **state)
{
	uv_loop_t *loop = *state;
	uint8_t *given;

	reset();
	assert_int_equal(route_init(loop, "me", ""), 0);
	assert_int_equal(send_counts("other", 1, NULL, 0), -EHOSTUNREACH);
	assert_int_equal(route_pending(), 0);
	route_set_remote(&fake);
	assert_int_equal(send_counts("other", 2, "xy", 2), 0);
	assert_int_equal(ft.sends, 1);
	assert_string_equal(ft.node, "other");
	assert_int_equal(ft.version, 2);
	assert_int_equal(ft.len, 2);
	ft.rc = -EPIPE;
	assert_int_equal(send_counts("other", 3, NULL, 0), -EPIPE);
	ft.rc = 0;
	/* Given data goes out without a copy through send_given. */
	given = malloc(8);
	{
		Dtep__Counts c = DTEP__COUNTS__INIT;

		c.version = 4;
		assert_int_equal(route_send_given("other", NULL, TY_PAYLOAD, &c.base, given, 8,
						  release_cb, &released), 0);
	}
	assert_int_equal(ft.givens, 1);
	assert_int_equal(ft.version, 4);
	assert_int_equal(released, 1);
	free(given);
	assert_int_equal(route_pending(), 0);
	/* A received record is delivered at once; its data is the remote
	 * transport's to hand over. */
	ft.take_ret = (void *)&ft;
	eng.take = 1;
	deliver_counts(5, "q", 1);
	assert_int_equal(eng.calls, 1);
	assert_int_equal(eng.version, 5);
	assert_string_equal(eng.from, "peer");
	assert_int_equal(ft.takes, 1);
	assert_ptr_equal(eng.taken, &ft);
	/* Outside a delivery nothing can be taken. */
	assert_null(route_take_data("q"));
	route_node_down("peer");
	assert_int_equal(eng.down, 1);
	finish(loop);
}

/* A decorator wraps the remote transport both ways: it is initialised by
 * route_init (and can refuse it), every remote send goes through it (and
 * it can drop one), every received record passes it (and it can take one
 * over, then the engine cannot take the data), local records never see
 * it, and route_fini closes it. */
static void test_decorator(void **state)
{
	uv_loop_t *loop = *state;
	uint8_t byte = 0x0f;

	reset();
	route_set_decorator(&decorator);
	dc.init_rc = -1;
	assert_int_equal(route_init(loop, "me", ""), -EINVAL);
	assert_int_equal(dc.inits, 1);
	uv_run(loop, UV_RUN_NOWAIT);   /* the idle handle it closed */

	reset();
	dc.drop_version = 7;
	dc.own_version = 8;
	assert_int_equal(route_init(loop, "me", ""), 0);
	assert_int_equal(dc.inits, 1);
	route_set_remote(&fake);
	assert_int_equal(dc.wraps, 1);
	assert_int_equal(send_counts("other", 6, NULL, 0), 0);
	assert_int_equal(dc.sends, 1);
	assert_int_equal(ft.sends, 1);
	assert_int_equal(send_counts("other", 7, NULL, 0), 0);   /* dropped */
	assert_int_equal(dc.sends, 2);
	assert_int_equal(ft.sends, 1);
	/* The inner transport had send_given; the decorator offered none, so
	 * a given send goes through the decorator's send (a copy). */
	{
		Dtep__Counts c = DTEP__COUNTS__INIT;
		uint8_t *given = malloc(2);

		c.version = 9;
		assert_int_equal(route_send_given("other", NULL, TY_PAYLOAD, &c.base, given, 2,
						  release_cb, &released), 0);
		assert_int_equal(released, 1);
		assert_int_equal(dc.sends, 3);
		assert_int_equal(ft.givens, 0);
		assert_int_equal(ft.sends, 2);
		free(given);
	}
	/* Local records bypass the decorator. */
	assert_int_equal(send_counts("me", 7, NULL, 0), 0);
	uv_run(loop, UV_RUN_NOWAIT);
	assert_int_equal(eng.calls, 1);
	assert_int_equal(dc.sends, 3);
	assert_int_equal(dc.delivers, 0);
	/* Passed through: delivered as usual, take through the decorator. */
	ft.take_ret = (void *)&dc;
	eng.take = 1;
	deliver_counts(6, &byte, 1);
	assert_int_equal(dc.delivers, 1);
	assert_int_equal(eng.calls, 2);
	assert_int_equal(eng.first, 0x0f);
	assert_int_equal(dc.takes, 1);
	assert_ptr_equal(eng.taken, &dc);
	/* Taken over: the decorator's altered copy; nothing to take. */
	eng.taken = NULL;
	deliver_counts(8, &byte, 1);
	assert_int_equal(dc.delivers, 2);
	assert_int_equal(eng.calls, 3);
	assert_int_equal(eng.version, 8);
	assert_int_equal(eng.first, 0xf0);
	assert_null(eng.taken);
	assert_int_equal(dc.takes, 1);
	assert_int_equal(dc.finis, 0);
	finish(loop);
	assert_int_equal(dc.finis, 1);

	/* Removed, it is neither initialised nor consulted. */
	reset();
	assert_int_equal(route_init(loop, "me", ""), 0);
	route_set_remote(&fake);
	assert_int_equal(send_counts("other", 7, NULL, 0), 0);
	deliver_counts(8, &byte, 1);
	assert_int_equal(dc.inits + dc.wraps + dc.sends + dc.delivers, 0);
	assert_int_equal(ft.sends, 1);
	assert_int_equal(eng.first, 0x0f);
	finish(loop);
}

static int setup(void **state)
{
	uv_loop_t *loop = malloc(sizeof(*loop));

	if (!loop || uv_loop_init(loop))
		return -1;
	*state = loop;
	route_set_receiver(engine_recv, engine_down, &eng);
	return 0;
}

static int teardown(void **state)
{
	uv_loop_t *loop = *state;

	uv_run(loop, UV_RUN_NOWAIT);
	assert_int_equal(uv_loop_close(loop), 0);
	free(loop);
	return 0;
}

/* The router names no engine: records and node-downs go to the receiver
 * registered with route_set_receiver (the engine's dte_engine_new), which is
 * kept across route_init; with none registered a record is dropped (its
 * queued copy freed) and a node-down goes nowhere. */
static void test_receiver_registration(void **state)
{
	uv_loop_t *loop = *state;
	uint8_t data[3] = { 1, 2, 3 };

	reset();
	route_set_receiver(NULL, NULL, NULL);
	assert_int_equal(route_init(loop, "me", ""), 0);
	assert_int_equal(send_counts("me", 21, data, sizeof(data)), 0);
	assert_int_equal(route_pending(), 1);
	uv_run(loop, UV_RUN_NOWAIT);
	assert_int_equal(route_pending(), 0);
	deliver_counts(22, data, sizeof(data));
	route_node_down("peer");
	assert_int_equal(eng.calls + eng.down, 0);
	finish(loop);

	/* Registered before route_init, kept by it: both paths reach it. */
	reset();
	route_set_receiver(engine_recv, engine_down, &eng);
	assert_int_equal(route_init(loop, "me", ""), 0);
	assert_int_equal(send_counts("me", 23, data, sizeof(data)), 0);
	uv_run(loop, UV_RUN_NOWAIT);
	assert_int_equal(eng.calls, 1);
	assert_int_equal(eng.version, 23);
	assert_string_equal(eng.from, "me");
	deliver_counts(24, data, sizeof(data));
	assert_int_equal(eng.calls, 2);
	assert_int_equal(eng.version, 24);
	assert_string_equal(eng.from, "peer");
	route_node_down("peer");
	assert_int_equal(eng.down, 1);
	finish(loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_local_queue_hands_over),
		cmocka_unit_test(test_remote_dispatch),
		cmocka_unit_test(test_decorator),
		cmocka_unit_test(test_receiver_registration),
	};

	return cmocka_run_group_tests_name("route", tests, setup, teardown);
}
