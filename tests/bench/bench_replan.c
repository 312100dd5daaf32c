/* tests/bench/bench_replan.c — the coordinator's re-plan at 1000 nodes
 * (issue 34; docs/BENCHMARKS.md, "Re-plan at 1000 nodes").
 *
 * One coordinator engine (dte_engine_new_io) on a stub struct
 * dte_engine_io: nothing is ever delivered back to it except the JOINs and
 * LEAVEs this program makes, sealed under the job key as a member daemon
 * seals them.  What the coordinator sends is packed and sealed as the
 * transport would (route.c), then counted per node (records, bytes) and
 * dropped.  Members: one participant per node, SOURCES source ranks of
 * the source layout first (n0000..), then the sink ranks of REPLICAS sink
 * replicas.  Timed (CPU clock of this thread, monotonic wall clock too):
 *  setup   every JOIN but the last source's (one re-plan each);
 *  first   the last source's JOIN: the first complete plan;
 *  leave   one sink node's LEAVE of its participant (rank 0 of the last
 *          replica): one re-plan;
 *  join    that node's JOIN again;
 *  replica the other ranks of that replica leave, one LEAVE each.
 * peak_mb is the resident peak of the phase (VmHWM, reset before it).
 *
 * Members acknowledge every PLAN between the phases (--ack 0: never, so
 * every PLAN is whole, as before peer protocol 8).
 *
 * usage: bench_replan [--model PATH] [--source DESC] [--sink DESC]
 *                     [--sources N] [--replicas N] [--tp N] [--ack 0|1]
 * Prints `bench replan ...` lines. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/log.h"
#include "gpu/backend.h"
#include "proto/peer_auth.h"
#include "proto/peer_protocol.h"
#include "tests/bench/peak_rss.h"

#define JOB "bench"
#define TOKEN "bench-token"
#define NODE_MAX 32

struct bnode {
	char name[NODE_MAX];
	char addr[NODE_MAX];
	uint64_t id;
	int role;	/* DTEP__ROLE__ROLE_SOURCE or _SINK */
	uint32_t rank, replica;
	uint64_t seq;
	uint64_t recs, bytes;	/* sent to it in the phase */
	uint64_t ack;		/* the term of the last PLAN it got, not yet acknowledged */
};

static struct {
	struct bnode *n;
	size_t nn;
	uint64_t now;
	dte_io_recv_fn recv;
	dte_io_seal_fn seal;
	void *engine;
	uint8_t *buf;
	size_t cap;
	uint64_t other_recs;	/* to a node not in the table (none expected) */
	int acks;		/* members acknowledge each PLAN (ack_all), as daemons do */
} B;

struct dte_timer {
	int unused;
};

static uint64_t io_now(void *ctx)
{
	return B.now;
}

static struct dte_timer *io_timer_new(void *ctx, void (*cb)(void *arg), void *arg)
{
	return calloc(1, sizeof(struct dte_timer));
}

static void io_timer_start(void *ctx, struct dte_timer *t, uint64_t timeout_ms, uint64_t repeat_ms)
{
}

static void io_timer_stop(void *ctx, struct dte_timer *t)
{
}

static void io_timer_free(void *ctx, struct dte_timer *t)
{
	free(t);
}

static struct bnode *node_named(const char *name)
{
	/* n%05u: the index is in the name. */
	if (name && name[0] == 'n') {
		size_t i = strtoul(name + 1, NULL, 10);

		if (i < B.nn && !strcmp(B.n[i].name, name))
			return &B.n[i];
	}
	return NULL;
}

/* As route.c: sealed when it leaves the node, packed into a record. */
static int io_send(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
		   const ProtobufCMessage *msg, const void *data, size_t len)
{
	struct bnode *to = node_named(node);
	ProtobufCBinaryData *field = NULL, keep = { 0, NULL };
	uint8_t mac[PEER_AUTH_MACBYTES];
	size_t n;
	int rc;

	if (node && !strcmp(node, "coord"))
		return 0;	/* to itself: a JOIN the coordinator makes (none here) */
	if (B.seal) {
		if ((rc = B.seal(B.engine, type, msg, data, len, mac)) < 0)
			return rc;
		if (rc > 0 && (field = peer_auth_mac_field(msg))) {
			keep = *field;
			field->data = mac;
			field->len = sizeof(mac);
		}
	}
	n = protobuf_c_message_get_packed_size(msg);
	if (n > B.cap) {
		free(B.buf);
		B.cap = n * 2;
		if (!(B.buf = malloc(B.cap))) {
			B.cap = 0;
			return -ENOMEM;
		}
	}
	protobuf_c_message_pack(msg, B.buf);
	if (field)
		*field = keep;
	if (!to) {
		B.other_recs++;
		return 0;
	}
	to->recs++;
	to->bytes += n + len;
	if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN)
		to->ack = ((const Dtep__Plan *)msg)->epoch;
	return 0;
}

static int io_send_given(void *ctx, const char *node, const char *address,
			 Dtep__PeerMsgType type, const ProtobufCMessage *msg, void *data,
			 size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	int rc = io_send(ctx, node, address, type, msg, data, len);

	release(data, rarg);
	return rc;
}

static void *io_take_data(void *ctx, const void *data)
{
	return NULL;
}

static const char *io_self_node(void *ctx)
{
	return "coord";
}

static const char *io_self_address(void *ctx)
{
	return "bench:coord";
}

static int io_is_self(void *ctx, const char *node, const char *address)
{
	if (node)
		return !strcmp(node, "coord");
	return !address || !*address || !strcmp(address, "local") || !strcmp(address, "bench:coord");
}

static int io_node_is_at(void *ctx, const char *node, const char *address)
{
	struct bnode *n = node_named(node);

	if (io_is_self(ctx, NULL, address))
		return node && !strcmp(node, "coord");
	return n && address && !strcmp(n->addr, address);
}

static unsigned long long io_record_key(void *ctx, const uint8_t *hdr, size_t hdrlen)
{
	return 0;
}

static void io_attach(void *ctx, dte_io_recv_fn recv, dte_io_down_fn down, dte_io_seal_fn seal,
		      void *engine)
{
	B.recv = recv;
	B.seal = seal;
	B.engine = engine;
}

static void io_detach(void *ctx, void *engine)
{
	B.recv = NULL;
	B.seal = NULL;
}

/* ------------------------------------------------------------------ members */

static uint8_t key[PEER_AUTH_KEYBYTES];

static void deliver(struct bnode *n, Dtep__PeerMsgType type, ProtobufCMessage *msg)
{
	uint8_t mac[PEER_AUTH_MACBYTES];
	size_t len;
	uint8_t *hdr;

	if (peer_auth_seal(key, type, msg, NULL, 0, mac) < 0) {
		fprintf(stderr, "bench_replan: cannot seal\n");
		exit(1);
	}
	len = protobuf_c_message_get_packed_size(msg);
	if (!(hdr = malloc(len ? len : 1))) {
		fprintf(stderr, "bench_replan: out of memory\n");
		exit(1);
	}
	protobuf_c_message_pack(msg, hdr);
	B.recv(B.engine, n->name, type, hdr, len, NULL, 0);
	free(hdr);
	B.now += 1000000;	/* 1 ms between records */
}

static void join(struct bnode *n, const char *srcdesc, const char *sinkdesc, uint64_t spec_hash)
{
	Dtep__Join m = DTEP__JOIN__INIT;
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	Dtep__Participant p = DTEP__PARTICIPANT__INIT, *pp = &p;
	uint8_t nonce[PEER_AUTH_NONCEBYTES];

	memset(nonce, 0x5a, sizeof(nonce));
	ref.job = JOB;
	m.job = &ref;
	m.spec_hash = spec_hash;
	m.node = n->name;
	m.address = n->addr;
	m.peer_proto = PEER_PROTO_VERSION;
	m.join_boot = 1 + (uint64_t)(n - B.n);
	m.join_seq = ++n->seq;
	m.nonce.data = nonce;
	m.nonce.len = sizeof(nonce);
	p.id = n->id;
	p.role = n->role;
	p.layout = (char *)(n->role == DTEP__ROLE__ROLE_SOURCE ? srcdesc : sinkdesc);
	p.rank = n->rank;
	p.replica = n->replica;
	p.node = n->name;
	p.shards = "";
	m.n_participants = 1;
	m.participants = &pp;
	deliver(n, DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, &m.base);
}

/* Every member acknowledges the PLAN it got last (a member daemon does
 * as it takes one), between the timed re-plans: the coordinator then
 * sends the next one as only what changed (peer protocol 8). */
static void ack_all(void)
{
	for (size_t i = 0; B.acks && i < B.nn; i++) {
		Dtep__PlanAck m = DTEP__PLAN_ACK__INIT;
		Dtep__JobRef ref = DTEP__JOB_REF__INIT;

		if (!B.n[i].ack)
			continue;
		ref.job = JOB;
		m.job = &ref;
		m.epoch = B.n[i].ack;
		m.node = B.n[i].name;
		B.n[i].ack = 0;
		deliver(&B.n[i], DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK, &m.base);
	}
}

static void leave(struct bnode *n)
{
	Dtep__Leave m = DTEP__LEAVE__INIT;
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	uint64_t id = n->id;

	ref.job = JOB;
	m.job = &ref;
	m.node = n->name;
	m.n_participants = 1;
	m.participants = &id;
	deliver(n, DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE, &m.base);
}

/* ------------------------------------------------------------------ measuring */

struct phase {
	struct timespec c0, w0;
	double cpu_ms, wall_ms, peak_mb;
};

static void peak_reset(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY);

	if (fd >= 0) {
		if (write(fd, "5", 1) < 0)
			(void)0;	/* an older kernel: the peak is the process's */
		close(fd);
	}
}

static double ms_between(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) * 1e3 + (double)(b->tv_nsec - a->tv_nsec) / 1e6;
}

static void phase_start(struct phase *p)
{
	for (size_t i = 0; i < B.nn; i++)
		B.n[i].recs = B.n[i].bytes = 0;
	peak_reset();
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &p->c0);
	clock_gettime(CLOCK_MONOTONIC, &p->w0);
}

static void phase_end(struct phase *p)
{
	struct timespec c1, w1;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
	clock_gettime(CLOCK_MONOTONIC, &w1);
	p->cpu_ms = ms_between(&p->c0, &c1);
	p->wall_ms = ms_between(&p->w0, &w1);
	p->peak_mb = peak_mb();
}

/* Bytes sent in the phase: total, per member (mean over the nodes that
 * got any), the largest to one source node and to one sink node. */
static void phase_bytes(uint64_t *total, uint64_t *recs, uint64_t *per, uint64_t *src_max,
			uint64_t *sink_max)
{
	uint64_t got = 0;

	*total = *recs = *src_max = *sink_max = 0;
	for (size_t i = 0; i < B.nn; i++) {
		const struct bnode *n = &B.n[i];
		uint64_t *mx = n->role == DTEP__ROLE__ROLE_SOURCE ? src_max : sink_max;

		*total += n->bytes;
		*recs += n->recs;
		got += n->recs > 0;
		if (n->bytes > *mx)
			*mx = n->bytes;
	}
	*per = got ? *total / got : 0;
}

static void phase_print(const char *name, const struct phase *p)
{
	uint64_t total, recs, per, smax, kmax;

	phase_bytes(&total, &recs, &per, &smax, &kmax);
	printf("bench replan phase=%s cpu_ms=%.1f wall_ms=%.1f peak_mb=%.0f records=%llu bytes=%llu "
	       "bytes_per_member=%llu source_max=%llu sink_max=%llu\n", name, p->cpu_ms, p->wall_ms,
	       p->peak_mb, (unsigned long long)recs, (unsigned long long)total,
	       (unsigned long long)per, (unsigned long long)smax, (unsigned long long)kmax);
	fflush(stdout);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	long n;
	char *s;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	s = malloc((size_t)n + 1);
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	if (s)
		s[n] = 0;
	fclose(f);
	return s;
}

int main(int argc, char **argv)
{
	const char *model = "tests/data/layout/models/qwen3-8b.json";
	const char *srcdesc = "megatron:tp=8,dp=16", *sinkdesc = "sglang:tp=8";
	unsigned sources = 128, replicas = 112, tp = 8;
	struct dte_engine_io io = {
		.now_ns = io_now,
		.timer_new = io_timer_new,
		.timer_start = io_timer_start,
		.timer_stop = io_timer_stop,
		.timer_free = io_timer_free,
		.send = io_send,
		.send_given = io_send_given,
		.take_data = io_take_data,
		.self_node = io_self_node,
		.self_address = io_self_address,
		.is_self = io_is_self,
		.node_is_at = io_node_is_at,
		.record_key = io_record_key,
		.attach = io_attach,
		.detach = io_detach,
	};
	struct jcreate_args jc = { 0 };
	struct jcreate_res jr = { 0 };
	struct phase setup, first, lv, jn, rep;
	struct dte_engine *e;
	struct job *j;
	struct bnode *victim;
	uint64_t total, recs, per, smax, kmax, fper, ftotal, ltotal, lper;
	char err[512], *config;
	const char *mname;
	unsigned relay = 0;

	B.acks = 1;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--model"))
			model = argv[i + 1];
		else if (!strcmp(argv[i], "--source"))
			srcdesc = argv[i + 1];
		else if (!strcmp(argv[i], "--sink"))
			sinkdesc = argv[i + 1];
		else if (!strcmp(argv[i], "--sources"))
			sources = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--replicas"))
			replicas = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--tp"))
			tp = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--relay-fanout"))
			relay = (unsigned)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--ack"))
			B.acks = atoi(argv[i + 1]) != 0;
		else {
			fprintf(stderr, "bench_replan: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (!sources || !replicas || !tp || !(config = slurp(model))) {
		fprintf(stderr, "bench_replan: cannot read %s (or a count is 0)\n", model);
		return 2;
	}
	mname = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
	dlog_init(getenv("BENCH_REPLAN_LOG") ? DLOG_NOTICE : DLOG_WARN);
	B.nn = sources + (size_t)replicas * tp;
	if (!(B.n = calloc(B.nn, sizeof(*B.n))))
		return 1;
	for (size_t i = 0; i < B.nn; i++) {
		struct bnode *n = &B.n[i];

		snprintf(n->name, sizeof(n->name), "n%05zu", i);
		snprintf(n->addr, sizeof(n->addr), "10.%u.%u.%u:13373", (unsigned)(i >> 16) & 255,
			 (unsigned)(i >> 8) & 255, (unsigned)i & 255);
		n->id = ((uint64_t)(i + 1) << 32) | 1;
		if (i < sources) {
			n->role = DTEP__ROLE__ROLE_SOURCE;
			n->rank = (uint32_t)i;
		} else {
			n->role = DTEP__ROLE__ROLE_SINK;
			n->rank = (uint32_t)((i - sources) % tp);
			n->replica = (uint32_t)((i - sources) / tp);
		}
	}
	B.now = 1000000000ull;
	if (!(e = dte_engine_new_io(&io, dtc_backend_cpu(), "cpu"))) {
		fprintf(stderr, "bench_replan: no engine\n");
		return 1;
	}
	/* --relay-fanout N: the coordinator plans relay trees too (issue 34) */
	job_set_relay(e, relay, 1, 0);
	jc.name = JOB;
	jc.model_config = config;
	jc.token = TOKEN;
	jc.coordinator = "bench:coord";
	if (job_create(e, &jc, &jr, err, sizeof(err)) || !jr.coordinator) {
		fprintf(stderr, "bench_replan: job_create: %s\n", err);
		return 1;
	}
	j = job_find(e, JOB);
	peer_auth_key(key, JOB, TOKEN);
	/* The sinks first (no source yet: nothing to plan), then every
	 * source but the last; the last completes the job. */
	phase_start(&setup);
	for (size_t i = sources; i < B.nn; i++) {
		join(&B.n[i], srcdesc, sinkdesc, j->spec.hash);
		ack_all();
	}
	for (size_t i = 0; i + 1 < sources; i++) {
		join(&B.n[i], srcdesc, sinkdesc, j->spec.hash);
		ack_all();
	}
	phase_end(&setup);
	phase_print("setup", &setup);
	phase_start(&first);
	join(&B.n[sources - 1], srcdesc, sinkdesc, j->spec.hash);
	phase_end(&first);
	phase_print("first", &first);
	phase_bytes(&ftotal, &recs, &fper, &smax, &kmax);
	ack_all();
	if (!j->coord_complete)
		fprintf(stderr, "bench_replan: the plan is not complete after every JOIN\n");
	victim = &B.n[B.nn - tp];
	phase_start(&lv);
	leave(victim);
	phase_end(&lv);
	phase_print("leave", &lv);
	phase_bytes(&ltotal, &recs, &lper, &smax, &kmax);
	ack_all();
	phase_start(&jn);
	join(victim, srcdesc, sinkdesc, j->spec.hash);
	phase_end(&jn);
	phase_print("join", &jn);
	phase_bytes(&total, &recs, &per, &smax, &kmax);
	ack_all();
	phase_start(&rep);
	for (size_t i = B.nn - tp; i < B.nn; i++)
		leave(&B.n[i]);
	phase_end(&rep);
	phase_print("replica_leave", &rep);
	printf("bench replan model=%s source=%s sink=%s nodes=%zu sources=%u sinks=%u "
	       "setup_s=%.1f first_ms=%.1f leave_ms=%.1f join_ms=%.1f replica_leave_ms=%.1f "
	       "plan_bytes_per_member=%llu plan_bytes_total=%llu first_plan_bytes_total=%llu "
	       "leave_plan_bytes_total=%llu acks=%d peak_mb=%.0f\n", mname, srcdesc, sinkdesc,
	       B.nn, sources, replicas * tp,
	       setup.cpu_ms / 1e3, first.cpu_ms, lv.cpu_ms, jn.cpu_ms, rep.cpu_ms,
	       (unsigned long long)per, (unsigned long long)total, (unsigned long long)ftotal,
	       (unsigned long long)ltotal, B.acks,
	       first.peak_mb > jn.peak_mb ? first.peak_mb : jn.peak_mb);
	if (B.other_recs)
		fprintf(stderr, "bench_replan: %llu records to unknown nodes\n",
			(unsigned long long)B.other_recs);
	dte_engine_free(e);
	free(B.n);
	free(B.buf);
	free(config);
	return 0;
}
