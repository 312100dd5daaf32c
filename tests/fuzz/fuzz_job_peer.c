/* tests/fuzz/fuzz_job_peer.c — a job's peer ingestion against live state:
 * job_peer_recv() with COUNTS, PAYLOAD, PLAN, JOIN, LEAVE, STAGED, APPLIED,
 * REFUSED and PLAN_ACK records, as another daemon's records reach it, while the job
 * holds real buffers and a version in flight.
 *
 * Each input starts from the same state, built with the engine's own entry
 * points as the daemon's command handlers call them (the way
 * tests/unit/test_job.c drives it): a job coordinated here, a Megatron
 * TP=1 source (FP32 θ, m, v memfds stepping AdamW) and an SGLang TP=1 sink
 * (BF16 memfds, each registered between canary bytes of its memfd) on a
 * small llama; version 1 staged and applied densely, version 2 published
 * with its COUNTS and PAYLOAD parts held back, not delivered.  The input is
 * then a list of operations (first byte of each, mod 8):
 *   0 raw       [type u8][from u8][hlen u16][hdr][dlen u16][data]:
 *               job_peer_recv() as the transport would call it
 *   1 held      [i u8]: deliver held record i (again, in any order)
 *   2 edit      [i u8][n u8] n x [field u8][value]: held record i decoded,
 *               fields overwritten (version, epoch, src, dst, counts,
 *               parts, entries, ...), data truncated or bit-flipped, sent
 *   3 forge     [version sel][mode][order][nparts] then per entry
 *               [count u8][how u8][...]: a whole version from the input,
 *               entries encoded with the product's codec or raw bytes,
 *               framed in valid chunks, with a COUNTS that agrees (or not):
 *               gets the fuzzer past the checksums into staging
 *   4 apply     [sel u8]: the sink's apply(v) for some v
 *   5 publish   [hold u8]: the trainer steps and publishes the next version
 *   6 spin      run the loop (deliver what is queued locally)
 *   7 park      [how u8]: the sink waits in wait_staged (5 ms or 60 s), so
 *               sparse parts are swapped into its buffers as they arrive
 *               (before COUNTS when they carry their counts)
 * Properties, beyond the sanitizers': nothing is ever written outside a
 * sink buffer (canaries), into padding no entry maps, or into a source
 * buffer; a forged version with a position outside its box never stages;
 * no record changes which participants this node has in the job or
 * unpairs them;
 * the job keeps serving:
 * unless the records changed the membership or plan (epoch), within three
 * more versions the sink stages and applies one that verifies, and then
 * every mapped element equals RNE of the trainer's θ; and it all
 * tears down to no buffers and a loop that closes.
 */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>
#include "daemon/buf.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/job_task.h"
#include "daemon/log.h"
#include "daemon/route.h"
#include "proto/peer_auth.h"
#include "gpu/backend.h"
#include "gpu/codec.h"
#include "gpu/compute.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/unit/io_filter.h"

/* The engine under test: the test's own instance (job.h). */
static struct dte_engine *eng;

#define SRC_CONN 1
#define SINK_CONN 2
#define MAXB 32
#define MAXREC 256
#define CANARY 256          /* bytes before and after each sink buffer */
#define PAGE 4096

static const char config[] =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
	" \"hidden_size\": 16, \"intermediate_size\": 32, \"num_hidden_layers\": 1,"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 4,"
	" \"vocab_size\": 50, \"tie_word_embeddings\": false, \"attention_bias\": false,"
	" \"torch_dtype\": \"bfloat16\"}";
static const char *const nodes[] = { "evil", "fz", "peer2" };

struct side {
	size_t n;
	uint64_t ids[MAXB];
	uint32_t layout_ids[MAXB];
	uint8_t *map[MAXB];      /* whole memfd */
	size_t mapbytes[MAXB];
	size_t off[MAXB];        /* where the buffer starts in it */
	size_t bytes[MAXB];
	uint64_t participant;
};

struct rec {
	Dtep__PeerMsgType type;
	uint8_t *msg, *data;
	size_t mlen, len;
};

static uv_loop_t loop;
static struct dte_spec spec;
static struct side src, sink;
static struct rec held[MAXREC];
static size_t nheld;
static int holding, answers;
static struct rec sent[MAXREC];   /* every record, when writing seeds */
static size_t nsent;
static int recording;
static uint64_t next_version, src_sum;
static int64_t step;

/* Run the loop until the records queued are delivered and every worker
 * task they started (staging, apply: daemon/job_task.c) came back, so that
 * each input leaves the job settled before the properties are checked. */
static void spin(void)
{
	uint64_t t0 = uv_hrtime();

	for (;;) {
		for (int i = 0; i < 8; i++)
			uv_run(&loop, UV_RUN_NOWAIT);
		if (!jtask_busy(eng) && !route_pending())
			return;
		if (!route_pending())
			uv_run(&loop, UV_RUN_ONCE);	/* a worker's completion wakes it */
		FUZZ_CHECK(uv_hrtime() - t0 < 20000000000ull, "worker tasks never came back");
	}
}

static Dte__Status last_code;
static int last_checksum_ok;

#define PARK_ID 44
static int parked;	/* a wait_staged of the sink not answered yet */

static void catch_done(const struct jreq *rq, int rc, const char *err, const struct jres *res)
{
	if (rq->id == PARK_ID) {	/* the park's answer, whatever it is */
		parked = 0;
		return;
	}
	answers++;
	last_code = derr_status(rc);
	if (rc == 0 && res && res->op == JOP_APPLY)
		last_checksum_ok = res->apply.checksum_ok;
}

/* A request of connection c with id i, answered in catch_done. */
#define RQ(c, i) (&(struct jreq){ .conn = (c), .id = (i), .done = catch_done })

static void rec_keep(struct rec *r, Dtep__PeerMsgType type, const ProtobufCMessage *m,
		     const void *data, size_t len)
{
	r->type = type;
	r->mlen = protobuf_c_message_get_packed_size(m);
	r->msg = malloc(r->mlen ? r->mlen : 1);
	r->data = malloc(len ? len : 1);
	if (!r->msg || !r->data)
		abort();
	protobuf_c_message_pack(m, r->msg);
	r->len = len;
	if (len)
		memcpy(r->data, data, len);
}

static int hold_hook(const char *node, Dtep__PeerMsgType type, const ProtobufCMessage *m,
		     const void *data, size_t len)
{
	if (recording && nsent < MAXREC)
		rec_keep(&sent[nsent++], type, m, data, len);
	if (!holding || nheld == MAXREC)
		return 0;
	rec_keep(&held[nheld++], type, m, data, len);
	return 1;
}

static uint64_t sum_src(void)
{
	uint64_t h = 0;

	for (size_t b = 0; b < src.n; b++)
		for (size_t i = 0; i < src.bytes[b]; i += 8) {
			uint64_t w;

			memcpy(&w, src.map[b] + i, 8);
			h = dtc_mix64(h ^ w ^ (i << 8) ^ b);
		}
	return h;
}

static void side_register(struct side *sd, uint64_t conn, const char *desc, int role)
{
	struct dte_layout l;
	char err[256];

	if (dte_layout_from_desc(&l, &spec, desc, role, err, sizeof(err)))
		FUZZ_CHECK(0, "layout %s: %s", desc, err);
	sd->n = 0;
	for (size_t i = 0; i < l.nbufs && sd->n < MAXB; i++) {
		int source = role == DTE_LAYOUT_SOURCE;
		size_t es = source ? 4 : 2, bytes = (size_t)l.bufs[i].length * es;
		size_t off = source ? 0 : CANARY, total = (off + bytes + CANARY + PAGE - 1) / PAGE * PAGE;
		int fd;

		if (l.bufs[i].rank != 0)
			continue;
		fd = memfd_create("fz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		FUZZ_CHECK(fd >= 0 && ftruncate(fd, (off_t)total) == 0 &&
			   fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0, "memfd");
		sd->map[sd->n] = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		FUZZ_CHECK(sd->map[sd->n] != MAP_FAILED, "mmap");
		if (!source)
			memset(sd->map[sd->n], 0xa5, total);
		memset(sd->map[sd->n] + off, 0, bytes);
		sd->mapbytes[sd->n] = total;
		sd->off[sd->n] = off;
		sd->bytes[sd->n] = bytes;
		sd->layout_ids[sd->n] = l.bufs[i].id;
		FUZZ_CHECK(dbuf_register_fd(conn, fd, off, (uint64_t)l.bufs[i].length,
					    source ? DBUF_FP32 : DBUF_BF16, l.bufs[i].name,
					    &sd->ids[sd->n], err, sizeof(err)) == 0, "register: %s", err);
		sd->n++;
	}
	dte_layout_fini(&l);
}

static void attach(struct side *sd, uint64_t conn, const char *role, const char *desc)
{
	struct jattach_args rq = { 0 };
	struct job *j = job_find(eng, "fj");
	char err[512];
	int deferred = 0;

	rq.job = "fj";
	rq.token = "tok";
	rq.role = role;
	rq.layout = desc;
	rq.n_buffers = sd->n;
	rq.buffers = sd->ids;
	FUZZ_CHECK(job_attach(eng, RQ(conn, 7), &rq, &deferred, err, sizeof(err)) == 0,
		   "attach: %s", err);
	spin();
	sd->participant = 0;
	for (struct jlocal *l = j->locals; l; l = l->next)
		if (l->owner == conn)
			sd->participant = l->info.id;
	FUZZ_CHECK(sd->participant != 0, "attach: no participant");
}

static float frand(uint32_t *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 65536.0f;
}

/* A torch-order AdamW step (lr 1e-3, betas 0.9/0.95, no decay). */
static void train(void)
{
	float *p = (float *)src.map[0], *m = (float *)src.map[1], *v = (float *)src.map[2];
	size_t n = src.bytes[0] / 4;
	double bc1, bc2;
	uint32_t seed = (uint32_t)step * 7919u + 1;

	step++;
	bc1 = 1 - pow(0.9, (double)step);
	bc2 = 1 - pow(0.95, (double)step);
	for (size_t i = 0; i < n; i++) {
		float g = (frand(&seed) - 0.5f) * 0.02f;

		if (step == 1)
			p[i] = (frand(&seed) - 0.5f) * 0.2f;
		m[i] = m[i] + 0.1f * (g - m[i]);
		v[i] = v[i] * 0.95f + 0.05f * g * g;
		p[i] = p[i] + ((float)(-(1e-3 / bc1)) * m[i]) / (sqrtf(v[i]) / (float)sqrt(bc2) + 1e-8f);
	}
	src_sum = sum_src();
}

static int publish(uint64_t version)
{
	struct jpublish_args rq = { 0 };
	struct jpublish_res rep = { 0 };
	struct jhparams g[2];
	char err[512];
	int st;
	int deferred = 0, before = answers;

	for (int i = 0; i < 2; i++) {
		g[i] = (struct jhparams){ 0 };
		g[i].lr = 1e-3;
		g[i].beta1 = 0.9;
		g[i].beta2 = 0.95;
		g[i].eps = 1e-8;
	}
	rq.job = "fj";
	rq.participant = src.participant;
	rq.version = version;
	rq.step = step;
	rq.n_groups = 2;
	rq.groups = g;
	st = job_publish(eng, RQ(SRC_CONN, 41), &rq, &rep, &deferred, err, sizeof(err));
	if (st == 0 && deferred) {
		uint64_t t0 = uv_hrtime();

		while (answers == before) {
			uv_run(&loop, UV_RUN_NOWAIT);
			FUZZ_CHECK(uv_hrtime() - t0 < 20000000000ull, "publish never answered");
		}
	}
	spin();
	if (st == 0 && version >= next_version)
		next_version = version + 1;
	return st;
}

static uint64_t staged(void)
{
	struct jquery_res rep = { 0 };
	char err[256];

	if (job_query_version(eng, SINK_CONN, "fj", sink.participant, &rep, err, sizeof(err)))
		return 0;
	return rep.staged;
}

static int apply(uint64_t version, int *checksum_ok)
{
	struct japply_args rq = { 0 };
	struct japply_res rep = { 0 };
	char err[256];
	int st, deferred = 0, before = answers;

	rq.job = "fj";
	rq.participant = sink.participant;
	rq.version = version;
	/* The apply runs on a worker (daemon/job_task.c); its answer comes
	 * through its completion. */
	st = job_apply(eng, RQ(SINK_CONN, 43), &rq, &rep, &deferred, err, sizeof(err));
	if (st == 0 && deferred) {
		uint64_t t0 = uv_hrtime();

		while (answers == before) {
			uv_run(&loop, UV_RUN_NOWAIT);
			FUZZ_CHECK(uv_hrtime() - t0 < 20000000000ull, "apply never answered");
		}
		st = last_code;
		rep.checksum_ok = last_checksum_ok;
	}
	if (checksum_ok)
		*checksum_ok = rep.checksum_ok;
	spin();
	return st;
}

static void park(uint8_t how)
{
	struct jwait_args rq = { 0 };
	struct jstaged_res rep = { 0 };
	char err[256];
	int deferred = 0;

	if (parked)
		return;
	rq.job = "fj";
	rq.participant = sink.participant;
	rq.timeout_ms = how & 1 ? 5 : 60000;
	if (job_wait_staged(eng, RQ(SINK_CONN, PARK_ID), &rq, &rep, &deferred, err,
			    sizeof(err)) == 0 &&
	    deferred)
		parked = 1;
}

static void check_canaries(void)
{
	for (size_t b = 0; b < sink.n; b++) {
		const uint8_t *m = sink.map[b];

		for (size_t i = 0; i < sink.off[b]; i++)
			FUZZ_CHECK(m[i] == 0xa5, "sink buffer %zu: byte %zu before it written", b,
				   sink.off[b] - i);
		for (size_t i = sink.off[b] + sink.bytes[b]; i < sink.mapbytes[b]; i++)
			FUZZ_CHECK(m[i] == 0xa5, "sink buffer %zu: byte %zu past its end written", b,
				   i - sink.off[b] - sink.bytes[b]);
	}
	FUZZ_CHECK(sum_src() == src_sum, "a source buffer was written");
}

/* Every mapped sink element equals RNE(θ), through the job's own plan
 * (the mapping's truth is tests/unit/test_job.c's business), and every
 * element no entry maps (padding rows) is still zero: nothing was ever
 * written outside the boxes. */
static int sink_exact(struct job *j)
{
	const struct jpair *p = job_pair(j, src.participant, sink.participant);
	uint8_t *mapped[MAXB] = { 0 };
	int ok = 1;

	if (!p)
		return 0;
	for (size_t b = 0; b < sink.n; b++)
		if (!(mapped[b] = calloc(sink.bytes[b] / 2, 1)))
			abort();
	for (size_t i = 0; i < p->n && ok; i++) {
		const struct jentry *e = &p->e[i];
		const float *th = NULL;
		const uint16_t *d = NULL;
		uint8_t *mk = NULL;
		int64_t idx[DTE_MAX_DIMS] = { 0 };

		for (size_t b = 0; b < src.n; b++)
			if (src.layout_ids[b] == e->src_buf)
				th = (const float *)(src.map[b] + src.off[b]);
		for (size_t b = 0; b < sink.n; b++)
			if (sink.layout_ids[b] == e->dst_buf) {
				d = (const uint16_t *)(sink.map[b] + sink.off[b]);
				mk = mapped[b];
			}
		FUZZ_CHECK(th && d, "plan entry names an unknown buffer");
		for (uint64_t q = 0; q < e->box && ok; q++) {
			int64_t si = e->map.src_offset, di = e->map.dst_offset;

			for (uint32_t k = 0; k < e->map.ndim; k++) {
				si += idx[k] * e->map.src_stride[k];
				di += idx[k] * e->map.dst_stride[k];
			}
			ok = d[di] == dtc_bf16_rne(th[si]);
			mk[di] = 1;
			for (int k = (int)e->map.ndim - 1; k >= 0 && ++idx[k] == e->map.extent[k]; k--)
				idx[k] = 0;
		}
	}
	for (size_t b = 0; b < sink.n; b++) {
		const uint16_t *d = (const uint16_t *)(sink.map[b] + sink.off[b]);

		for (size_t i = 0; ok && i < sink.bytes[b] / 2; i++)
			FUZZ_CHECK(mapped[b][i] || d[i] == 0,
				   "sink buffer %zu element %zu is in no box but was written (%04x)", b,
				   i, d[i]);
		free(mapped[b]);
	}
	return ok;
}

/* The coordinator (this daemon) still counts both local participants
 * among its own node's: no record from another node can drop or replace
 * them (they leave only with their connections). */
static void check_members(struct job *j)
{
	const struct jmember *me = NULL;
	int found = 0;

	for (const struct jmember *m = j->members; m; m = m->next)
		if (!strcmp(m->node, route_self_node()))
			me = m;
	FUZZ_CHECK(me, "this node is no longer a member of its own job");
	for (size_t i = 0; i < me->n; i++)
		found += me->p[i].id == src.participant || me->p[i].id == sink.participant;
	FUZZ_CHECK(found == 2 && me->n == 2, "this node's participants were changed by a peer "
		   "(%d of 2 left, %zu listed)", found, me->n);
	/* and the plan this coordinator made still pairs them */
	FUZZ_CHECK(job_pair(j, src.participant, sink.participant),
		   "the local source and sink are no longer paired (plan epoch %llu)",
		   (unsigned long long)j->epoch);
}

/* A decoded record goes as a peer holding the token sends it: sealed
 * with the job key (peer protocol 5), so the fuzzer reaches past the MAC
 * check; raw records (feed_raw) carry whatever MAC the input holds and
 * exercise the refusal. */
static void feed(const char *from, Dtep__PeerMsgType type, const ProtobufCMessage *m,
		 const void *data, size_t len)
{
	Dtep__JobRef *ref = peer_auth_ref(m);
	ProtobufCBinaryData keep_mac = { 0, NULL };
	char *keep_token = NULL;
	uint8_t mac[PEER_AUTH_MACBYTES];
	struct job *j = ref && ref->job ? job_find(eng, ref->job) : NULL;
	int sealed = 0;
	size_t n;
	uint8_t *buf;

	if (j && j->auth && strcmp(from, route_self_node())) {
		keep_mac = ref->mac;
		keep_token = ref->token;
		sealed = peer_auth_seal(j->auth_key, type, (ProtobufCMessage *)m, data, len, mac) == 0;
	}
	n = protobuf_c_message_get_packed_size(m);
	buf = malloc(n ? n : 1);
	if (!buf)
		abort();
	protobuf_c_message_pack(m, buf);
	if (sealed) {
		/* A held record is protobuf-c's: its own pointers go back. */
		ref->mac = keep_mac;
		ref->token = keep_token;
	}
	job_peer_recv(eng, from, type, buf, n, data, len);
	free(buf);
}

/* Exact-size heap copies, so ASan sees any read past either end. */
static void feed_raw(const char *from, Dtep__PeerMsgType type, const uint8_t *h, size_t hl,
		     const uint8_t *d, size_t dl)
{
	uint8_t *hc = malloc(hl ? hl : 1), *dc = malloc(dl ? dl : 1);

	if (!hc || !dc)
		abort();
	memcpy(hc, h, hl);
	memcpy(dc, d, dl);
	job_peer_recv(eng, from, type, hc, hl, dl ? dc : NULL, dl);
	free(hc);
	free(dc);
}

/* A value for a field: small, near the live versions, or any u64. */
static uint64_t fuzz_value(struct fuzz_in *in)
{
	uint8_t how = fuzz_u8(in);

	switch (how % 4) {
	case 0:
		return fuzz_u8(in);
	case 1:
		return next_version - 3 + fuzz_u8(in) % 8;
	case 2:
		return how & 0x80 ? sink.participant : src.participant;
	default:
		return fuzz_uint(in, 8);
	}
}

static void op_edit(struct fuzz_in *in)
{
	const struct rec *r;
	unsigned n;

	if (!nheld)
		return;
	r = &held[fuzz_u8(in) % nheld];
	n = fuzz_u8(in) % 5;
	if (r->type == DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS) {
		Dtep__Counts *c = dtep__counts__unpack(NULL, r->mlen, r->msg);

		FUZZ_CHECK(c, "held COUNTS does not decode");
		for (unsigned k = 0; k < n; k++) {
			uint8_t f = fuzz_u8(in);
			uint64_t v = fuzz_value(in);

			switch (f % 10) {
			case 0: c->epoch = v; break;
			case 1: c->version = v; break;
			case 2: c->base_version = v; break;
			case 3: c->mode = (Dtep__Mode)(v & 3); break;
			case 4: c->src = v; break;
			case 5: c->dst = v; break;
			case 6: if (c->n_counts) c->counts[(f >> 4) % c->n_counts] = v; break;
			case 7: c->n_counts = c->n_counts ? (size_t)(v % (c->n_counts + 1)) : 0; break;
			case 8: c->payload_bytes = v; break;
			case 9: if (c->n_checksums) c->checksums[(f >> 4) % c->n_checksums]->partial = v; else c->parts = (uint32_t)v; break;
			}
		}
		feed(nodes[fuzz_u8(in) % 3], r->type, &c->base, NULL, 0);
		dtep__counts__free_unpacked(c, NULL);
	} else if (r->type == DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD) {
		Dtep__Payload *p = dtep__payload__unpack(NULL, r->mlen, r->msg);
		uint8_t *d = malloc(r->len ? r->len : 1);
		size_t len = r->len;

		FUZZ_CHECK(p && d, "held PAYLOAD does not decode");
		memcpy(d, r->data, r->len);
		for (unsigned k = 0; k < n; k++) {
			uint8_t f = fuzz_u8(in);
			uint64_t v = fuzz_value(in);

			switch (f % 11) {
			case 9: p->base_version = v; break;
			case 10: if (p->n_counts) p->counts[(f >> 4) % p->n_counts] = v; break;
			case 0: p->epoch = v; break;
			case 1: p->version = v; break;
			case 2: p->src = v; break;
			case 3: p->dst = v; break;
			case 4: p->part = (uint32_t)v; break;
			case 5: p->first_entry = (uint32_t)v; break;
			case 6: p->entries = (uint32_t)v; break;
			case 7: if (len) len = (size_t)(v % len); break;
			case 8: if (len) d[v % len] ^= (uint8_t)(1u << (f >> 5)); break;
			}
		}
		feed(nodes[fuzz_u8(in) % 3], r->type, &p->base, d, len);
		dtep__payload__free_unpacked(p, NULL);
		free(d);
	} else {
		feed_raw(nodes[fuzz_u8(in) % 3], r->type, r->msg, r->mlen, r->data, r->len);
	}
}

/* A whole version from the input, framed the way a source frames one. */
static void op_forge(struct fuzz_in *in, struct job *j)
{
	const struct jpair *pair = job_pair(j, src.participant, sink.participant);
	Dtep__Counts c = DTEP__COUNTS__INIT;
	Dtep__Payload pl = DTEP__PAYLOAD__INIT;
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	Dtep__Checksum ck[MAXB], *ckp[MAXB];
	uint8_t vsel, mode, order, nparts;
	uint64_t *counts, total = 0;
	int outside = 0;
	uint8_t *raw[8] = { 0 }, *chunk[8] = { 0 };
	size_t rawlen[8] = { 0 }, clen[8] = { 0 }, cap[8] = { 0 };
	uint32_t first[9];

	if (!pair || !pair->n)
		return;
	vsel = fuzz_u8(in);
	mode = fuzz_u8(in);
	order = fuzz_u8(in);
	nparts = (uint8_t)(1 + fuzz_u8(in) % 8);
	if (nparts > pair->n)
		nparts = (uint8_t)pair->n;
	counts = calloc(pair->n, sizeof(*counts));
	if (!counts)
		abort();
	/* Part k carries entries [first[k], first[k+1]). */
	for (unsigned k = 0; k <= nparts; k++)
		first[k] = (uint32_t)(pair->n * k / nparts);
	for (size_t i = 0; i < pair->n; i++) {
		const struct jentry *e = &pair->e[i];
		unsigned k = 0;
		uint8_t how = fuzz_u8(in);
		uint64_t cnt = how & 0x80 ? e->box : fuzz_u8(in) % (e->box + 2);
		uint8_t *enc = NULL;
		size_t elen = 0;

		while (k + 1 < nparts && i >= first[k + 1])
			k++;
		if ((mode & 1) && (how & 3) != 3)
			cnt = e->box;
		counts[i] = cnt;
		if (!cnt)
			continue;
		if ((how & 3) == 3) {
			/* raw bytes from the input, any length claimed */
			elen = fuzz_u8(in);
			enc = malloc(elen ? elen : 1);
			if (!enc)
				abort();
			for (size_t b = 0; b < elen; b++)
				enc[b] = fuzz_u8(in);
		} else if (mode & 1) {
			uint16_t *vals = malloc(e->box * 2);
			size_t bound = e->box * 2 + 64;

			enc = malloc(bound);
			if (!vals || !enc)
				abort();
			for (uint64_t q = 0; q < e->box; q++)
				vals[q] = (uint16_t)fuzz_uint(in, 2);
			if (dtc_dense_encode(vals, e->box, enc, bound, &elen) != DTC_OK)
				elen = 0;
			free(vals);
		} else {
			uint64_t *pos = malloc(cnt * 8), p0 = 0;
			uint16_t *vals = malloc(cnt * 2);
			size_t bound = dtc_sparse_bound(cnt);

			enc = malloc(bound ? bound : 1);
			if (!pos || !vals || !enc)
				abort();
			for (uint64_t q = 0; q < cnt; q++) {
				uint8_t g = fuzz_u8(in);

				/* small steps, or long jumps (past the box too) */
				p0 += 1 + (g & 0x80 ? (uint64_t)(g & 0x7f) << 6 : g % 4);
				pos[q] = (how & 4) ? p0 - 1 : (p0 - 1) % (e->box + 1);
				vals[q] = (uint16_t)fuzz_uint(in, 2);
			}
			/* the codec refuses positions out of order or past the
			 * box it is given; a wide one lets them through */
			if (dtc_sparse_encode(pos, vals, cnt, (how & 8) ? UINT64_MAX >> 1 : e->box, enc,
					      bound, &elen) != DTC_OK)
				elen = 0;
			else if (pos[cnt - 1] >= e->box)
				outside = 1;    /* well formed, but past the box */
			free(pos);
			free(vals);
		}
		if (rawlen[k] + 8 + elen > cap[k]) {
			cap[k] = 2 * (rawlen[k] + 8 + elen) + 64;
			raw[k] = realloc(raw[k], cap[k]);
			if (!raw[k])
				abort();
		}
		for (int b = 0; b < 8; b++)
			raw[k][rawlen[k] + (size_t)b] = (uint8_t)((uint64_t)elen >> (8 * b));
		if (elen)
			memcpy(raw[k] + rawlen[k] + 8, enc, elen);
		rawlen[k] += 8 + elen;
		free(enc);
	}
	for (unsigned k = 0; k < nparts; k++) {
		size_t bound = dtc_chunk_bound(rawlen[k]);

		chunk[k] = malloc(bound);
		if (!chunk[k] || dtc_chunk_pack(raw[k] ? raw[k] : (uint8_t *)"", rawlen[k],
						(order >> 4) & 1, chunk[k], bound, &clen[k]) != DTC_OK)
			abort();
		if ((order & 0x20) && clen[k])
			chunk[k][fuzz_u8(in) % clen[k]] ^= 0x10;   /* checksum must catch it */
		total += clen[k];
	}
	ref.job = "fj";
	ref.token = "tok";
	c.job = pl.job = &ref;
	c.epoch = pl.epoch = j->epoch;
	c.version = pl.version = vsel % 4 == 0 ? next_version : vsel % 4 == 1 ? next_version - 1 :
				 vsel % 4 == 2 ? next_version + vsel / 4 : fuzz_uint(in, 8);
	c.base_version = mode & 1 ? 0 : (mode & 2) ? fuzz_value(in) : staged();
	c.mode = mode & 1 ? DTEP__MODE__MODE_DENSE : DTEP__MODE__MODE_SPARSE;
	c.src = pl.src = src.participant;
	c.dst = pl.dst = sink.participant;
	c.n_counts = pair->n;
	c.counts = counts;
	c.payload_bytes = total;
	c.parts = nparts;
	for (size_t b = 0; b < sink.n && b < MAXB; b++) {
		dtep__checksum__init(&ck[b]);
		ck[b].dst_buffer = sink.layout_ids[b];
		ck[b].partial = mode & 4 ? fuzz_uint(in, 8) : 0;
		ckp[b] = &ck[b];
	}
	c.n_checksums = mode & 4 ? sink.n : 0;
	c.checksums = ckp;
	{
		/* A version of that number staged before (the real one) is
		 * not the forged one. */
		const struct jlocal *l = job_local(j, sink.participant);

		for (const struct jstaged *st = l ? jsink_cof(l)->staged : NULL; st; st = st->next)
			if (st->version == c.version)
				outside = 0;
	}
	if (order & 1)
		feed("evil", DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, &c.base, NULL, 0);
	for (unsigned q = 0; q < nparts; q++) {
		unsigned k = (order & 2) ? nparts - 1 - q : q;

		pl.part = k;
		pl.first_entry = first[k];
		pl.entries = first[k + 1] - first[k];
		feed("evil", DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &pl.base, chunk[k], clen[k]);
		if ((order & 8) && q == 0)
			feed("evil", DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &pl.base, chunk[k], clen[k]);
	}
	if (!(order & 1))
		feed("evil", DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, &c.base, NULL, 0);
	spin();
	/* A position outside its entry's box is refused, whatever else the
	 * version gets right (it must never reach the apply walk). */
	if (outside) {
		const struct jlocal *l = job_local(j, sink.participant);

		for (const struct jstaged *st = l ? jsink_cof(l)->staged : NULL; st; st = st->next)
			FUZZ_CHECK(st->version != c.version,
				   "version %llu staged with a position outside its box",
				   (unsigned long long)c.version);
	}
	for (unsigned k = 0; k < 8; k++) {
		free(raw[k]);
		free(chunk[k]);
	}
	free(counts);
}

static void setup(void)
{
	parked = 0;
	struct jcreate_args jc = { 0 };
	struct jcreate_res jr = { 0 };
	char err[512];
	int ok;

	FUZZ_CHECK(uv_loop_init(&loop) == 0, "loop");
	FUZZ_CHECK(route_init(&loop, "fz", "") == 0, "route_init");
	{
		struct dte_engine_io io;

		/* The source's records are held by the test (io_filter.h). */
		FUZZ_CHECK(dte_engine_io_uv(&loop, &io) == 0, "dte_engine_io_uv");
		io_filter_wrap(&io);
		eng = dte_engine_new_io(&io, dtc_backend_cpu(), "cpu");
	}
	FUZZ_CHECK(eng != NULL, "dte_engine_new_io");
	io_filter_set(hold_hook);
	eng->part_bytes = 512;          /* versions go in several parts */
	jc.name = "fj";
	jc.model_config = config;
	jc.token = "tok";
	jc.coordinator = "local";
	FUZZ_CHECK(job_create(eng, &jc, &jr, err, sizeof(err)) == 0, "job_create: %s", err);
	side_register(&src, SRC_CONN, "megatron:tp=1", DTE_LAYOUT_SOURCE);
	side_register(&sink, SINK_CONN, "sglang:tp=1", DTE_LAYOUT_SINK);
	attach(&src, SRC_CONN, "source", "megatron:tp=1");
	attach(&sink, SINK_CONN, "sink", "sglang:tp=1");
	step = 0;
	next_version = 1;
	train();
	FUZZ_CHECK(publish(1) == 0 && staged() == 1, "version 1 not staged");
	FUZZ_CHECK(apply(1, &ok) == 0 && ok, "version 1 not applied");
	train();
	holding = 1;
	FUZZ_CHECK(publish(2) == 0, "version 2 not published");
	holding = 0;
	FUZZ_CHECK(nheld >= 2, "version 2 sent %zu records", nheld);
	if (getenv("FUZZ_JOB_PEER_LOG")) {
		const struct jpair *p = job_pair(job_find(eng, "fj"), src.participant, sink.participant);

		for (size_t i = 0; p && i < p->n; i++)
			fprintf(stderr, "fuzz_job_peer: entry %zu: tensor %u box %llu -> buffer %u\n", i,
				p->e[i].tensor, (unsigned long long)p->e[i].box, p->e[i].dst_buf);
	}
}

static void teardown(void)
{
	job_conn_gone(eng, SINK_CONN);
	job_conn_gone(eng, SRC_CONN);
	spin();
	FUZZ_CHECK(dbuf_count(NULL) == 0, "%zu buffers left registered", (size_t)dbuf_count(NULL));
	dte_engine_free(eng);
	eng = NULL;
	route_fini();
	uv_run(&loop, UV_RUN_DEFAULT);
	FUZZ_CHECK(uv_loop_close(&loop) == 0, "loop does not close");
	for (size_t b = 0; b < src.n; b++)
		munmap(src.map[b], src.mapbytes[b]);
	for (size_t b = 0; b < sink.n; b++)
		munmap(sink.map[b], sink.mapbytes[b]);
	for (size_t i = 0; i < nheld; i++) {
		free(held[i].msg);
		free(held[i].data);
	}
	nheld = 0;
	memset(&src, 0, sizeof(src));
	memset(&sink, 0, sizeof(sink));
}

static void seed_write(const char *dir, const char *name, const uint8_t *b, size_t n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	FUZZ_CHECK(f && fwrite(b, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

/* An op-0 (raw) seed of one record as the daemon sent it. */
static size_t seed_raw(uint8_t *o, const struct rec *r, uint8_t from)
{
	size_t n = 0, hl = r->mlen < 0xffff ? r->mlen : 0xffff, dl = r->len < 0xffff ? r->len : 0xffff;

	o[n++] = 0;
	o[n++] = (uint8_t)r->type;
	o[n++] = from;
	o[n++] = (uint8_t)hl, o[n++] = (uint8_t)(hl >> 8);
	memcpy(o + n, r->msg, hl), n += hl;
	o[n++] = (uint8_t)dl, o[n++] = (uint8_t)(dl >> 8);
	memcpy(o + n, r->data, dl), n += dl;
	return n;
}

/* FUZZ_JOB_PEER_SEEDS=DIR: write the seed corpus from the records a real
 * setup sends (JOIN, PLAN, COUNTS, PAYLOAD parts, STAGED, APPLIED) and a
 * few operation lists over them, then exit. */
static void write_seeds(const char *dir)
{
	static uint8_t b[1 << 20];
	size_t n = 0;
	char name[64];
	static const uint8_t forge[][12] = {
		{ 3, 0, 0, 0, 0, 2, 0, 3, 0, 1, 0, 5 },        /* sparse, a few positions */
		{ 3, 0, 1, 1, 3, 0x80, 0x80, 0x80, 0x80 },     /* dense, COUNTS first, 4 parts */
		{ 3, 0, 4, 2, 2, 0, 4, 0, 0, 0, 0, 4 },        /* sparse, parts backwards, checksums */
		{ 3, 1, 0, 8, 1, 3, 9, 1, 2, 3, 4, 5 },        /* duplicate part, raw bytes */
		{ 3, 2, 2, 0x20, 1, 4, 6, 0, 0, 0, 7, 7 },     /* corrupt chunk, base from input */
	};

	recording = 1;
	setup();
	recording = 0;
	for (size_t i = 0; i < nsent; i++) {
		if (sent[i].type == DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED) {
			/* apply_ms is a timing: zero it, so seeds are reproducible */
			Dtep__Applied *a = dtep__applied__unpack(NULL, sent[i].mlen, sent[i].msg);

			FUZZ_CHECK(a, "APPLIED does not decode");
			a->apply_ms = 0;
			sent[i].mlen = protobuf_c_message_pack(&a->base, sent[i].msg);
			dtep__applied__free_unpacked(a, NULL);
		}
		n = seed_raw(b, &sent[i], 1);
		snprintf(name, sizeof(name), "rec-%02zu-type%d", i, (int)sent[i].type);
		seed_write(dir, name, b, n);
	}
	n = 0;
	for (size_t i = 0; i < nheld; i++)
		b[n++] = 1, b[n++] = (uint8_t)i;
	b[n++] = 4, b[n++] = 0;
	seed_write(dir, "held-in-order-apply", b, n);
	n = 0;
	for (size_t i = nheld; i-- > 0;)
		b[n++] = 1, b[n++] = (uint8_t)i;
	b[n++] = 1, b[n++] = 0;
	seed_write(dir, "held-reversed-dup", b, n);
	n = 0;
	for (size_t i = 0; i < nheld; i++)
		b[n++] = 2, b[n++] = (uint8_t)i, b[n++] = 1, b[n++] = (uint8_t)(i * 37), b[n++] = 1,
		b[n++] = 1;
	seed_write(dir, "edit-each", b, n);
	for (size_t k = 0; k < sizeof(forge) / sizeof(forge[0]); k++) {
		snprintf(name, sizeof(name), "forge-%zu", k);
		seed_write(dir, name, forge[k], sizeof(forge[k]));
	}
	b[0] = 5, b[1] = 0, b[2] = 4, b[3] = 0, b[4] = 5, b[5] = 1, b[6] = 4, b[7] = 0;
	seed_write(dir, "publish-apply", b, 8);
	{
		/* Every entry 16 positions two apart, encoded past the box: the
		 * 16-element boxes (norms) get positions up to 30; then apply. */
		const struct jpair *p = job_pair(job_find(eng, "fj"), src.participant, sink.participant);

		n = 0;
		b[n++] = 3, b[n++] = 0, b[n++] = 0, b[n++] = 0, b[n++] = 0;
		for (size_t i = 0; p && i < p->n; i++) {
			b[n++] = 0x0c, b[n++] = 16;
			for (int q = 0; q < 16; q++)
				b[n++] = 1, b[n++] = 0x80, b[n++] = 0x3f;
		}
		b[n++] = 4, b[n++] = 0;
		seed_write(dir, "forge-past-box", b, n);
	}
	{
		/* Membership records no local setup sends: a JOIN from another
		 * node with a sink, a LEAVE naming this node's participants, a
		 * PLAN from a node that is not the coordinator. */
		Dtep__JobRef ref = DTEP__JOB_REF__INIT;
		Dtep__Participant pa = DTEP__PARTICIPANT__INIT, *pp[1] = { &pa };
		Dtep__Join jn = DTEP__JOIN__INIT;
		Dtep__Leave lv = DTEP__LEAVE__INIT;
		Dtep__Plan pl = DTEP__PLAN__INIT;
		Dtep__PlanAck pa2 = DTEP__PLAN_ACK__INIT;
		Dtep__Rates ra = DTEP__RATES__INIT;
		Dtep__LinkRate lr[3] = { DTEP__LINK_RATE__INIT, DTEP__LINK_RATE__INIT,
					 DTEP__LINK_RATE__INIT }, *lrp[3] = { &lr[0], &lr[1], &lr[2] };
		uint64_t ids[2] = { src.participant, sink.participant };
		struct rec r = { 0 };
		struct job *j = job_find(eng, "fj");

		ref.job = "fj";
		ref.token = "tok";
		pa.id = 0x1234500000001ull;
		pa.role = DTEP__ROLE__ROLE_SINK;
		pa.layout = "sglang:tp=1";
		pa.node = "peer2";
		jn.job = &ref;
		jn.spec_hash = spec.hash;
		jn.node = "peer2";
		jn.address = "127.0.0.1:1";
		jn.n_participants = 1;
		jn.participants = pp;
		jn.peer_proto = PEER_PROTO_VERSION;
		jn.join_boot = 77;
		jn.join_seq = 1;
		pa2.job = &ref;
		pa2.epoch = j->epoch;
		pa2.node = "peer2";
		lv.job = &ref;
		lv.node = "fz";
		lv.n_participants = 2;
		lv.participants = ids;
		pl.job = &ref;
		pl.epoch = j->epoch + 1;
		pl.complete = 1;
		pl.n_participants = 1;
		pl.participants = pp;
		pl.peer_proto = PEER_PROTO_VERSION;
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, &jn.base, NULL, 0);
		n = seed_raw(b, &r, 2);
		seed_write(dir, "join-peer2", b, n);
		free(r.msg), free(r.data);
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE, &lv.base, NULL, 0);
		n = seed_raw(b, &r, 0);
		seed_write(dir, "leave-naming-fz", b, n);
		free(r.msg), free(r.data);
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN, &pl.base, NULL, 0);
		n = seed_raw(b, &r, 0);
		seed_write(dir, "plan-from-evil", b, n);
		free(r.msg), free(r.data);
		/* Version 4: a JOIN then its duplicate (answered, nothing
		 * re-planned), and a PLAN_ACK from that member. */
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, &jn.base, NULL, 0);
		n = seed_raw(b, &r, 2);
		n += seed_raw(b + n, &r, 2);
		free(r.msg), free(r.data);
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK, &pa2.base, NULL, 0);
		n += seed_raw(b + n, &r, 2);
		seed_write(dir, "join-dup-and-plan-ack", b, n);
		free(r.msg), free(r.data);
		/* Version 10: a member's RATES after its JOIN, one rate NaN,
		 * one toward a node of no member, one negative. */
		ra.job = &ref;
		ra.node = "peer2";
		lr[0].to = "fz";
		lr[0].bytes_per_s = 1e9;
		lr[1].to = "nowhere";
		lr[1].bytes_per_s = NAN;
		lr[2].to = "fz";
		lr[2].bytes_per_s = -5;
		ra.n_links = 3;
		ra.links = lrp;
		ra.pair_bytes = 4096;
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, &jn.base, NULL, 0);
		n = seed_raw(b, &r, 2);
		free(r.msg), free(r.data);
		rec_keep(&r, DTEP__PEER_MSG_TYPE__PEER_MSG_RATES, &ra.base, NULL, 0);
		n += seed_raw(b + n, &r, 2);
		seed_write(dir, "join-and-rates", b, n);
		free(r.msg), free(r.data);
	}
	teardown();
	for (size_t i = 0; i < nsent; i++) {
		free(sent[i].msg);
		free(sent[i].data);
	}
	fprintf(stderr, "fuzz_job_peer: seeds from %zu records written to %s\n", nsent, dir);
	exit(0);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[256];
	const char *seeds = getenv("FUZZ_JOB_PEER_SEEDS");

	/* FUZZ_JOB_PEER_LOG=1: the daemon's log, to follow a reproducer */
	dlog_init(getenv("FUZZ_JOB_PEER_LOG") ? DLOG_INFO : DLOG_ERROR);
	FUZZ_CHECK(dte_spec_load_string(&spec, config, err, sizeof(err)) == 0, "spec: %s", err);
	if (seeds)
		write_seeds(seeds);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	struct job *j;
	uint64_t epoch0;
	int ops = 0;

	setup();
	j = job_find(eng, "fj");
	epoch0 = j->epoch;
	while (in.n && ops++ < 64) {
		switch (fuzz_u8(&in) % 8) {
		case 7:
			/* the sink parks in wait_staged: later sparse versions
			 * are swapped into its buffers as their parts arrive */
			park(fuzz_u8(&in));
			break;
		case 0: {
			Dtep__PeerMsgType type = (Dtep__PeerMsgType)(fuzz_u8(&in) % 12);	/* 10: RELAYED, 11: RATES */
			const char *from = nodes[fuzz_u8(&in) % 3];
			size_t hl = (size_t)fuzz_uint(&in, 2), dl;
			const uint8_t *h;

			hl = hl < in.n ? hl : in.n;
			h = in.p;
			in.p += hl, in.n -= hl;
			dl = (size_t)fuzz_uint(&in, 2);
			dl = dl < in.n ? dl : in.n;
			feed_raw(from, type, h, hl, in.p, dl);
			in.p += dl, in.n -= dl;
			break;
		}
		case 1:
			if (nheld) {
				const struct rec *r = &held[fuzz_u8(&in) % nheld];

				feed_raw(nodes[1], r->type, r->msg, r->mlen, r->data, r->len);
			}
			break;
		case 2:
			op_edit(&in);
			break;
		case 3:
			op_forge(&in, j);
			break;
		case 4: {
			uint8_t sel = fuzz_u8(&in);
			uint64_t v = sel % 4 == 0 ? staged() : sel % 4 == 1 ? 2 : sel % 4 == 2 ?
				     staged() + 1 : fuzz_uint(&in, 8);

			apply(v, NULL);
			break;
		}
		case 5: {
			uint8_t hold = fuzz_u8(&in);

			if (next_version > 40)
				break;
			train();
			holding = hold & 1;
			publish(next_version);
			holding = 0;
			break;
		}
		default:
			spin();
			break;
		}
		spin();
		check_canaries();
		check_members(j);
	}
	/* The job keeps serving: a later version lands exactly. */
	if (j->epoch == epoch0) {
		struct jlocal *l = job_local(j, sink.participant);
		uint64_t top = next_version;
		int landed = 0;

		FUZZ_CHECK(l, "the sink participant is gone");
		if (jsink_of(l)->held >= top)
			top = jsink_of(l)->held + 1;
		for (const struct jpend *p = jsink_of(l)->pend; p; p = p->next)
			if (p->version >= top)	/* a forged 2^64 - 1 does not wrap to 0 */
				top = p->version + 1 ? p->version + 1 : p->version;
		for (int attempt = 0; attempt < 3 && top < ((uint64_t)1 << 62) && !landed; attempt++) {
			int ok = 0;

			train();
			FUZZ_CHECK(publish(top) == 0, "publish %llu refused", (unsigned long long)top);
			if (staged() == top) {
				FUZZ_CHECK(apply(top, &ok) == 0, "apply %llu failed", (unsigned long long)top);
				/* A forged version the sink took (the peer had the
				 * token) shows as a checksum mismatch once a real
				 * sparse one lands on it; the next is dense. */
				if (ok) {
					FUZZ_CHECK(sink_exact(j), "version %llu applied and verified, "
						   "sink not exact", (unsigned long long)top);
					landed = 1;
				}
			}
			top++;
		}
		FUZZ_CHECK(landed || top >= ((uint64_t)1 << 62),
			   "three versions after the records, none staged (sink holds %llu)",
			   (unsigned long long)jsink_of(l)->held);
	}
	check_canaries();
	teardown();
	return 0;
}
