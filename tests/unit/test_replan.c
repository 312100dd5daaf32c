/* tests/unit/test_replan.c — the coordinator's re-plan (daemon/job_coord.c):
 * the cached plans and their index by sink rank give each member exactly
 * what a plan made from scratch gives it, after a leave and after a join,
 * and each member's PLAN names its own participants and peers only.
 *
 * One coordinator engine per membership, on a stub transport that keeps
 * the last PLAN sent to each node (tests/bench/bench_replan.c drives the
 * same thing at 1000 nodes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "tests/unit/slurp.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/layout/plan.h"
#include "daemon/log.h"
#include "gpu/backend.h"
#include "proto/peer_auth.h"
#include "proto/peer_protocol.h"

#define JOB "rp"
#define TOKEN "rp-token"
#define NODES 16

struct tnode {
	const char *name;
	int role;
	const char *layout;
	uint32_t rank[2], replica;
	unsigned nparts;
	uint64_t seq;
	uint32_t inc;	/* a restarted rank attaches under a new id */
};

/* Sources megatron:tp=2,dp=2 on four nodes; sglang:tp=2 replicas 0 and 1
 * one rank per node, replica 2 both ranks on one node; one sglang:tp=1
 * replica (a second sink layout, a second cached plan). */
static const struct tnode members0[] = {
	{ "src0", DTEP__ROLE__ROLE_SOURCE, "megatron:tp=2,dp=2", { 0 }, 0, 1, 0, 0 },
	{ "src1", DTEP__ROLE__ROLE_SOURCE, "megatron:tp=2,dp=2", { 1 }, 0, 1, 0, 0 },
	{ "src2", DTEP__ROLE__ROLE_SOURCE, "megatron:tp=2,dp=2", { 2 }, 0, 1, 0, 0 },
	{ "src3", DTEP__ROLE__ROLE_SOURCE, "megatron:tp=2,dp=2", { 3 }, 0, 1, 0, 0 },
	{ "snk00", DTEP__ROLE__ROLE_SINK, "sglang:tp=2", { 0 }, 0, 1, 0, 0 },
	{ "snk01", DTEP__ROLE__ROLE_SINK, "sglang:tp=2", { 1 }, 0, 1, 0, 0 },
	{ "snk10", DTEP__ROLE__ROLE_SINK, "sglang:tp=2", { 0 }, 1, 1, 0, 0 },
	{ "snk11", DTEP__ROLE__ROLE_SINK, "sglang:tp=2", { 1 }, 1, 1, 0, 0 },
	{ "snk2", DTEP__ROLE__ROLE_SINK, "sglang:tp=2", { 0, 1 }, 2, 2, 0, 0 },
	{ "one0", DTEP__ROLE__ROLE_SINK, "sglang:tp=1", { 0 }, 0, 1, 0, 0 },
};
#define NMEM (sizeof(members0) / sizeof(members0[0]))

/* One coordinator and what it last sent each node. */
struct coord {
	struct dte_engine *e;
	dte_io_recv_fn recv;
	void *engine;
	struct tnode mem[NMEM];
	Dtep__Plan *last[NMEM];
	unsigned plans[NMEM];
	char *shards[NMEM];	/* a sharded source's table, its JOIN's */
};

static char *config;
static uint8_t key[PEER_AUTH_KEYBYTES];
static uint64_t now_ns = 1000000000ull;

static int node_idx(const char *name)
{
	for (unsigned i = 0; name && i < NMEM; i++)
		if (!strcmp(members0[i].name, name))
			return (int)i;
	return -1;
}

static uint64_t io_now(void *ctx)
{
	return now_ns;
}

static int io_send(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
		   const ProtobufCMessage *msg, const void *data, size_t len)
{
	struct coord *c = ctx;
	int i = node_idx(node);
	size_t n;
	uint8_t *buf, *again;

	if (type != DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN || i < 0)
		return 0;
	n = protobuf_c_message_get_packed_size(msg);
	assert_non_null(buf = malloc(n ? n : 1));
	protobuf_c_message_pack(msg, buf);
	if (c->last[i])
		dtep__plan__free_unpacked(c->last[i], NULL);
	assert_non_null(c->last[i] = dtep__plan__unpack(NULL, n, buf));
	/* The bytes are those packing what was decoded gives (entries go
	 * pre-packed): what a receiver's MAC check repacks. */
	assert_int_equal(protobuf_c_message_get_packed_size(&c->last[i]->base), n);
	assert_non_null(again = malloc(n ? n : 1));
	protobuf_c_message_pack(&c->last[i]->base, again);
	assert_memory_equal(buf, again, n);
	free(again);
	c->plans[i]++;
	free(buf);
	return 0;
}

static const char *io_self_node(void *ctx)
{
	return "coord";
}

static const char *io_self_address(void *ctx)
{
	return "rp:coord";
}

static int io_is_self(void *ctx, const char *node, const char *address)
{
	if (node)
		return !strcmp(node, "coord");
	return !address || !*address || !strcmp(address, "local") || !strcmp(address, "rp:coord");
}

static int io_node_is_at(void *ctx, const char *node, const char *address)
{
	return 0;
}

static void io_attach(void *ctx, dte_io_recv_fn recv, dte_io_down_fn down, dte_io_seal_fn seal,
		      void *engine)
{
	struct coord *c = ctx;

	c->recv = recv;
	c->engine = engine;
}

static void io_detach(void *ctx, void *engine)
{
	((struct coord *)ctx)->recv = NULL;
}

static void coord_new(struct coord *c)
{
	struct dte_engine_io io = {
		.ctx = c,
		.now_ns = io_now,
		.send = io_send,
		.self_node = io_self_node,
		.self_address = io_self_address,
		.is_self = io_is_self,
		.node_is_at = io_node_is_at,
		.attach = io_attach,
		.detach = io_detach,
	};
	struct jcreate_args jc = { 0 };
	struct jcreate_res jr = { 0 };
	char err[512];

	memset(c, 0, sizeof(*c));
	memcpy(c->mem, members0, sizeof(members0));
	assert_non_null(c->e = dte_engine_new_io(&io, dtc_backend_cpu(), "cpu"));
	jc.name = JOB;
	jc.model_config = config;
	jc.token = TOKEN;
	jc.coordinator = "rp:coord";
	if (job_create(c->e, &jc, &jr, err, sizeof(err)))
		fail_msg("job_create: %s", err);
	assert_true(jr.coordinator);
}

static void coord_free(struct coord *c)
{
	dte_engine_free(c->e);
	for (unsigned i = 0; i < NMEM; i++) {
		if (c->last[i])
			dtep__plan__free_unpacked(c->last[i], NULL);
		free(c->shards[i]);
	}
}

static uint64_t part_id(unsigned node, unsigned k)
{
	return ((uint64_t)(node + 1) << 32) | (k + 1);
}

static uint64_t id_of(const struct coord *c, unsigned node, unsigned k)
{
	return part_id(node, k) | (uint64_t)c->mem[node].inc << 16;
}

static void deliver(struct coord *c, const char *from, Dtep__PeerMsgType type,
		    ProtobufCMessage *msg)
{
	uint8_t mac[PEER_AUTH_MACBYTES], *hdr;
	size_t len;

	assert_int_equal(peer_auth_seal(key, type, msg, NULL, 0, mac), 0);
	len = protobuf_c_message_get_packed_size(msg);
	assert_non_null(hdr = malloc(len ? len : 1));
	protobuf_c_message_pack(msg, hdr);
	c->recv(c->engine, from, type, hdr, len, NULL, 0);
	free(hdr);
	now_ns += 1000000;
}

static void join(struct coord *c, unsigned i)
{
	struct tnode *n = &c->mem[i];
	struct job *j = job_find(c->e, JOB);
	Dtep__Join m = DTEP__JOIN__INIT;
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	Dtep__Participant p[2], *pp[2];
	char addr[32];

	snprintf(addr, sizeof(addr), "10.0.0.%u:1", i + 1);
	ref.job = JOB;
	m.job = &ref;
	m.spec_hash = j->spec.hash;
	m.node = (char *)n->name;
	m.address = addr;
	m.peer_proto = PEER_PROTO_VERSION;
	m.join_boot = 1 + i;
	m.join_seq = ++n->seq;
	for (unsigned k = 0; k < n->nparts; k++) {
		dtep__participant__init(&p[k]);
		p[k].id = id_of(c, i, k);
		p[k].role = n->role;
		p[k].layout = (char *)n->layout;
		p[k].rank = n->rank[k];
		p[k].replica = n->replica;
		p[k].node = (char *)n->name;
		p[k].shards = c->shards[i] ? c->shards[i] : "";
		pp[k] = &p[k];
	}
	m.n_participants = n->nparts;
	m.participants = pp;
	deliver(c, n->name, DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, &m.base);
}

static void leave(struct coord *c, unsigned i)
{
	Dtep__Leave m = DTEP__LEAVE__INIT;
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	uint64_t ids[2];

	for (unsigned k = 0; k < c->mem[i].nparts; k++)
		ids[k] = id_of(c, i, k);
	ref.job = JOB;
	m.job = &ref;
	m.node = (char *)c->mem[i].name;
	m.n_participants = c->mem[i].nparts;
	m.participants = ids;
	deliver(c, c->mem[i].name, DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE, &m.base);
}

static int on_node(const Dtep__Plan *p, uint64_t id, const char *node)
{
	for (size_t i = 0; i < p->n_participants; i++)
		if (p->participants[i]->id == id)
			return !strcmp(p->participants[i]->node, node);
	fail_msg("participant %llx of an entry not in the PLAN", (unsigned long long)id);
	return 0;
}

/* Node i's last PLAN from a and from b are the same part: entries (in
 * order, byte for byte), participants and addresses; and it is only its
 * own: every entry has an end on it, every participant is on it or at
 * an entry's other end. */
static void same_part(const struct coord *a, const struct coord *b, unsigned i)
{
	const Dtep__Plan *x = a->last[i], *y = b->last[i];
	const char *node = members0[i].name;
	uint8_t bx[512], by[512];

	assert_non_null(x);
	assert_non_null(y);
	assert_int_equal(x->complete, y->complete);
	assert_int_equal(x->n_entries, y->n_entries);
	assert_true(x->n_entries > 0);
	for (size_t k = 0; k < x->n_entries; k++) {
		size_t lx = protobuf_c_message_get_packed_size(&x->entries[k]->base);
		size_t ly = protobuf_c_message_get_packed_size(&y->entries[k]->base);

		assert_true(lx <= sizeof(bx));
		assert_int_equal(lx, ly);
		protobuf_c_message_pack(&x->entries[k]->base, bx);
		protobuf_c_message_pack(&y->entries[k]->base, by);
		assert_memory_equal(bx, by, lx);
		assert_true(on_node(x, x->entries[k]->src, node) || on_node(x, x->entries[k]->dst, node));
	}
	assert_int_equal(x->n_participants, y->n_participants);
	for (size_t k = 0; k < x->n_participants; k++) {
		const Dtep__Participant *p = x->participants[k];
		int peer = !strcmp(p->node, node);

		assert_int_equal(p->id, y->participants[k]->id);
		for (size_t e = 0; !peer && e < x->n_entries; e++)
			peer = x->entries[e]->src == p->id || x->entries[e]->dst == p->id;
		assert_true(peer);
	}
	assert_int_equal(x->n_addresses, y->n_addresses);
	for (size_t k = 0; k < x->n_addresses; k++)
		assert_string_equal(x->addresses[k]->key, y->addresses[k]->key);
}


/* ------------------------------------------------ the plan, walked whole */

struct blob {
	size_t len;
	uint8_t b[256];
};

static int blob_cmp(const void *x, const void *y)
{
	const struct blob *a = x, *b = y;

	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return memcmp(a->b, b->b, a->len);
}

static void blob_of(const Dtep__Entry *e, struct blob *out)
{
	out->len = protobuf_c_message_get_packed_size(&e->base);
	assert_true(out->len <= sizeof(out->b));
	protobuf_c_message_pack(&e->base, out->b);
}

/* What node i must get with the members in present[], computed as the
 * coordinator did before its plans were cached: every sink participant
 * walks its layout's whole plan for the entries of its rank.  Compared,
 * as sets, with what c last sent it. */
static void whole_walk(const struct coord *c, const int *present, unsigned i)
{
	struct job *j = job_find(c->e, JOB);
	struct dte_layout src, sink;
	struct dte_plan plan;
	struct dte_plan_opts opts = { 1, 0 };
	struct blob *want = calloc(4096, sizeof(*want)), *got = calloc(4096, sizeof(*got));
	const Dtep__Plan *x = c->last[i];
	size_t nw = 0;
	char err[512];

	assert_non_null(want);
	assert_non_null(got);
	assert_non_null(x);
	assert_int_equal(jlayout_build(j, JROLE_SOURCE, "megatron:tp=2,dp=2", 0, NULL, &src, err,
				       sizeof(err)), 0);
	for (unsigned d = 0; d < NMEM; d++) {
		if (!present[d] || members0[d].role != DTEP__ROLE__ROLE_SINK)
			continue;
		assert_int_equal(jlayout_build(j, JROLE_SINK, members0[d].layout, 0, NULL, &sink, err,
					       sizeof(err)), 0);
		assert_int_equal(dte_plan_build(&plan, &j->spec, &src, &sink, &opts, err,
						sizeof(err)), 0);
		for (unsigned k = 0; k < members0[d].nparts; k++) {
			uint32_t cnt[4] = { 0 };

			for (size_t q = 0; q < plan.n; q++) {
				struct dte_plan_entry pe;
				Dtep__Entry e = DTEP__ENTRY__INIT;
				unsigned s;

				dte_plan_entry(&plan, q, &pe);
				if (pe.sink_rank != members0[d].rank[k])
					continue;
				assert_true(pe.src_rank < 4);
				s = pe.src_rank;	/* src<r> holds rank r */
				e.id = cnt[s]++;
				if (!present[s] || (s != i && d != i))
					continue;
				e.src = part_id(s, 0);
				e.dst = part_id(d, k);
				e.tensor = pe.tensor;
				e.group = pe.group;
				e.dst_buffer = pe.sink_buf;
				e.src_buffer = pe.src_buf;
				e.src_buffer_m = pe.src_buf_m;
				e.src_buffer_v = pe.src_buf_v;
				e.n_extent = e.n_src_stride = e.n_dst_stride = pe.map.ndim;
				e.extent = pe.map.extent;
				e.src_stride = pe.map.src_stride;
				e.dst_stride = pe.map.dst_stride;
				e.src_offset = pe.map.src_offset;
				e.dst_offset = pe.map.dst_offset;
				assert_true(nw < 4096);
				blob_of(&e, &want[nw++]);
			}
		}
		dte_plan_fini(&plan);
		dte_layout_fini(&sink);
	}
	dte_layout_fini(&src);
	assert_int_equal(x->n_entries, nw);
	for (size_t k = 0; k < nw; k++)
		blob_of(x->entries[k], &got[k]);
	qsort(want, nw, sizeof(*want), blob_cmp);
	qsort(got, nw, sizeof(*got), blob_cmp);
	for (size_t k = 0; k < nw; k++) {
		assert_int_equal(want[k].len, got[k].len);
		assert_memory_equal(want[k].b, got[k].b, want[k].len);
	}
	free(want);
	free(got);
}

static void test_replan_matches_scratch(void **state)
{
	struct coord *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	const unsigned gone = (unsigned)node_idx("snk10");
	unsigned before[NMEM];
	int present[NMEM];

	assert_non_null(a);
	assert_non_null(b);
	coord_new(a);
	for (unsigned i = 0; i < NMEM; i++)
		join(a, i);
	assert_true(job_find(a->e, JOB)->coord_complete);
	for (unsigned i = 0; i < NMEM; i++)
		present[i] = 1;
	for (unsigned i = 0; i < NMEM; i++)
		whole_walk(a, present, i);
	/* A sink member hears of the sources it takes from, not of every
	 * other sink. */
	assert_true(a->last[node_idx("snk00")]->n_participants < 4 + 7);
	assert_int_equal(a->last[node_idx("snk00")]->n_addresses,
			 a->last[node_idx("snk00")]->n_participants);

	/* A leave: every member left moves to the new term, with the entries
	 * a coordinator that never saw the leaver gives it. */
	memcpy(before, a->plans, sizeof(before));
	leave(a, gone);
	coord_new(b);
	for (unsigned i = 0; i < NMEM; i++)
		if (i != gone)
			join(b, i);
	for (unsigned i = 0; i < NMEM; i++) {
		if (i == gone)
			continue;
		assert_int_equal(a->plans[i], before[i] + 1);
		assert_int_equal(a->last[i]->epoch, job_find(a->e, JOB)->coord_epoch);
		same_part(a, b, i);
		present[gone] = 0;
		whole_walk(a, present, i);
		present[gone] = 1;
	}

	/* It comes back: the same as a from-scratch plan with it. */
	join(a, gone);
	join(b, gone);
	for (unsigned i = 0; i < NMEM; i++) {
		same_part(a, b, i);
		whole_walk(a, present, i);
	}
	coord_free(b);
	coord_free(a);
	free(a);
	free(b);
}

/* A whole sink layout leaves (its cached plan goes) and comes back; a
 * source rank leaves (the job is incomplete) and comes back, then
 * attaches again under a new id: every part that names it changes. */
static void test_replan_layout_gone_and_back(void **state)
{
	struct coord *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	const unsigned one = (unsigned)node_idx("one0");

	assert_non_null(a);
	assert_non_null(b);
	coord_new(a);
	for (unsigned i = 0; i < NMEM; i++)
		join(a, i);
	leave(a, one);
	join(a, one);
	coord_new(b);
	for (unsigned i = 0; i < NMEM; i++)
		if (i != one)
			join(b, i);
	join(b, one);
	for (unsigned i = 0; i < NMEM; i++)
		same_part(a, b, i);
	coord_free(b);

	leave(a, 1);
	assert_false(job_find(a->e, JOB)->coord_complete);
	join(a, 1);
	/* Restarted in place: its next JOIN names a new participant. */
	a->mem[1].inc = 7;
	join(a, 1);
	coord_new(b);
	b->mem[1].inc = 7;
	for (unsigned i = 0; i < NMEM; i++)
		if (i != one && i != 1)
			join(b, i);
	join(b, one);
	join(b, 1);
	for (unsigned i = 0; i < NMEM; i++)
		same_part(a, b, i);
	coord_free(b);
	coord_free(a);
	free(a);
	free(b);
}

/* Source rank `rank` of mcore:tp=2,dp=2: its shards of every parameter
 * of megatron:tp=2 (each tensor cut into two uneven flat ranges, owned by
 * the two DP ranks in turn), as its JOIN carries them. */
static char *mcore_shards(const struct dte_spec *spec, uint32_t rank)
{
	struct dte_layout l;
	char err[256], *out = calloc(1, 1 << 16);
	size_t at = 0;

	assert_non_null(out);
	if (dte_layout_from_desc(&l, spec, "megatron:tp=2,dopt=0", DTE_LAYOUT_SOURCE, err, sizeof(err)))
		fail_msg("%s", err);
	for (size_t i = 0; i < l.ntensors; i++) {
		const struct dte_layout_tensor *x = &l.tensors[i];
		int64_t numel = x->shape[0] * (x->ndim > 1 ? x->shape[1] : 1);
		int64_t cut = numel / 2 + (numel > 8 ? 3 : 0);

		for (int64_t d = 0; d < 2; d++) {
			int64_t lo = d ? cut : 0, hi = d ? numel : cut;

			if (d * 2 + x->rank != rank || hi <= lo)
				continue;
			at += (size_t)snprintf(out + at, (1 << 16) - at, "%u %zu %lld %lld %s %lld",
					       rank, i, (long long)lo, (long long)hi, x->name,
					       (long long)x->shape[0]);
			if (x->ndim > 1)
				at += (size_t)snprintf(out + at, (1 << 16) - at, ",%lld",
						       (long long)x->shape[1]);
			at += (size_t)snprintf(out + at, (1 << 16) - at, "\n");
			assert_true(at < (1 << 16) - 256);
		}
	}
	dte_layout_fini(&l);
	return out;
}

static void sharded(struct coord *c)
{
	const struct dte_spec *spec = &job_find(c->e, JOB)->spec;

	for (unsigned i = 0; i < 4; i++) {
		c->mem[i].layout = "mcore:tp=2,dp=2";
		c->shards[i] = mcore_shards(spec, i);
	}
}

/* Sources that register shards: nothing is planned until every rank's
 * table came; then the same as from scratch, after a sink leaves and
 * after a source rank joins again (its table kept anew: the cached
 * source layout and every plan on it are rebuilt). */
static void test_replan_sharded_source(void **state)
{
	struct coord *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	const unsigned gone = (unsigned)node_idx("snk10");

	assert_non_null(a);
	assert_non_null(b);
	coord_new(a);
	sharded(a);
	for (unsigned i = 4; i < NMEM; i++)
		join(a, i);
	for (unsigned i = 0; i < 3; i++)
		join(a, i);
	assert_false(job_find(a->e, JOB)->coord_complete);
	assert_int_equal(a->last[node_idx("snk00")]->n_entries, 0);
	join(a, 3);
	assert_true(job_find(a->e, JOB)->coord_complete);
	leave(a, gone);
	coord_new(b);
	sharded(b);
	for (unsigned i = 4; i < NMEM; i++)
		if (i != gone)
			join(b, i);
	for (unsigned i = 0; i < 4; i++)
		join(b, i);
	for (unsigned i = 0; i < NMEM; i++)
		if (i != gone)
			same_part(a, b, i);
	join(a, 2);	/* its JOIN again: shards kept anew */
	for (unsigned i = 0; i < NMEM; i++)
		if (i != gone)
			same_part(a, b, i);
	coord_free(b);
	coord_free(a);
	free(a);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replan_matches_scratch),
		cmocka_unit_test(test_replan_layout_gone_and_back),
		cmocka_unit_test(test_replan_sharded_source),
	};
	int rc;

	dlog_init(DLOG_WARN);
	config = slurp("tests/data/layout/tiny-llama-gqa.json");
	peer_auth_key(key, JOB, TOKEN);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	free(config);
	return rc;
}
