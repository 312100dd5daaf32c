/* tests/unit/test_route_ucx.c — the UCX router: record mapping, naming,
 * reordering of PAYLOAD before COUNTS, large records, staging, down and
 * restart reports, argument checks, and the [peer] configuration keys.
 *
 * Routers run in this one process on one uv loop over real UCX (tcp on
 * loopback), each with its own context, as separate daemons would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/conf.h"
#include "daemon/log.h"
#include "daemon/recvpool.h"
#include "daemon/route_ucx.h"
#include "proto/peer.pb-c.h"

#define T_COUNTS  DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS
#define T_PAYLOAD DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD
#define T_PLAN    DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN
#define T_JOIN    DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN
#define T_STAGED  DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED

/* What one router's "engine" saw. */
struct got {
	char from[DROUTE_NODE_MAX];
	unsigned type;
	uint64_t version;       /* COUNTS/PAYLOAD/STAGED */
	size_t msglen, len;
	int data_ok;            /* payload bytes match the pattern */
	void *taken;            /* droute_ucx_take's answer (side.take set) */
	const void *data;       /* the data pointer delivered */
};

struct side {
	const char *name;
	struct droute_ucx *r;
	struct got got[64];
	int ngot;
	int downs;
	char down_node[DROUTE_NODE_MAX];
	char down_reason[128];
	int closed;
	int take;               /* take PAYLOAD data (droute_ucx_take) */
};

static uv_loop_t loop;
static size_t next_queue_max;   /* for the next side_start; 0 = default */
static const char *next_advertise; /* for the next side_start; NULL = its own */

static uint8_t pattern(uint64_t seed, size_t i)
{
	return (uint8_t)(seed * 131u + i * 7u + (i >> 9));
}

static void on_recv(void *arg, const char *from, unsigned type, const uint8_t *msg,
		    size_t msglen, const void *data, size_t len)
{
	struct side *s = arg;
	struct got *g;

	if (s->ngot >= (int)(sizeof(s->got) / sizeof(s->got[0])))
		return;
	g = &s->got[s->ngot++];
	snprintf(g->from, sizeof(g->from), "%s", from);
	g->type = type;
	g->msglen = msglen;
	g->len = len;
	if (type == T_COUNTS) {
		Dtep__Counts *c = dtep__counts__unpack(NULL, msglen, msg);

		assert_non_null(c);
		g->version = c->version;
		dtep__counts__free_unpacked(c, NULL);
	} else if (type == T_PAYLOAD) {
		Dtep__Payload *p = dtep__payload__unpack(NULL, msglen, msg);

		assert_non_null(p);
		g->version = p->version;
		g->data = data;
		if (s->take)
			g->taken = droute_ucx_take(s->r, data);
		g->data_ok = 1;
		for (size_t i = 0; i < len; i++)
			if (((const uint8_t *)data)[i] != pattern(p->version, i)) {
				g->data_ok = 0;
				break;
			}
		dtep__payload__free_unpacked(p, NULL);
	} else if (type == T_PLAN) {
		Dtep__Plan *p = dtep__plan__unpack(NULL, msglen, msg);

		assert_non_null(p);
		g->version = p->n_entries;
		dtep__plan__free_unpacked(p, NULL);
	} else if (type == T_STAGED) {
		Dtep__Staged *st = dtep__staged__unpack(NULL, msglen, msg);

		assert_non_null(st);
		g->version = st->version;
		dtep__staged__free_unpacked(st, NULL);
	}
}

static void on_down(void *arg, const char *node, const char *reason)
{
	struct side *s = arg;

	s->downs++;
	snprintf(s->down_node, sizeof(s->down_node), "%s", node);
	snprintf(s->down_reason, sizeof(s->down_reason), "%s", reason);
}

static void side_start(struct side *s, const char *name, int listen)
{
	struct droute_ucx_params p = {
		.node = name,
		.listen_address = listen ? "127.0.0.1" : NULL,
		.listen_port = 0,
		.staging_bytes = 4u << 20,
		.queue_max_bytes = next_queue_max,
		.advertise = next_advertise,
		.recv = on_recv,
		.down = on_down,
		.arg = s,
	};

	memset(s, 0, sizeof(*s));
	s->name = name;
	assert_int_equal(droute_ucx_init(&s->r, &loop, &p), 0);
	if (listen && next_advertise)
		assert_string_equal(droute_ucx_address(s->r), next_advertise);
	else if (listen)
		assert_true(strncmp(droute_ucx_address(s->r), "127.0.0.1:", 10) == 0);
	else
		assert_string_equal(droute_ucx_address(s->r), "");
}

static void side_closed(void *arg)
{
	((struct side *)arg)->closed = 1;
}

static void tick(uv_timer_t *t)
{
}

/* Turn the loop until cond() or seconds pass; returns cond(). */
static int run_until(int (*cond)(void *), void *arg, double seconds)
{
	uv_timer_t t;
	uint64_t end = uv_hrtime() + (uint64_t)(seconds * 1e9);
	int ok;

	uv_timer_init(&loop, &t);
	uv_timer_start(&t, tick, 5, 5);
	while (!(ok = cond(arg)) && uv_hrtime() < end)
		uv_run(&loop, UV_RUN_ONCE);
	uv_close((uv_handle_t *)&t, NULL);
	uv_run(&loop, UV_RUN_NOWAIT);
	return ok;
}

static int closed_cond(void *arg)
{
	return ((struct side *)arg)->closed;
}

static void side_stop(struct side *s)
{
	droute_ucx_close(s->r, side_closed, s);
	assert_true(run_until(closed_cond, s, 10));
	s->r = NULL;
}

struct want {
	struct side *s;
	int n;
};

static int ngot_cond(void *arg)
{
	struct want *w = arg;

	return w->s->ngot >= w->n;
}

static int wait_got(struct side *s, int n)
{
	struct want w = { s, n };

	return run_until(ngot_cond, &w, 10);
}

static int downs_cond(void *arg)
{
	struct want *w = arg;

	return w->s->downs >= w->n;
}

static int wait_downs(struct side *s, int n, double secs)
{
	struct want w = { s, n };

	return run_until(downs_cond, &w, secs);
}

/* --- record builders --- */

static Dtep__JobRef job_ref(void)
{
	Dtep__JobRef j = DTEP__JOB_REF__INIT;

	j.job = "j1";
	j.token = "secret";
	return j;
}

static size_t pack_counts(uint8_t *buf, uint64_t version, uint64_t src, uint64_t dst)
{
	Dtep__JobRef j = job_ref();
	Dtep__Counts c = DTEP__COUNTS__INIT;
	uint64_t counts[3] = { 5, 0, 7 };

	c.job = &j;
	c.version = version;
	c.base_version = version - 1;
	c.src = src;
	c.dst = dst;
	c.n_counts = 3;
	c.counts = counts;
	c.payload_bytes = 1;
	return dtep__counts__pack(&c, buf);
}

static size_t pack_payload(uint8_t *buf, uint64_t version, uint64_t src, uint64_t dst)
{
	Dtep__JobRef j = job_ref();
	Dtep__Payload p = DTEP__PAYLOAD__INIT;

	p.job = &j;
	p.version = version;
	p.src = src;
	p.dst = dst;
	return dtep__payload__pack(&p, buf);
}

static uint8_t *pattern_buf(uint64_t seed, size_t len)
{
	uint8_t *b = malloc(len);

	assert_non_null(b);
	for (size_t i = 0; i < len; i++)
		b[i] = pattern(seed, i);
	return b;
}

static const struct droute_peer_info *find_peer(struct side *s, const char *node,
						struct droute_peer_info *buf, size_t n)
{
	size_t k = droute_ucx_peers(s->r, buf, n);

	for (size_t i = 0; i < k && i < n; i++)
		if (!strcmp(buf[i].node, node))
			return &buf[i];
	return NULL;
}

/* --- tests --- */

/* A joins B knowing only its address; B answers by name over the link A
 * opened; a PLAN far larger than an AM header arrives whole. */
static void test_by_address_then_name(void **state)
{
	struct side a, b;
	struct droute_peer_info info[8];
	const struct droute_peer_info *pi;
	Dtep__JobRef j = job_ref();
	Dtep__Join join = DTEP__JOIN__INIT;
	Dtep__Plan plan = DTEP__PLAN__INIT;
	Dtep__Entry *entries[400], ent[400];
	int64_t ext[2] = { 4096, 4096 };

	side_start(&b, "node-b", 1);
	side_start(&a, "node-a", 0);

	join.job = &j;
	join.node = "node-a";
	join.address = "";
	assert_int_equal(droute_ucx_send_addr(a.r, droute_ucx_address(b.r), T_JOIN,
					      &join.base, NULL, 0), 0);
	assert_true(wait_got(&b, 1));
	assert_string_equal(b.got[0].from, "node-a");
	assert_int_equal(b.got[0].type, T_JOIN);

	/* B never learnt an address for node-a: the accepted link serves. */
	for (int i = 0; i < 400; i++) {
		dtep__entry__init(&ent[i]);
		ent[i].id = (uint32_t)i;
		ent[i].n_extent = 2;
		ent[i].extent = ext;
		entries[i] = &ent[i];
	}
	plan.job = &j;
	plan.epoch = 3;
	plan.n_entries = 400;
	plan.entries = entries;
	assert_true(protobuf_c_message_get_packed_size(&plan.base) > DTE_PEER_HEADER_MAX);
	assert_int_equal(droute_ucx_send(b.r, "node-a", T_PLAN, &plan.base, NULL, 0), 0);
	assert_true(wait_got(&a, 1));
	assert_int_equal(a.got[0].type, T_PLAN);
	assert_string_equal(a.got[0].from, "node-b");
	assert_int_equal(a.got[0].version, 400);

	/* The node known by address now has B's name and address. */
	pi = find_peer(&a, "node-b", info, 8);
	assert_non_null(pi);
	assert_string_equal(pi->address, droute_ucx_address(b.r));
	assert_string_equal(pi->state, "up");
	assert_int_equal(pi->msgs_in >= 1, 1);
	assert_int_equal(pi->msgs_out >= 1, 1);
	assert_int_equal(droute_ucx_peers(a.r, info, 8), 1);
	assert_int_equal(droute_ucx_peers_up(a.r), 1);
	pi = find_peer(&b, "node-a", info, 8);
	assert_non_null(pi);
	assert_int_equal(pi->links, 1);
	assert_true(pi->bytes_out > DTE_PEER_HEADER_MAX);

	/* Closing A: B hears node-a down once; A's own close reports none. */
	side_stop(&a);
	assert_int_equal(a.downs, 0);
	assert_true(wait_downs(&b, 1, 10));
	assert_string_equal(b.down_node, "node-a");
	pi = find_peer(&b, "node-a", info, 8);
	assert_non_null(pi);
	assert_string_equal(pi->state, "down");
	side_stop(&b);
}

/* Where a node is (how a member knows its coordinator's PLANs): the
 * address we dialed and it answered at; a third node advertising that
 * address does not take it over. */
static void test_node_is_at(void **state)
{
	struct side a, b, c;
	Dtep__JobRef j = job_ref();
	Dtep__Join join = DTEP__JOIN__INIT;
	uint8_t h[256];
	size_t n = pack_counts(h, 1, 1, 2);
	char addr_b[DROUTE_ADDR_MAX];

	side_start(&b, "coord", 1);
	side_start(&a, "member", 1);
	snprintf(addr_b, sizeof(addr_b), "%s", droute_ucx_address(b.r));
	assert_false(droute_ucx_node_is_at(a.r, "coord", addr_b));
	join.job = &j;
	join.node = "member";
	assert_int_equal(droute_ucx_send_addr(a.r, addr_b, T_JOIN, &join.base, NULL, 0), 0);
	assert_true(wait_got(&b, 1));
	assert_true(droute_ucx_node_is_at(a.r, "coord", addr_b));
	assert_false(droute_ucx_node_is_at(a.r, "coord", "127.0.0.1:1"));
	assert_false(droute_ucx_node_is_at(a.r, "nobody", addr_b));

	next_advertise = addr_b;          /* a forger claiming the coordinator's address */
	side_start(&c, "forger", 1);
	next_advertise = NULL;
	assert_int_equal(droute_ucx_send_packed(c.r, NULL, droute_ucx_address(a.r), T_COUNTS, h, n,
						NULL, 0), 0);
	assert_true(wait_got(&a, 1));
	assert_string_equal(a.got[0].from, "forger");
	assert_false(droute_ucx_node_is_at(a.r, "forger", addr_b));
	assert_true(droute_ucx_node_is_at(a.r, "coord", addr_b));
	side_stop(&c);
	side_stop(&a);
	side_stop(&b);
}

/* Records reach the engine as they land (peer protocol 2: the engine
 * takes payload parts before their COUNTS): a PAYLOAD with no COUNTS
 * before it is delivered at once, a large one through staging, which
 * gives its extent back at once, so the next one stages too. */
static void test_payload_as_it_lands(void **state)
{
	struct side a, b;
	uint8_t h[256];
	size_t n, big = 3u << 20;   /* most of the 4 MiB staging */
	uint8_t *d1 = pattern_buf(1, big), *d2 = pattern_buf(2, big);
	struct droute_ucx_stats st;

	side_start(&b, "sink", 1);
	side_start(&a, "source", 0);
	n = pack_payload(h, 1, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, NULL, droute_ucx_address(b.r), T_PAYLOAD,
						h, n, d1, big), 0);
	assert_true(wait_got(&b, 1));
	assert_int_equal(b.got[0].type, T_PAYLOAD);
	assert_int_equal(b.got[0].version, 1);
	assert_int_equal(b.got[0].len, big);
	assert_true(b.got[0].data_ok);
	n = pack_payload(h, 2, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, "sink", NULL, T_PAYLOAD, h, n, d2, big), 0);
	assert_true(wait_got(&b, 2));
	assert_int_equal(b.got[1].version, 2);
	assert_true(b.got[1].data_ok);
	n = pack_counts(h, 2, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, "sink", NULL, T_COUNTS, h, n, NULL, 0), 0);
	assert_true(wait_got(&b, 3));
	assert_int_equal(b.got[2].type, T_COUNTS);
	droute_ucx_stats(b.r, &st);
	assert_int_equal(st.staged, 2);

	side_stop(&a);
	side_stop(&b);
	free(d1);
	free(d2);
}

/* A PAYLOAD of DROUTE_DIRECT_MIN bytes or more skips staging and lands in
 * memory of its own, which the engine may take instead of copying: the
 * taken buffer is the delivered one and outlives the callback (checked
 * after it returned, then freed here -- ASan sees a double free or a
 * leak).  A small one is staged and cannot be taken. */
static void test_payload_direct_take(void **state)
{
	struct side a, b;
	uint8_t h[256];
	size_t n, big = DROUTE_DIRECT_MIN + 4096, small = 1u << 20;
	uint8_t *d1 = pattern_buf(1, big), *d2 = pattern_buf(2, small);
	struct droute_ucx_stats st;

	side_start(&b, "sink", 1);
	b.take = 1;
	side_start(&a, "source", 0);
	n = pack_payload(h, 1, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, NULL, droute_ucx_address(b.r), T_PAYLOAD,
						h, n, d1, big), 0);
	assert_true(wait_got(&b, 1));
	n = pack_payload(h, 2, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, "sink", NULL, T_PAYLOAD, h, n, d2, small), 0);
	assert_true(wait_got(&b, 2));
	for (int k = 0; k < 2; k++) {
		struct got *g = &b.got[k];

		assert_int_equal(g->type, T_PAYLOAD);
		assert_true(g->data_ok);
		if (g->version == 1) {
			assert_int_equal(g->len, big);
			assert_non_null(g->taken);
			assert_ptr_equal(g->taken, g->data);
			/* Still ours and intact after the callback returned. */
			for (size_t i = 0; i < big; i += 4093)
				assert_int_equal(((uint8_t *)g->taken)[i], pattern(1, i));
			/* A second take of the same data gets nothing. */
			assert_null(droute_ucx_take(b.r, g->data));
			free(g->taken);
		} else {
			assert_int_equal(g->version, 2);
			assert_null(g->taken);
		}
	}
	droute_ucx_stats(b.r, &st);
	assert_int_equal(st.direct, 1);
	assert_int_equal(st.handed, 1);
	assert_int_equal(st.staged, 1);

	side_stop(&a);
	side_stop(&b);
	free(d1);
	free(d2);
}

/* With an arena prepared (a fresh sink's, daemon/recvpool.h), a large
 * PAYLOAD is received into it: a taken one is a piece of the arena, intact
 * after the callback, out until the engine gives it back; one not taken
 * goes back to the arena when the callback returns.  Once the arena is
 * retired, large payloads get memory of their own again, and the arena
 * goes when its last piece is back. */
static void test_payload_arena(void **state)
{
	struct side a, b;
	uint8_t h[256];
	size_t n, big = DROUTE_DIRECT_MIN + 4096;
	uint8_t *d1 = pattern_buf(1, big), *d2 = pattern_buf(2, big), *d3 = pattern_buf(3, big);
	struct recvpool *arena = recvpool_prepare(2 * big + 4096);
	struct recvpool_stats rs0, rs;
	struct droute_ucx_stats st;

	assert_non_null(arena);
	recvpool_stats(&rs0);
	side_start(&b, "sink", 1);
	side_start(&a, "source", 0);
	b.take = 1;
	n = pack_payload(h, 1, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, NULL, droute_ucx_address(b.r), T_PAYLOAD,
						h, n, d1, big), 0);
	assert_true(wait_got(&b, 1));
	b.take = 0;
	n = pack_payload(h, 2, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, "sink", NULL, T_PAYLOAD, h, n, d2, big), 0);
	assert_true(wait_got(&b, 2));
	assert_true(b.got[0].data_ok && b.got[1].data_ok);
	assert_int_equal(b.got[0].version, 1);
	assert_non_null(b.got[0].taken);
	assert_true(recvpool_owns(b.got[0].taken));
	for (size_t i = 0; i < big; i += 4093)
		assert_int_equal(((uint8_t *)b.got[0].taken)[i], pattern(1, i));
	assert_null(b.got[1].taken);
	recvpool_stats(&rs);
	assert_int_equal(rs.carved - rs0.carved, 2);
	assert_int_equal(rs.out - rs0.out, 1);	/* v2's piece is back */
	/* Retired: the next large payload is received into memory of its own. */
	recvpool_retire(arena);
	b.take = 1;
	n = pack_payload(h, 3, 10, 20);
	assert_int_equal(droute_ucx_send_packed(a.r, "sink", NULL, T_PAYLOAD, h, n, d3, big), 0);
	assert_true(wait_got(&b, 3));
	assert_true(b.got[2].data_ok);
	assert_non_null(b.got[2].taken);
	assert_false(recvpool_owns(b.got[2].taken));
	droute_ucx_stats(b.r, &st);
	assert_int_equal(st.direct, 3);
	assert_int_equal(st.handed, 2);
	recvpool_free(b.got[2].taken);	/* free()'d: not the arena's */
	recvpool_stats(&rs);
	assert_int_equal(rs.arenas, rs0.arenas);
	recvpool_free(b.got[0].taken);
	for (int k = 0; k < 1000 && (recvpool_stats(&rs), rs.arenas == rs0.arenas); k++)
		usleep(10000);
	assert_int_equal(rs.arenas, rs0.arenas - 1);

	side_stop(&a);
	side_stop(&b);
	free(d1);
	free(d2);
	free(d3);
}

/* A daemon that restarts under the same name: the survivor reports the
 * old incarnation down exactly once, then talks to the new one. */
static void test_restart(void **state)
{
	struct side a, b, b2;
	struct droute_peer_info info[4];
	const struct droute_peer_info *pi;
	uint8_t h[256];
	size_t n;
	uint64_t inc1;

	side_start(&a, "coord", 1);
	side_start(&b, "member", 1);
	n = pack_counts(h, 1, 1, 2);
	assert_int_equal(droute_ucx_send_packed(b.r, NULL, droute_ucx_address(a.r), T_COUNTS, h, n,
						NULL, 0), 0);
	assert_true(wait_got(&a, 1));
	pi = find_peer(&a, "member", info, 4);
	assert_non_null(pi);
	inc1 = pi->incarnation;
	assert_true(inc1 != 0);
	/* member advertised its listener: coord can reconnect by name. */
	assert_string_equal(pi->address, droute_ucx_address(b.r));

	side_stop(&b);
	assert_true(wait_downs(&a, 1, 10));
	side_start(&b2, "member", 1);
	assert_int_equal(droute_ucx_send_packed(b2.r, NULL, droute_ucx_address(a.r), T_COUNTS, h, n,
						NULL, 0), 0);
	assert_true(wait_got(&a, 2));
	pi = find_peer(&a, "member", info, 4);
	assert_non_null(pi);
	assert_true(pi->incarnation != inc1);
	assert_string_equal(pi->state, "up");
	assert_string_equal(pi->address, droute_ucx_address(b2.r));
	assert_int_equal(a.downs, 1);          /* not again for the restart */

	/* coord reaches the new member by name. */
	n = pack_counts(h, 2, 1, 2);
	assert_int_equal(droute_ucx_send_packed(a.r, "member", NULL, T_COUNTS, h, n, NULL, 0), 0);
	assert_true(wait_got(&b2, 1));
	assert_string_equal(b2.got[0].from, "coord");

	side_stop(&b2);
	side_stop(&a);
}

/* Someone greeting with a live node's name (an impostor, or a restart
 * whose old link has not failed yet) disturbs nothing: its records are
 * delivered (the engine checks tokens), ours keep going to the node that
 * is up, and it takes over only when the old node's last link goes. */
static void test_second_incarnation(void **state)
{
	struct side a, b, c, b2;
	struct droute_peer_info info[4];
	const struct droute_peer_info *pi;
	uint8_t h[256];
	size_t n = pack_counts(h, 1, 1, 2);
	uint64_t inc_b;

	side_start(&a, "coord", 1);
	side_start(&b, "member", 1);
	assert_int_equal(droute_ucx_send_packed(b.r, NULL, droute_ucx_address(a.r), T_COUNTS, h, n,
						NULL, 0), 0);
	assert_true(wait_got(&a, 1));
	inc_b = find_peer(&a, "member", info, 4)->incarnation;

	side_start(&c, "member", 1);   /* the impostor, with a listener */
	assert_int_equal(droute_ucx_send_packed(c.r, NULL, droute_ucx_address(a.r), T_COUNTS, h, n,
						NULL, 0), 0);
	assert_true(wait_got(&a, 2));
	assert_string_equal(a.got[1].from, "member");
	pi = find_peer(&a, "member", info, 4);
	assert_int_equal(pi->incarnation, inc_b);
	assert_string_equal(pi->address, droute_ucx_address(b.r));
	assert_int_equal(pi->links, 2);
	assert_int_equal(droute_ucx_send_packed(a.r, "member", NULL, T_COUNTS, h, n, NULL, 0), 0);
	assert_true(wait_got(&b, 1));
	run_until(ngot_cond, &(struct want){ &c, 1 }, 0.3);
	assert_int_equal(c.ngot, 0);
	side_stop(&c);
	run_until(downs_cond, &(struct want){ &a, 1 }, 0.5);
	assert_int_equal(a.downs, 0);
	assert_int_equal(droute_ucx_send_packed(a.r, "member", NULL, T_COUNTS, h, n, NULL, 0), 0);
	assert_true(wait_got(&b, 2));

	/* A real restart seen before the old link failed: b2 greets while b
	 * is up; when b goes, b2 takes over with one "down" for b. */
	side_start(&b2, "member", 1);
	assert_int_equal(droute_ucx_send_packed(b2.r, NULL, droute_ucx_address(a.r), T_COUNTS, h,
						n, NULL, 0), 0);
	assert_true(wait_got(&a, 3));
	assert_int_equal(a.downs, 0);
	side_stop(&b);
	assert_true(wait_downs(&a, 1, 10));
	assert_string_equal(a.down_reason, "restarted");
	pi = find_peer(&a, "member", info, 4);
	assert_true(pi->incarnation != inc_b);
	assert_string_equal(pi->state, "up");
	assert_string_equal(pi->address, droute_ucx_address(b2.r));
	assert_int_equal(droute_ucx_send_packed(a.r, "member", NULL, T_COUNTS, h, n, NULL, 0), 0);
	assert_true(wait_got(&b2, 1));
	assert_int_equal(a.downs, 1);
	side_stop(&b2);
	side_stop(&a);
}

/* Records for an address nobody listens on are dropped and reported
 * down; quick retries are refused instead of piling up connects. */
static void test_unreachable(void **state)
{
	struct side a;
	struct droute_peer_info info[4];
	uint8_t h[256];
	size_t n = pack_counts(h, 1, 1, 2);

	side_start(&a, "lonely", 0);
	assert_int_equal(droute_ucx_learn(a.r, "ghost", "127.0.0.1:1"), 0);
	assert_int_equal(droute_ucx_send_packed(a.r, "ghost", NULL, T_COUNTS, h, n, NULL, 0), 0);
	assert_true(wait_downs(&a, 1, 10));
	assert_string_equal(a.down_node, "ghost");
	assert_int_equal(droute_ucx_peers(a.r, info, 4), 1);
	assert_string_equal(info[0].state, "down");
	assert_int_equal(info[0].dropped, 1);
	assert_int_equal(droute_ucx_send_packed(a.r, "ghost", NULL, T_COUNTS, h, n, NULL, 0),
			 -ECONNREFUSED);
	side_stop(&a);
}

static void test_bad_args(void **state)
{
	struct side a;
	uint8_t h[2048] = { 0 };
	struct droute_ucx_params p = { .node = "" };
	struct droute_ucx *r;

	assert_int_equal(droute_ucx_init(&r, &loop, &p), -EINVAL);
	p.node = "x";
	p.advertise = "nonsense";
	assert_int_equal(droute_ucx_init(&r, &loop, &p), -EINVAL);

	side_start(&a, "self", 0);
	assert_int_equal(droute_ucx_send_packed(a.r, "nobody", NULL, T_COUNTS, h, 10, NULL, 0),
			 -EHOSTUNREACH);
	assert_int_equal(droute_ucx_send_packed(a.r, "self", NULL, T_COUNTS, h, 10, NULL, 0),
			 -EINVAL);
	assert_int_equal(droute_ucx_send_packed(a.r, NULL, "not-an-address", T_COUNTS, h, 10,
						NULL, 0), -EINVAL);
	assert_int_equal(droute_ucx_send_packed(a.r, NULL, NULL, T_COUNTS, h, 10, NULL, 0), -EINVAL);
	assert_int_equal(droute_ucx_send_packed(a.r, "x", "127.0.0.1:9", 0, h, 10, NULL, 0), -EINVAL);
	assert_int_equal(droute_ucx_send_packed(a.r, "x", "127.0.0.1:9", 99, h, 10, NULL, 0),
			 -EINVAL);
	/* data only with PAYLOAD; a PAYLOAD record must fit the AM header */
	assert_int_equal(droute_ucx_send_packed(a.r, "x", "127.0.0.1:9", T_COUNTS, h, 10, h, 4),
			 -EINVAL);
	assert_int_equal(droute_ucx_send_packed(a.r, "x", "127.0.0.1:9", T_PAYLOAD, h, 2000, h, 4),
			 -EMSGSIZE);
	assert_int_equal(droute_ucx_learn(a.r, "x", "127.0.0.1"), -EINVAL);
	assert_int_equal(droute_ucx_learn(a.r, "", "127.0.0.1:5"), -EINVAL);
	assert_string_equal(droute_ucx_type_name(T_COUNTS), "COUNTS");
	assert_string_equal(droute_ucx_type_name(0), "?");
	assert_string_equal(droute_ucx_type_name(1000), "?");
	side_stop(&a);
}

static void test_conf_peer(void **state)
{
	struct dconf c;
	char err[256], host[64];
	uint16_t port;

	dconf_defaults(&c);
	assert_int_equal(c.peer_staging_bytes, DCONF_DEFAULT_STAGING);
	assert_string_equal(c.peer_advertise_address, "");
	assert_int_equal(dconf_load_string(&c, "[peer]\nadvertise_address = 10.1.2.3:7000\n"
					   "staging_size = 16M\nlisten_port = 0\n", "t", err,
					   sizeof(err)), 0);
	assert_string_equal(c.peer_advertise_address, "10.1.2.3:7000");
	assert_int_equal(c.peer_staging_bytes, 16u << 20);
	assert_int_equal(c.peer_listen_port, 0);
	dconf_defaults(&c);
	assert_int_not_equal(dconf_load_string(&c, "[peer]\nadvertise_address = 10.1.2.3\n", "t",
					       err, sizeof(err)), 0);
	assert_non_null(strstr(err, "advertise_address: invalid value"));
	assert_int_not_equal(dconf_load_string(&c, "[peer]\nstaging_size = 10\n", "t", err,
					       sizeof(err)), 0);
	assert_non_null(strstr(err, "staging_size: invalid value"));

	assert_int_equal(dconf_parse_hostport("127.0.0.1:80", host, sizeof(host), &port), 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 80);
	assert_int_equal(dconf_parse_hostport("[::1]:7370", host, sizeof(host), &port), 0);
	assert_string_equal(host, "::1");
	assert_int_equal(port, 7370);
	assert_int_equal(dconf_parse_hostport("::1:80", host, sizeof(host), &port), -1);
	assert_int_equal(dconf_parse_hostport("h:", NULL, 0, NULL), -1);
	assert_int_equal(dconf_parse_hostport(":80", NULL, 0, NULL), -1);
	assert_int_equal(dconf_parse_hostport("h:65536", NULL, 0, NULL), -1);
	assert_int_equal(dconf_parse_hostport("h:8x", NULL, 0, NULL), -1);
	assert_int_equal(dconf_parse_hostport("[::1]80", NULL, 0, NULL), -1);
	assert_int_equal(dconf_parse_hostport("abcdefgh:1", host, 4, &port), -1);
}

static int setup(void **state)
{
	return uv_loop_init(&loop);
}

static int teardown(void **state)
{
	uv_run(&loop, UV_RUN_NOWAIT);
	return uv_loop_close(&loop) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conf_peer),
		cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
		cmocka_unit_test_setup_teardown(test_by_address_then_name, setup, teardown),
		cmocka_unit_test_setup_teardown(test_node_is_at, setup, teardown),
		cmocka_unit_test_setup_teardown(test_payload_as_it_lands, setup, teardown),
		cmocka_unit_test_setup_teardown(test_payload_direct_take, setup, teardown),
		cmocka_unit_test_setup_teardown(test_payload_arena, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_incarnation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unreachable, setup, teardown),
	};

	/* Loopback tcp only: the test must not depend on shared memory
	 * transports between contexts of one process. */
	setenv("UCX_TLS", "tcp", 0);
	setenv("UCX_NET_DEVICES", "lo", 0);
	dlog_init(getenv("TEST_DEBUG") ? DLOG_DEBUG : DLOG_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
