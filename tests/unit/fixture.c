/* tests/unit/fixture.c — deterministic I/O for N sync engines in one
 * process (tests/unit/fixture.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include "proto/peer_auth.h"
#include "tests/unit/fixture.h"

struct fx_rec;

/* A node's records to one destination, waiting for its NIC: a NIC serves
 * its connections in turn, a record each (as TCP flows or RDMA queue
 * pairs share a link), not one connection's backlog before the next. */
struct fx_uq {
	unsigned to;
	struct fx_rec *head, *tail;
	struct fx_uq *next;
};

struct fx_node {
	struct fx *fx;
	unsigned idx;
	char name[32];
	char addr[32];
	dte_io_recv_fn recv;
	dte_io_down_fn down;
	dte_io_seal_fn seal;
	void *engine;
	int cut;		/* partitioned: records to and from it are lost */
	/* timed links (fix_set_links): what waits for its NIC, whose turn
	 * is next; when its NIC is free to take a record in, and when its
	 * loop is done checking what came in */
	struct fx_uq *uq, *rr;	/* records waiting for its NIC, per destination */
	int up_busy;		/* a record of its own is on its NIC */
	uint64_t down_free, cpu_free;
	double up_Bps, down_Bps;
	uint64_t busy_ns;	/* wall time spent in its callbacks (fix_node_busy_ns) */
};

struct dte_timer {
	struct fx_node *n;
	void (*cb)(void *arg);
	void *arg;
	uint64_t due, repeat_ns;
	int on, freed;
	struct dte_timer *next;
};

struct dte_wake {
	struct fx_node *n;
	void (*cb)(void *arg);
	void *arg;
	int pending, freed;
	struct dte_wake *next;
};

struct fx_work {
	struct fx_node *n;
	struct dte_work *w;
	int cancelled;		/* its after() comes with cancelled set, at its step */
	struct fx_work *next;
};

struct fx_rec {
	unsigned from, to;
	Dtep__PeerMsgType type;
	uint8_t *hdr;
	size_t hdrlen;
	void *data;
	size_t len;
	uint64_t due, seq;	/* timed links: in the heap until due (ties: seq) */
	int on_nic;		/* timed: due is when its sender's NIC has sent it */
	uint64_t nic_start;	/* timed: when its sender's NIC began it */
	double bytes, cdata;	/* timed: on the links; its data as the receiver checks it */
	struct fx_rec *next;
};

struct fx {
	unsigned n;
	struct fx_node *nodes;
	uint64_t rng, now;
	struct fx_faults f;
	struct fix_stats st;
	struct dte_timer *timers;
	struct dte_wake *wakes;
	struct fx_work *works;	/* queued, oldest first */
	struct fx_rec *recs;	/* queued, oldest first */
	size_t nrecs, nworks, nwakes;	/* nwakes: pending */
	/* timed links: records in a heap by (due, seq) instead of recs */
	int timed;
	struct fx_links links;
	struct fx_rec **heap;
	size_t heap_cap;
	uint64_t seq;
	struct dte_timer *tnext;	/* the next due timer, when !tdirty */
	int tdirty;
};

/* splitmix64: the fixture's one source of choices. */
static uint64_t rnd(struct fx *fx)
{
	uint64_t z = (fx->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static unsigned pct(struct fx *fx)
{
	return (unsigned)(rnd(fx) % 100);
}

/* ------------------------------------------------------------------ clock */

/* Wall time on this process's clock, for what a node's callbacks cost
 * (fix_node_busy_ns); not the fixture's clock. */
static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t io_now(void *ctx)
{
	return ((struct fx_node *)ctx)->fx->now;
}

/* ------------------------------------------------------------------ timers */

static struct dte_timer *io_timer_new(void *ctx, void (*cb)(void *arg), void *arg)
{
	struct fx_node *n = ctx;
	struct dte_timer *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->n = n;
	t->cb = cb;
	t->arg = arg;
	t->next = n->fx->timers;
	n->fx->timers = t;
	n->fx->tdirty = 1;
	return t;
}

static void io_timer_start(void *ctx, struct dte_timer *t, uint64_t timeout_ms, uint64_t repeat_ms)
{
	t->due = t->n->fx->now + timeout_ms * 1000000u;
	t->repeat_ns = repeat_ms * 1000000u;
	t->on = 1;
	t->n->fx->tdirty = 1;
}

static void io_timer_stop(void *ctx, struct dte_timer *t)
{
	t->on = 0;
	t->n->fx->tdirty = 1;
}

static void io_timer_free(void *ctx, struct dte_timer *t)
{
	t->on = 0;
	t->freed = 1;	/* reaped by fix_free */
	t->n->fx->tdirty = 1;
}

/* ------------------------------------------------------------------ workers */

static int io_work_queue(void *ctx, struct dte_work *w)
{
	struct fx_node *n = ctx;
	struct fx_work *q = calloc(1, sizeof(*q)), **pp;

	if (!q)
		return -ENOMEM;
	q->n = n;
	q->w = w;
	w->io_priv = q;
	for (pp = &n->fx->works; *pp; pp = &(*pp)->next)
		;
	*pp = q;
	n->fx->nworks++;
	return 0;
}

static void work_unlink(struct fx *fx, struct fx_work *q)
{
	for (struct fx_work **pp = &fx->works; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			fx->nworks--;
			return;
		}
}

/* Run one queued work to its end, or end it cancelled. */
static void work_do(struct fx *fx, struct fx_work *q)
{
	struct dte_work *w = q->w;
	struct fx_node *n = q->n;
	int cancel = q->cancelled;
	uint64_t t0 = wall_ns();

	work_unlink(fx, q);
	w->io_priv = NULL;
	free(q);
	if (!cancel)
		w->run(w);
	fx->st.works++;
	w->after(w, cancel);
	n->busy_ns += wall_ns() - t0;
}

static int io_work_cancel(void *ctx, struct dte_work *w)
{
	struct fx_node *n = ctx;

	struct fx_work *q = w->io_priv;

	(void)n;
	if (!q || q->cancelled)
		return -EBUSY;
	/* As libuv: the after() comes later, from a step, not from here
	 * (the caller may be walking the list the after() unlinks from). */
	q->cancelled = 1;
	return 0;
}

/* The drain at shutdown: this node's work and wakes, one at a time. */
static int io_run(void *ctx, int block)
{
	struct fx_node *n = ctx;

	for (struct fx_work *q = n->fx->works; q; q = q->next)
		if (q->n == n) {
			work_do(n->fx, q);
			return 1;
		}
	for (struct dte_wake *w = n->fx->wakes; w; w = w->next)
		if (w->n == n && w->pending && !w->freed) {
			w->pending = 0;
			n->fx->nwakes--;
			w->cb(w->arg);
			return 1;
		}
	return -1;
}

/* ------------------------------------------------------------------ wakes */

static struct dte_wake *io_wake_new(void *ctx, void (*cb)(void *arg), void *arg)
{
	struct fx_node *n = ctx;
	struct dte_wake *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->n = n;
	w->cb = cb;
	w->arg = arg;
	w->next = n->fx->wakes;
	n->fx->wakes = w;
	return w;
}

static void io_wake_send(void *ctx, struct dte_wake *w)
{
	if (!w->pending && !w->freed) {
		w->pending = 1;
		w->n->fx->nwakes++;
	}
}

static void io_wake_free(void *ctx, struct dte_wake *w)
{
	if (w->pending && !w->freed)
		w->n->fx->nwakes--;
	w->pending = 0;
	w->freed = 1;
}

/* ------------------------------------------------------------------ transport */

/* The node whose name (or address) is prefix<i>, or NULL. */
static struct fx_node *node_parse(struct fx *fx, const char *s, const char *prefix)
{
	size_t pl = strlen(prefix);
	unsigned long i;
	char *end;

	if (!s || strncmp(s, prefix, pl) || s[pl] < '0' || s[pl] > '9')
		return NULL;
	i = strtoul(s + pl, &end, 10);
	if (*end || i >= fx->n)
		return NULL;
	/* "node01" is not node1 */
	return !strcmp(pl == 4 ? fx->nodes[i].name : fx->nodes[i].addr, s) ? &fx->nodes[i] : NULL;
}

static struct fx_node *node_named(struct fx *fx, const char *name)
{
	return node_parse(fx, name, "node");
}

static struct fx_node *node_at(struct fx *fx, const char *address)
{
	return node_parse(fx, address, "fx:");
}

static int io_is_self(void *ctx, const char *node, const char *address)
{
	struct fx_node *n = ctx;

	if (node)
		return !strcmp(node, n->name);
	return !address || !*address || !strcmp(address, "local") || !strcmp(address, n->addr);
}

static void rec_free(struct fx_rec *r)
{
	free(r->hdr);
	free(r->data);
	free(r);
}

/* Timed links: a binary heap of records by (due, seq). */
static int rec_before(const struct fx_rec *a, const struct fx_rec *b)
{
	return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void heap_up(struct fx *fx, size_t i)
{
	while (i) {
		size_t p = (i - 1) / 2;
		struct fx_rec *x;

		if (!rec_before(fx->heap[i], fx->heap[p]))
			break;
		x = fx->heap[i];
		fx->heap[i] = fx->heap[p];
		fx->heap[p] = x;
		i = p;
	}
}

static void heap_down(struct fx *fx, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		struct fx_rec *x;

		if (l < fx->nrecs && rec_before(fx->heap[l], fx->heap[m]))
			m = l;
		if (r < fx->nrecs && rec_before(fx->heap[r], fx->heap[m]))
			m = r;
		if (m == i)
			return;
		x = fx->heap[i];
		fx->heap[i] = fx->heap[m];
		fx->heap[m] = x;
		i = m;
	}
}

static struct fx_rec *heap_pop(struct fx *fx)
{
	struct fx_rec *r = fx->heap[0];

	fx->heap[0] = fx->heap[--fx->nrecs];
	heap_down(fx, 0);
	return r;
}

/* The records drop(r, i) says are lost leave the heap (order kept). */
static void heap_filter(struct fx *fx, int (*drop)(const struct fx_rec *r, unsigned i), unsigned i)
{
	size_t k = 0;

	for (size_t q = 0; q < fx->nrecs; q++) {
		struct fx_rec *r = fx->heap[q];

		if (drop(r, i)) {
			if (r->on_nic)
				fx->nodes[r->from].up_busy = 0;
			fx->st.cut++;
			rec_free(r);
		} else {
			fx->heap[k++] = r;
		}
	}
	fx->nrecs = k;
	for (size_t q = k / 2 + 1; q-- > 0;)
		heap_down(fx, q);
}

static void nic_kick(struct fx *fx, struct fx_node *n);

/* The records of the list at *pp that drop(r, i) says are lost, freed
 * and counted cut: how many; *last (if not NULL) the list's last left. */
static size_t list_filter(struct fx *fx, struct fx_rec **pp,
			  int (*drop)(const struct fx_rec *r, unsigned i), unsigned i,
			  struct fx_rec **last)
{
	size_t n = 0;

	if (last)
		*last = NULL;
	while (*pp) {
		struct fx_rec *r = *pp;

		if (drop(r, i)) {
			*pp = r->next;
			fx->st.cut++;
			rec_free(r);
			n++;
		} else {
			if (last)
				*last = r;
			pp = &r->next;
		}
	}
	return n;
}

/* Timed: the records drop(r, i) says are lost leave the heap and the
 * NICs' queues; a NIC whose record was lost takes its next. */
static void timed_filter(struct fx *fx, int (*drop)(const struct fx_rec *r, unsigned i), unsigned i)
{
	heap_filter(fx, drop, i);
	for (unsigned k = 0; k < fx->n; k++) {
		struct fx_node *n = &fx->nodes[k];

		for (struct fx_uq **pp = &n->uq; *pp;) {
			struct fx_uq *q = *pp;

			list_filter(fx, &q->head, drop, i, &q->tail);
			if (!q->head) {
				if (n->rr == q)
					n->rr = q->next;
				*pp = q->next;
				free(q);
			} else {
				pp = &q->next;
			}
		}
		nic_kick(fx, n);
	}
}

/* Timed links: a record's bytes on the links, and its data as the
 * receiver checks it (scaled, fx_links). */
static void link_size(struct fx *fx, struct fx_rec *r, const ProtobufCMessage *msg)
{
	const struct fx_links *lk = &fx->links;
	size_t sc = lk->scaled ? lk->scaled(r->type, msg, r->len) : r->len;

	if (sc > r->len)
		sc = r->len;
	r->cdata = (double)(r->len - sc) + (double)sc * lk->byte_scale;
	r->bytes = (double)r->hdrlen + r->cdata;
}

static void heap_push(struct fx *fx, struct fx_rec *r);

/* Node n's NIC, if idle, takes the next record of the next destination
 * in turn; it is in the heap until the NIC has sent it (nic_done). */
static void nic_kick(struct fx *fx, struct fx_node *n)
{
	const struct fx_links *lk = &fx->links;
	double up = n->up_Bps > 0 ? n->up_Bps : lk->up_Bps;
	struct fx_uq *q, **pp;
	struct fx_rec *r;

	if (n->up_busy || !n->uq)
		return;
	q = n->rr ? n->rr : n->uq;
	r = q->head;
	q->head = r->next;
	r->next = NULL;
	n->rr = q->next;
	if (!q->head) {	/* served: the destination leaves the turn */
		for (pp = &n->uq; *pp != q; pp = &(*pp)->next)
			;
		*pp = q->next;
		free(q);
	}
	r->on_nic = 1;
	r->nic_start = fx->now;
	r->due = fx->now + (uint64_t)llround(r->bytes / up * 1e9);
	n->up_busy = 1;
	heap_push(fx, r);
}

/* Its sender's NIC has sent r (now): the receiver's NIC takes it after
 * what it took before (no sooner than a latency after its first byte
 * left, and a latency after its last), and a record with data is then
 * checked by the receiver's loop after what came in before it. */
static void nic_done(struct fx *fx, struct fx_rec *r)
{
	const struct fx_links *lk = &fx->links;
	struct fx_node *from = &fx->nodes[r->from], *to = &fx->nodes[r->to];
	double down = to->down_Bps > 0 ? to->down_Bps : lk->down_Bps;
	uint64_t dstart, arrive;

	from->up_busy = 0;
	dstart = r->nic_start + lk->latency_ns;
	if (dstart < to->down_free)
		dstart = to->down_free;
	arrive = dstart + (uint64_t)llround(r->bytes / down * 1e9);
	if (arrive < fx->now + lk->latency_ns)
		arrive = fx->now + lk->latency_ns;
	to->down_free = arrive;
	r->due = arrive;
	if (r->len && lk->check_ns_per_byte > 0) {
		r->due = arrive > to->cpu_free ? arrive : to->cpu_free;
		r->due += (uint64_t)llround(r->cdata * lk->check_ns_per_byte);
		to->cpu_free = r->due;
	}
	r->on_nic = 0;
	heap_push(fx, r);
	nic_kick(fx, from);
}

/* Timed: a record to another node waits for its sender's NIC. */
static void nic_queue(struct fx *fx, struct fx_rec *r)
{
	struct fx_node *n = &fx->nodes[r->from];
	struct fx_uq *q, **pp;

	for (pp = &n->uq; *pp && (*pp)->to != r->to; pp = &(*pp)->next)
		;
	if (!(q = *pp)) {
		if (!(q = calloc(1, sizeof(*q)))) {
			fx->st.dropped++;	/* lost, as a full transport would lose it */
			rec_free(r);
			return;
		}
		q->to = r->to;
		*pp = q;
	}
	if (q->tail && q->head)
		q->tail->next = r;
	else
		q->head = r;
	q->tail = r;
	nic_kick(fx, n);
}

static void heap_push(struct fx *fx, struct fx_rec *r)
{
	if (fx->nrecs == fx->heap_cap) {
		size_t cap = fx->heap_cap ? fx->heap_cap * 2 : 1024;
		struct fx_rec **h = realloc(fx->heap, cap * sizeof(*h));

		if (!h) {	/* lost, as a full transport would lose it */
			fx->st.dropped++;
			rec_free(r);
			return;
		}
		fx->heap = h;
		fx->heap_cap = cap;
	}
	r->seq = fx->seq++;
	fx->heap[fx->nrecs] = r;
	heap_up(fx, fx->nrecs++);
}

static void rec_queue(struct fx *fx, struct fx_rec *r)
{
	struct fx_rec **pp;

	if (fx->timed) {
		r->next = NULL;
		if (r->from == r->to) {
			r->due = fx->now;
			heap_push(fx, r);
		} else {
			nic_queue(fx, r);
		}
		return;
	}
	for (pp = &fx->recs; *pp; pp = &(*pp)->next)
		;
	*pp = r;
	fx->nrecs++;
}

static struct fx_rec *rec_copy(const struct fx_rec *r)
{
	struct fx_rec *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	*c = *r;
	c->next = NULL;
	c->hdr = malloc(r->hdrlen ? r->hdrlen : 1);
	c->data = r->len ? malloc(r->len) : NULL;
	if (!c->hdr || (r->len && !c->data)) {
		free(c->hdr);
		free(c->data);
		free(c);
		return NULL;
	}
	memcpy(c->hdr, r->hdr, r->hdrlen);
	if (r->len)
		memcpy(c->data, r->data, r->len);
	return c;
}

/* As route.c: packed, sealed by the sender's engine when it leaves the
 * node; then lost, queued, or queued twice, by the seed. */
static int io_send(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
		   const ProtobufCMessage *msg, const void *data, size_t len)
{
	struct fx_node *n = ctx, *to = node ? node_named(n->fx, node) : node_at(n->fx, address);
	struct fx *fx = n->fx;
	ProtobufCBinaryData *field = NULL, keep = { 0, NULL };
	uint8_t mac[PEER_AUTH_MACBYTES];
	struct fx_rec *r;
	int rc;

	if (!msg || (len && !data))
		return -EINVAL;
	if (!to)
		return -EHOSTUNREACH;
	if (to != n && (n->cut || to->cut)) {
		fx->st.records++;
		fx->st.cut++;
		return 0;	/* sent into a broken link */
	}
	if (to != n && n->seal) {
		if ((rc = n->seal(n->engine, type, msg, data, len, mac)) < 0)
			return rc;
		if (rc > 0 && (field = peer_auth_mac_field(msg))) {
			keep = *field;
			field->data = mac;
			field->len = sizeof(mac);
		}
	}
	if (!(r = calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->from = n->idx;
	r->to = to->idx;
	r->type = type;
	r->hdrlen = protobuf_c_message_get_packed_size(msg);
	r->hdr = malloc(r->hdrlen ? r->hdrlen : 1);
	if (r->hdr)
		protobuf_c_message_pack(msg, r->hdr);
	if (field)
		*field = keep;
	r->len = len;
	r->data = len ? malloc(len) : NULL;
	if (!r->hdr || (len && !r->data)) {
		rec_free(r);
		return -ENOMEM;
	}
	if (len)
		memcpy(r->data, data, len);
	if (fx->timed)
		link_size(fx, r, msg);
	fx->st.records++;
	fx->st.data_bytes += len;
	if (fx->f.drop_pct && pct(fx) < fx->f.drop_pct) {
		fx->st.dropped++;
		rec_free(r);
		return 0;	/* lost on the way */
	}
	if (fx->f.dup_pct && pct(fx) < fx->f.dup_pct) {
		struct fx_rec *c = rec_copy(r);

		if (c) {
			fx->st.duplicated++;
			rec_queue(fx, c);
		}
	}
	rec_queue(fx, r);
	return 0;
}

/* Given data: copied into the queue, released at once (as a transport
 * that has sent it). */
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
	return NULL;	/* the receiver copies */
}

static const char *io_self_node(void *ctx)
{
	return ((struct fx_node *)ctx)->name;
}

static const char *io_self_address(void *ctx)
{
	return ((struct fx_node *)ctx)->addr;
}

static int io_node_is_at(void *ctx, const char *node, const char *address)
{
	struct fx_node *n = ctx, *at = node_at(n->fx, address);

	if (io_is_self(ctx, NULL, address))
		return node && !strcmp(node, n->name);
	return at && node && !strcmp(at->name, node);
}

static unsigned long long io_record_key(void *ctx, const uint8_t *hdr, size_t hdrlen)
{
	return (unsigned long long)XXH64(hdr, hdrlen, 0);
}

static void io_attach(void *ctx, dte_io_recv_fn recv, dte_io_down_fn down, dte_io_seal_fn seal,
		      void *engine)
{
	struct fx_node *n = ctx;

	n->recv = recv;
	n->down = down;
	n->seal = seal;
	n->engine = engine;
}

static void io_detach(void *ctx, void *engine)
{
	struct fx_node *n = ctx;

	if (n->engine == engine) {
		n->recv = NULL;
		n->down = NULL;
		n->seal = NULL;
		n->engine = NULL;
	}
}

void fix_io(struct fx *fx, unsigned i, struct dte_engine_io *io)
{
	*io = (struct dte_engine_io){
		.ctx = &fx->nodes[i],
		.now_ns = io_now,
		.timer_new = io_timer_new,
		.timer_start = io_timer_start,
		.timer_stop = io_timer_stop,
		.timer_free = io_timer_free,
		.work_queue = io_work_queue,
		.work_cancel = io_work_cancel,
		.run = io_run,
		.wake_new = io_wake_new,
		.wake_send = io_wake_send,
		.wake_free = io_wake_free,
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
}

/* ------------------------------------------------------------------ the fixture */

struct fx *fix_new(unsigned n, uint64_t seed, const struct fx_faults *faults)
{
	struct fx *fx;

	if (!n || n > FX_MAX_NODES || !(fx = calloc(1, sizeof(*fx))))
		return NULL;
	if (!(fx->nodes = calloc(n, sizeof(*fx->nodes)))) {
		free(fx);
		return NULL;
	}
	fx->n = n;
	fx->rng = seed;
	fx->now = 1000000000ull;	/* not 0: "never" stays told apart */
	fix_set_faults(fx, faults);
	for (unsigned i = 0; i < n; i++) {
		fx->nodes[i].fx = fx;
		fx->nodes[i].idx = i;
		snprintf(fx->nodes[i].name, sizeof(fx->nodes[i].name), "node%u", i);
		snprintf(fx->nodes[i].addr, sizeof(fx->nodes[i].addr), "fx:%u", i);
	}
	return fx;
}

void fix_set_faults(struct fx *fx, const struct fx_faults *faults)
{
	if (faults)
		fx->f = *faults;
	else
		memset(&fx->f, 0, sizeof(fx->f));
	if (!fx->f.max_tick_ns)
		fx->f.max_tick_ns = 100000;
}

void fix_free(struct fx *fx)
{
	if (!fx)
		return;
	while (fx->timers) {
		struct dte_timer *t = fx->timers;

		fx->timers = t->next;
		free(t);
	}
	while (fx->wakes) {
		struct dte_wake *w = fx->wakes;

		fx->wakes = w->next;
		free(w);
	}
	while (fx->works) {
		struct fx_work *q = fx->works;

		fx->works = q->next;
		free(q);
	}
	while (fx->recs) {
		struct fx_rec *r = fx->recs;

		fx->recs = r->next;
		rec_free(r);
	}
	if (fx->timed)
		for (size_t q = 0; q < fx->nrecs; q++)
			rec_free(fx->heap[q]);
	for (unsigned k = 0; k < fx->n; k++)
		while (fx->nodes[k].uq) {
			struct fx_uq *q = fx->nodes[k].uq;

			fx->nodes[k].uq = q->next;
			while (q->head) {
				struct fx_rec *r = q->head;

				q->head = r->next;
				rec_free(r);
			}
			free(q);
		}
	free(fx->heap);
	free(fx->nodes);
	free(fx);
}

int fix_set_links(struct fx *fx, const struct fx_links *links)
{
	if (fx->nrecs || !links || !(links->up_Bps > 0) || !(links->down_Bps > 0) ||
	    !(links->byte_scale > 0))
		return -EINVAL;
	fx->links = *links;
	fx->timed = 1;
	return 0;
}

void fix_set_node_link(struct fx *fx, unsigned i, double up_Bps, double down_Bps)
{
	fx->nodes[i].up_Bps = up_Bps;
	fx->nodes[i].down_Bps = down_Bps;
}

uint64_t fix_node_busy_ns(const struct fx *fx, unsigned i)
{
	return fx->nodes[i].busy_ns;
}

const char *fix_node_name(struct fx *fx, unsigned i)
{
	return fx->nodes[i].name;
}

const char *fix_node_address(struct fx *fx, unsigned i)
{
	return fx->nodes[i].addr;
}

uint64_t fix_now(const struct fx *fx)
{
	return fx->now;
}

void fix_stats(const struct fx *fx, struct fix_stats *st)
{
	*st = fx->st;
}

static void deliver(struct fx *fx, struct fx_rec *r)
{
	struct fx_node *to = &fx->nodes[r->to];

	if (r->from != r->to && (to->cut || fx->nodes[r->from].cut)) {
		fx->st.cut++;
		rec_free(r);
		return;
	}
	fx->st.delivered++;
	if (to->recv) {
		uint64_t t0 = wall_ns();

		to->recv(to->engine, fx->nodes[r->from].name, r->type, r->hdr, r->hdrlen, r->data,
			 r->len);
		to->busy_ns += wall_ns() - t0;
	}
	rec_free(r);
}

static void timer_fire(struct fx *fx, struct dte_timer *t)
{
	uint64_t t0 = wall_ns();

	if (t->repeat_ns)
		t->due = fx->now + t->repeat_ns;
	else
		t->on = 0;
	fx->tdirty = 1;
	fx->st.timers++;
	t->cb(t->arg);
	t->n->busy_ns += wall_ns() - t0;
}

/* The armed timer due first (ties: the first in the list), or NULL;
 * looked for again only after a timer changed. */
static struct dte_timer *timer_next(struct fx *fx)
{
	struct dte_timer *best = NULL;

	if (!fx->tdirty)
		return fx->tnext;
	for (struct dte_timer *t = fx->timers; t; t = t->next)
		if (t->on && !t->freed && (!best || t->due < best->due))
			best = t;
	fx->tnext = best;
	fx->tdirty = 0;
	return best;
}

static void wake_fire(struct fx *fx, struct dte_wake *w)
{
	uint64_t t0 = wall_ns();

	w->pending = 0;
	fx->nwakes--;
	fx->st.wakes++;
	w->cb(w->arg);
	w->n->busy_ns += wall_ns() - t0;
}

/* Timed links: what is ready now runs first (work, then wakes), in the
 * order queued; then the record or timer due first (ties: the record),
 * the clock moving to it.  No seeded choice. */
static int step_timed(struct fx *fx)
{
	struct dte_timer *t;
	struct fx_rec *r;

	if (fx->nworks) {
		fx->st.steps++;
		work_do(fx, fx->works);
		return 0;
	}
	if (fx->nwakes) {
		for (struct dte_wake *w = fx->wakes; w; w = w->next)
			if (w->pending && !w->freed) {
				fx->st.steps++;
				wake_fire(fx, w);
				return 0;
			}
	}
	t = timer_next(fx);
	r = fx->nrecs ? fx->heap[0] : NULL;
	if (!t && !r)
		return -1;
	fx->st.steps++;
	if (r && (!t || r->due <= t->due)) {
		if (r->due > fx->now)
			fx->now = r->due;
		r = heap_pop(fx);
		if (r->on_nic)
			nic_done(fx, r);
		else
			deliver(fx, r);
	} else {
		if (t->due > fx->now)
			fx->now = t->due;
		timer_fire(fx, t);
	}
	return 0;
}

int fix_step(struct fx *fx)
{
	struct dte_timer *t;
	size_t nwakes = fx->nwakes, nready;
	uint64_t k;

	if (fx->timed)
		return step_timed(fx);
	t = timer_next(fx);
	nready = fx->nrecs + fx->nworks + nwakes + (t && t->due <= fx->now);
	if (!nready) {
		if (!t)
			return -1;
		/* Nothing else can happen before it: time jumps there. */
		fx->now = t->due;
		nready = 1;
	}
	fx->st.steps++;
	k = rnd(fx) % nready;
	if (k < fx->nrecs) {
		struct fx_rec **pp = &fx->recs, *r;
		uint64_t at = 0;

		if (fx->f.reorder_pct && pct(fx) < fx->f.reorder_pct) {
			at = rnd(fx) % fx->nrecs;
			fx->st.reordered += at != 0;
		}
		while (at--)
			pp = &(*pp)->next;
		r = *pp;
		*pp = r->next;
		fx->nrecs--;
		deliver(fx, r);
	} else if ((k -= fx->nrecs) < fx->nworks) {
		struct fx_work *q = fx->works;

		while (k--)
			q = q->next;
		work_do(fx, q);
	} else if ((k -= fx->nworks) < nwakes) {
		for (struct dte_wake *w = fx->wakes; w; w = w->next)
			if (w->pending && !w->freed && !k--) {
				wake_fire(fx, w);
				break;
			}
	} else {
		timer_fire(fx, t);
	}
	fx->now += rnd(fx) % (fx->f.max_tick_ns + 1);
	return 0;
}

int fix_run_until(struct fx *fx, int (*pred)(void *arg), void *arg, uint64_t max_steps)
{
	for (uint64_t i = 0; i < max_steps; i++) {
		if (pred(arg))
			return 0;
		if (fix_step(fx) < 0)
			return pred(arg) ? 0 : -1;
	}
	return pred(arg) ? 0 : -1;
}

int fix_settle(struct fx *fx, uint64_t max_steps)
{
	for (uint64_t i = 0; i < max_steps; i++) {
		if (!fx->nrecs && !fx->nworks && !fx->nwakes)
			return 0;
		if (fix_step(fx) < 0)
			return -1;
	}
	return -1;
}

void fix_partition(struct fx *fx, unsigned i, int on)
{
	fx->nodes[i].cut = !!on;
}

static int rec_on_link(const struct fx_rec *r, unsigned i)
{
	return r->from != r->to && (r->from == i || r->to == i);
}

static int rec_to_self(const struct fx_rec *r, unsigned i)
{
	return r->from == i && r->to == i;
}

/* The queued records drop(r, i) says are lost, whichever queue holds
 * them. */
static void recs_drop(struct fx *fx, int (*drop)(const struct fx_rec *r, unsigned i), unsigned i)
{
	if (fx->timed)
		timed_filter(fx, drop, i);
	else
		fx->nrecs -= list_filter(fx, &fx->recs, drop, i, NULL);
}

/* What is queued between node i and the others is lost: its links broke
 * (as route_ucx.c drops a node's pending records before it tells the
 * engine the node went down, nothing sent before the down arrives after
 * it). */
static void links_drop(struct fx *fx, unsigned i)
{
	recs_drop(fx, rec_on_link, i);
}

void fix_node_down(struct fx *fx, unsigned i)
{
	struct fx_node *n = &fx->nodes[i];

	links_drop(fx, i);
	for (unsigned k = 0; k < fx->n; k++) {
		struct fx_node *o = &fx->nodes[k];

		if (k == i)
			continue;
		if (o->down)
			o->down(o->engine, n->name);
		if (n->down)
			n->down(n->engine, o->name);
	}
}

void fix_node_gone(struct fx *fx, unsigned i)
{
	/* Its own records to itself went with the process too. */
	recs_drop(fx, rec_to_self, i);
	links_drop(fx, i);
	for (unsigned k = 0; k < fx->n; k++) {
		struct fx_node *o = &fx->nodes[k];

		if (k != i && o->down)
			o->down(o->engine, fx->nodes[i].name);
	}
}
