/* daemon/route_ucx.c — job records between daemons over daemon/peer.
 *
 * Three objects: a node (a remote daemon by name, with its address, queue
 * and counters; kept until the router closes so `dtectl
 * peers` shows history), a link (one dte_peer connection to a node, ours or
 * accepted; a node may briefly have two when both sides connected at once)
 * and a staging region (one UCX registration, carved first-fit for
 * incoming payloads).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>
#include "daemon/bufpool.h"
#include "daemon/conf.h"
#include "daemon/log.h"
#include "daemon/recvpool.h"
#include "daemon/registry.h"
#include "daemon/route_ucx.h"
#include "proto/peer.pb-c.h"

#define STAGE_ALIGN     64
#define STAGE_MIN       4096        /* smaller payloads stay in UCX's memory */
#define RECONNECT_NS    500000000ull /* a failed connect is not retried sooner */

struct rmsg {                  /* one record queued or in flight */
	struct rmsg *next;
	struct rnode *node;
	unsigned type;
	size_t hlen, dlen;
	size_t cap;                /* bytes allocated for it (big ones are pooled) */
	uint8_t *hdr, *data;
	droute_release_fn release; /* data is the sender's (not in buf): give */
	void *rarg;                /* it back with release(data, rarg) */
	uint8_t buf[];
};

struct rslot {                 /* a staging extent or arena piece handed to UCX */
	struct rslot *next;
	uint8_t *p;
	size_t len;
	int arena;                 /* a piece of a sink's arena (recvpool.h) */
};

struct rfree {                 /* a free staging extent (sorted by offset) */
	struct rfree *next;
	size_t off, len;
};

struct rlink {
	struct rlink *next;        /* in node->links */
	struct droute_ucx *r;
	struct rnode *node;        /* NULL until greeted (accepted links) */
	dte_peer_t *peer;
	int outgoing, up, stale;   /* stale: superseded by a restart */
	uint64_t inc;              /* the remote daemon's incarnation */
	char addr[DROUTE_ADDR_MAX];/* what it advertised, used once it is current */
	struct rslot *inflight;
};

enum rstate { N_DOWN, N_CONNECTING, N_UP };

struct rnode {
	struct rnode *next;
	char name[DROUTE_NODE_MAX];
	char addr[DROUTE_ADDR_MAX];
	/* An address we connected to and that greeted with this name: what
	 * droute_ucx_node_is_at trusts (an advertised addr is the peer's word). */
	char dialed[DROUTE_ADDR_MAX];
	enum rstate state;
	uint64_t since_ns, last_fail_ns, incarnation;
	struct rlink *links;
	int connecting;
	int down_told;             /* the engine heard "down" for this incarnation */
	struct rmsg *q_head, *q_tail;
	uint64_t nq;
	size_t qbytes;
	uint64_t msgs_in, bytes_in, msgs_out, bytes_out, dropped;
};

struct droute_ucx {
	uv_loop_t *loop;
	dte_peer_ctx_t ctx;
	int ctx_up, closing, timer_open;
	uv_timer_t timer;
	struct droute_ucx_params p;
	char node[DROUTE_NODE_MAX];
	char address[DROUTE_ADDR_MAX];
	size_t hdr_cap;
	struct rnode *nodes;
	uint8_t *stage;
	size_t stage_len;
	dte_peer_mem_t *stage_mem;
	struct rfree *free_ext;
	struct droute_ucx_stats st;
	void *lend_arena;          /* the arena piece being delivered (droute_ucx_take) */
	void (*close_cb)(void *);
	void *close_arg;
	char listen_error[160];    /* the listener's last bind failure ("" once bound) */
	uint64_t listen_tries;     /* binds tried after init's */
};

static struct droute_ucx *daemon_router;

static const char *const type_names[] = {
	[DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN] = "JOIN",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_LEAVE] = "LEAVE",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN] = "PLAN",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS] = "COUNTS",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD] = "PAYLOAD",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED] = "STAGED",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED] = "APPLIED",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED] = "REFUSED",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK] = "PLAN_ACK",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED] = "RELAYED",
	[DTEP__PEER_MSG_TYPE__PEER_MSG_RATES] = "RATES",
};
#define TYPE_MAX DTEP__PEER_MSG_TYPE__PEER_MSG_RATES

/* The records that carry data after their header: PAYLOAD, and RELAYED
 * (a forwarded PAYLOAD's part, or a forwarded record). */
static int has_data(unsigned type)
{
	return type == DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD ||
	       type == DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED;
}

const char *droute_ucx_type_name(unsigned type)
{
	return type >= 1 && type <= TYPE_MAX ? type_names[type] : "?";
}

struct droute_ucx *droute_ucx_daemon(void)
{
	return daemon_router;
}

void droute_ucx_set_daemon(struct droute_ucx *r)
{
	daemon_router = r;
}

static const char *node_label(const struct rnode *n)
{
	return n->name[0] ? n->name : n->addr;
}

static void node_state(struct rnode *n, enum rstate s)
{
	if (n->state != s) {
		/* `dtectl status` counts the nodes that are up. */
		if (s == N_UP)
			dreg_peer_added();
		else if (n->state == N_UP)
			dreg_peer_removed();
		n->state = s;
		n->since_ns = uv_hrtime();
	}
}

/* --- staging: one registered region, first fit --- */

static size_t stage_round(size_t len)
{
	return (len + STAGE_ALIGN - 1) & ~(size_t)(STAGE_ALIGN - 1);
}

static int in_stage(const struct droute_ucx *r, const void *p)
{
	return r->stage && (const uint8_t *)p >= r->stage &&
	       (const uint8_t *)p < r->stage + r->stage_len;
}

static void *stage_alloc(struct droute_ucx *r, size_t len)
{
	struct rfree **pp, *f;
	size_t need = stage_round(len);

	for (pp = &r->free_ext; (f = *pp); pp = &f->next) {
		if (f->len >= need) {
			uint8_t *p = r->stage + f->off;

			f->off += need;
			f->len -= need;
			if (!f->len) {
				*pp = f->next;
				free(f);
			}
			return p;
		}
	}
	return NULL;
}

static void stage_free(struct droute_ucx *r, void *p, size_t len)
{
	size_t off = (size_t)((uint8_t *)p - r->stage), n = stage_round(len);
	struct rfree *prev = NULL, *f = r->free_ext, *nf;

	while (f && f->off < off) {
		prev = f;
		f = f->next;
	}
	if (prev && prev->off + prev->len == off) {
		prev->len += n;
		if (f && prev->off + prev->len == f->off) {
			prev->len += f->len;
			prev->next = f->next;
			free(f);
		}
		return;
	}
	if (f && off + n == f->off) {
		f->off = off;
		f->len += n;
		return;
	}
	nf = malloc(sizeof(*nf));
	if (!nf) {
		/* Losing an extent shrinks staging; payloads fall back to
		 * ordinary memory, nothing breaks. */
		DLOG_E("route: out of memory returning %zu staging bytes", n);
		return;
	}
	nf->off = off;
	nf->len = n;
	nf->next = f;
	if (prev)
		prev->next = nf;
	else
		r->free_ext = nf;
}

static void slots_release(struct droute_ucx *r, struct rlink *l)
{
	struct rslot *s;

	while ((s = l->inflight)) {
		l->inflight = s->next;
		if (s->arena)
			recvpool_free(s->p);
		else
			stage_free(r, s->p, s->len);
		free(s);
	}
}

/* Forget a slot UCX filled; 0 when p was not handed to this link. */
/* The slot UCX received p into, off the link's list: its length (0: not
 * one of the link's), and in *arena whether it is an arena piece. */
static size_t slot_take(struct rlink *l, const void *p, int *arena)
{
	struct rslot **pp, *s;
	size_t len;

	for (pp = &l->inflight; (s = *pp); pp = &s->next) {
		if (s->p == p) {
			*pp = s->next;
			len = s->len;
			*arena = s->arena;
			free(s);
			return len;
		}
	}
	return 0;
}

/* --- nodes --- */

static struct rnode *node_by_name(struct droute_ucx *r, const char *name)
{
	struct rnode *n;

	for (n = r->nodes; n; n = n->next)
		if (n->name[0] && strcmp(n->name, name) == 0)
			return n;
	return NULL;
}

static struct rnode *node_by_addr(struct droute_ucx *r, const char *addr)
{
	struct rnode *n;

	for (n = r->nodes; n; n = n->next)
		if (n->addr[0] && strcmp(n->addr, addr) == 0)
			return n;
	return NULL;
}

/* A node other than n, up, that we connected to at addr or that holds it
 * already: first come keeps it. */
static struct rnode *addr_taken(struct droute_ucx *r, const struct rnode *n, const char *addr)
{
	for (struct rnode *o = r->nodes; o; o = o->next)
		if (o != n && o->state == N_UP && o->name[0] &&
		    (!strcmp(o->dialed, addr) || !strcmp(o->addr, addr)))
			return o;
	return NULL;
}

static struct rnode *node_new(struct droute_ucx *r, const char *name, const char *addr)
{
	struct rnode *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	snprintf(n->name, sizeof(n->name), "%s", name);
	snprintf(n->addr, sizeof(n->addr), "%s", addr);
	n->since_ns = uv_hrtime();
	n->next = r->nodes;
	r->nodes = n;
	return n;
}

static int link_live(const struct rlink *l)
{
	return l->up && !l->stale && dte_peer_is_up(l->peer);
}

/* A live link to the node's current incarnation: the one records go on. */
static struct rlink *node_up_link(const struct rnode *n)
{
	struct rlink *l;

	for (l = n->links; l; l = l->next)
		if (link_live(l) && l->inc == n->incarnation)
			return l;
	return NULL;
}

/* A live link from another incarnation that greeted while the current
 * one was still up (a restart not yet noticed, or an impostor). */
static struct rlink *node_other_link(const struct rnode *n)
{
	struct rlink *l;

	for (l = n->links; l; l = l->next)
		if (link_live(l) && l->inc != n->incarnation)
			return l;
	return NULL;
}

/* Big records (payload parts) are copies the size of a part: their memory
 * is kept for the next part (daemon/bufpool.h) while parts are going out,
 * and given back once none has been in flight for a timer tick. */
static struct bpool msg_pool = BPOOL_INIT((size_t)256 << 20);
static size_t msgs_pooled;     /* pooled records not freed yet */

static struct rmsg *rmsg_alloc(size_t hlen, size_t dlen)
{
	size_t cap;
	struct rmsg *m = bpool_get(&msg_pool, sizeof(*m) + hlen + dlen, &cap);

	if (m) {
		m->cap = cap;
		msgs_pooled += cap >= BPOOL_MIN;
	}
	return m;
}

static void rmsg_free(struct rmsg *m)
{
	if (!m)
		return;
	if (m->release)
		m->release(m->data, m->rarg);
	msgs_pooled -= m->cap >= BPOOL_MIN;
	bpool_put(&msg_pool, m, m->cap);
}

static uint64_t node_drop_pending(struct droute_ucx *r, struct rnode *n)
{
	struct rmsg *m;
	uint64_t lost = n->nq;

	while ((m = n->q_head)) {
		n->q_head = m->next;
		rmsg_free(m);
	}
	n->q_tail = NULL;
	n->nq = 0;
	n->qbytes = 0;
	n->dropped += lost;
	return lost;
}

static void link_unlink(struct rlink *l)
{
	struct rlink **pp;

	if (!l->node)
		return;
	for (pp = &l->node->links; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	}
	l->next = NULL;
}

static void link_add(struct rnode *n, struct rlink *l)
{
	l->node = n;
	l->next = n->links;
	n->links = l;
}

/* --- sending --- */

static void sent_cb(dte_peer_t *peer, int status, void *arg)
{
	struct rmsg *m = arg;

	if (status < 0 && m->node) {
		m->node->dropped++;
		DLOG_I("route: %s to %s failed: %s", droute_ucx_type_name(m->type),
		       node_label(m->node), strerror(-status));
	}
	rmsg_free(m);
}

static int link_send(struct rlink *l, struct rmsg *m)
{
	struct iovec iov = { .iov_base = m->data, .iov_len = m->dlen };
	int rc;

	rc = dte_peer_send(l->peer, m->type, m->hdr, m->hlen, &iov, m->dlen ? 1 : 0,
			   sent_cb, m);
	if (rc < 0)
		return rc;
	l->node->msgs_out++;
	l->node->bytes_out += m->hlen + m->dlen;
	return 0;
}

static void node_flush(struct rnode *n, struct rlink *l)
{
	struct rmsg *m;
	int rc;

	while ((m = n->q_head)) {
		n->q_head = m->next;
		if (!n->q_head)
			n->q_tail = NULL;
		n->nq--;
		n->qbytes -= m->hlen + m->dlen;
		rc = link_send(l, m);
		if (rc < 0) {
			n->dropped++;
			DLOG_W("route: %s to %s: %s", droute_ucx_type_name(m->type),
			       node_label(n), strerror(-rc));
			rmsg_free(m);
		}
	}
}

static int node_connect(struct droute_ucx *r, struct rnode *n)
{
	char host[DROUTE_ADDR_MAX];
	uint16_t port;
	struct rlink *l;
	dte_peer_t *peer;
	int rc;

	if (dconf_parse_hostport(n->addr, host, sizeof(host), &port) < 0 || !port) {
		DLOG_W("route: node %s: unusable address '%s'", node_label(n), n->addr);
		return -EINVAL;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	rc = dte_peer_connect(&r->ctx, host, port, &peer);
	if (rc < 0) {
		free(l);
		DLOG_W("route: connect to %s (%s): %s", node_label(n), n->addr, strerror(-rc));
		return rc;
	}
	l->r = r;
	l->peer = peer;
	l->outgoing = 1;
	dte_peer_set_data(peer, l);
	link_add(n, l);
	n->connecting = 1;
	if (n->state != N_UP)
		node_state(n, N_CONNECTING);
	DLOG_I("route: connecting to %s at %s", node_label(n), n->addr);
	return 0;
}

/* With release set, data is given, not copied: the record points at it
 * and gives it back once UCX is done (or the record is dropped); *given
 * says whether a record holds it now (else the caller gives it back). */
static int node_send(struct droute_ucx *r, struct rnode *n, unsigned type,
		     const uint8_t *hdr, size_t hlen, const void *data, size_t dlen,
		     droute_release_fn release, void *rarg, int *given)
{
	struct rlink *l = node_up_link(n);
	struct rmsg *m;
	int rc;

	if (!l && !n->connecting) {
		if (!n->addr[0])
			return -EHOSTUNREACH;
		if (n->last_fail_ns && uv_hrtime() - n->last_fail_ns < RECONNECT_NS)
			return -ECONNREFUSED;
	}
	if (!l && n->qbytes + hlen + dlen > r->p.queue_max_bytes)
		return -ENOBUFS;
	m = rmsg_alloc(hlen, release ? 0 : dlen);
	if (!m)
		return -ENOMEM;
	m->next = NULL;
	m->node = n;
	m->type = type;
	m->hlen = hlen;
	m->dlen = dlen;
	m->hdr = m->buf;
	m->release = release;
	m->rarg = rarg;
	if (release) {
		m->data = (uint8_t *)(uintptr_t)data;
		*given = 1;
	} else {
		m->data = m->buf + hlen;
		if (dlen)
			memcpy(m->data, data, dlen);
	}
	if (hlen)
		memcpy(m->hdr, hdr, hlen);
	if (l) {
		rc = link_send(l, m);
		if (rc < 0)
			rmsg_free(m);
		return rc;
	}
	if (n->q_tail)
		n->q_tail->next = m;
	else
		n->q_head = m;
	n->q_tail = m;
	n->nq++;
	n->qbytes += hlen + dlen;
	if (!n->connecting) {
		rc = node_connect(r, n);
		if (rc < 0) {
			node_drop_pending(r, n);
			return rc;
		}
	}
	return 0;
}

static int send_packed(struct droute_ucx *r, const char *node, const char *hostport,
		       unsigned type, const uint8_t *msg, size_t msglen, const void *data,
		       size_t len, droute_release_fn release, void *rarg, int *given)
{
	struct rnode *n;
	const uint8_t *hdr = msg, *d = data;
	size_t hlen = msglen, dlen = len;

	if (!r || r->closing || (!node && !hostport) || (msglen && !msg) || (len && !data))
		return -EINVAL;
	if (node && !*node)
		node = NULL;
	if (hostport && !*hostport)
		hostport = NULL;
	if (!node && !hostport)
		return -EINVAL;
	if (type < 1 || (type > TYPE_MAX && type != DROUTE_MSG_ADDR))
		return -EINVAL;
	if (has_data(type)) {
		if (msglen > r->hdr_cap)
			return -EMSGSIZE;
	} else {
		if (len)
			return -EINVAL;
		if (msglen > r->hdr_cap) {
			/* Too big for the AM header: the record is the data. */
			hdr = NULL;
			hlen = 0;
			d = msg;
			dlen = msglen;
		}
	}
	if (node) {
		if (strcmp(node, r->node) == 0)
			return -EINVAL;
		if (hostport && droute_ucx_learn(r, node, hostport) < 0)
			return -EINVAL;
		n = node_by_name(r, node);
		if (!n || (!n->addr[0] && !node_up_link(n))) {
			DLOG_W("route: %s to node %s: no connection and no address known",
			       droute_ucx_type_name(type), node);
			return -EHOSTUNREACH;
		}
	} else {
		if (dconf_parse_hostport(hostport, NULL, 0, NULL) < 0 ||
		    strlen(hostport) >= DROUTE_ADDR_MAX)
			return -EINVAL;
		if (strcmp(hostport, r->address) == 0)
			return -EINVAL;
		n = node_by_addr(r, hostport);
		if (!n && !(n = node_new(r, "", hostport)))
			return -ENOMEM;
	}
	return node_send(r, n, type, hdr, hlen, d, dlen, release, rarg, given);
}

int droute_ucx_send_packed(struct droute_ucx *r, const char *node, const char *hostport,
			   unsigned type, const uint8_t *msg, size_t msglen,
			   const void *data, size_t len)
{
	int given = 0;

	return send_packed(r, node, hostport, type, msg, msglen, data, len, NULL, NULL, &given);
}

int droute_ucx_send_given(struct droute_ucx *r, const char *node, const char *hostport,
			  unsigned type, const uint8_t *msg, size_t msglen, void *data,
			  size_t len, droute_release_fn release, void *rarg)
{
	int given = 0, rc;

	if (!release || !data || !len)
		rc = send_packed(r, node, hostport, type, msg, msglen, data, len, NULL, NULL,
				 &given);
	else
		rc = send_packed(r, node, hostport, type, msg, msglen, data, len, release, rarg,
				 &given);
	if (!given && release)
		release(data, rarg);
	return rc;
}

static int send_msg(struct droute_ucx *r, const char *node, const char *hostport, unsigned type,
		    const ProtobufCMessage *msg, const void *data, size_t len)
{
	uint8_t stackbuf[1024], *buf = stackbuf;
	size_t n;
	int rc;

	if (!msg)
		return -EINVAL;
	n = protobuf_c_message_get_packed_size(msg);
	if (n > sizeof(stackbuf) && !(buf = malloc(n)))
		return -ENOMEM;
	protobuf_c_message_pack(msg, buf);
	rc = droute_ucx_send_packed(r, node, hostport, type, buf, n, data, len);
	if (buf != stackbuf)
		free(buf);
	return rc;
}

int droute_ucx_send(struct droute_ucx *r, const char *node, unsigned type,
		    const ProtobufCMessage *msg, const void *data, size_t len)
{
	return node ? send_msg(r, node, NULL, type, msg, data, len) : -EINVAL;
}

int droute_ucx_send_addr(struct droute_ucx *r, const char *hostport, unsigned type,
			 const ProtobufCMessage *msg, const void *data, size_t len)
{
	return hostport ? send_msg(r, NULL, hostport, type, msg, data, len) : -EINVAL;
}

int droute_ucx_node_is_at(const struct droute_ucx *r, const char *node, const char *hostport)
{
	const struct rnode *n;

	if (!r || !node || !hostport || !*hostport)
		return 0;
	for (n = r->nodes; n; n = n->next)
		if (n->name[0] && !strcmp(n->name, node))
			return !strcmp(n->dialed, hostport) || !strcmp(n->addr, hostport);
	return 0;
}

int droute_ucx_learn(struct droute_ucx *r, const char *node, const char *hostport)
{
	struct rnode *n;

	if (!r || !node || !*node || !hostport || strlen(node) >= DROUTE_NODE_MAX ||
	    strlen(hostport) >= DROUTE_ADDR_MAX ||
	    dconf_parse_hostport(hostport, NULL, 0, NULL) < 0)
		return -EINVAL;
	if (strcmp(node, r->node) == 0)
		return 0;
	n = node_by_name(r, node);
	if (!n) {
		n = node_by_addr(r, hostport);
		if (n && !n->name[0])
			snprintf(n->name, sizeof(n->name), "%s", node);
		else if (!(n = node_new(r, node, hostport)))
			return -ENOMEM;
	}
	if (strcmp(n->addr, hostport)) {
		if (n->addr[0])
			DLOG_I("route: node %s moved from %s to %s", node, n->addr, hostport);
		snprintf(n->addr, sizeof(n->addr), "%s", hostport);
		n->last_fail_ns = 0;
	}
	return 0;
}

/* --- receiving --- */

static void deliver(struct droute_ucx *r, struct rnode *n, unsigned type,
		    const uint8_t *msg, size_t msglen, const void *data, size_t len)
{
	if (r->p.recv)
		r->p.recv(r->p.arg, n->name, type, msg, msglen, data, len);
}

static void on_recv(dte_peer_t *peer, unsigned type, const void *hdr, size_t hlen,
		    void *data, size_t len, void *arg)
{
	struct droute_ucx *r = arg;
	struct rlink *l = dte_peer_get_data(peer);
	struct rnode *n = l ? l->node : NULL;
	int staged = in_stage(r, data), arena = 0;
	const uint8_t *msg = hdr;
	size_t msglen = hlen, slen = 0;

	/* Memory on_alloc handed to UCX (a staging extent, or an arena piece
	 * for a large PAYLOAD) has a slot on the link; the slot says which. */
	if (l && (staged || len >= DROUTE_DIRECT_MIN))
		slen = slot_take(l, data, &arena);
	if (arena)
		r->lend_arena = data;	/* the engine may take it as it is */
	if (!n || l->stale) {
		r->st.bad++;
		goto out;
	}
	n->msgs_in++;
	n->bytes_in += hlen + len;
	if (type == DROUTE_MSG_ADDR) {
		char addr[DROUTE_ADDR_MAX];

		if (hlen == 0 || hlen >= sizeof(addr) || len) {
			r->st.bad++;
			goto out;
		}
		memcpy(addr, hdr, hlen);
		addr[hlen] = '\0';
		if (addr_taken(r, n, addr)) {
			/* Another live node holds that address (we reached it
			 * there, or it advertised it first): an advertisement must
			 * not take it over (droute_ucx_node_is_at trusts it). */
			r->st.bad++;
			DLOG_W("route: node %s advertised %s, where node %s answered; ignored", n->name,
			       addr, addr_taken(r, n, addr)->name);
		} else if (dconf_parse_hostport(addr, NULL, 0, NULL) == 0 && l->inc != n->incarnation) {
			/* Not (yet) the node's current incarnation: an address
			 * from it must not redirect our connects. */
			snprintf(l->addr, sizeof(l->addr), "%s", addr);
		} else if (droute_ucx_learn(r, n->name, addr) < 0) {
			r->st.bad++;
			DLOG_W("route: node %s advertised a malformed address", n->name);
		}
		goto out;
	}
	/* Records go to the engine as they land, in no particular order: a
	 * rendezvous PAYLOAD completes after later small records, and the
	 * engine takes payload parts before their COUNTS (peer protocol 2,
	 * docs/SYNC.md).  The router does not read what it carries. */
	if (has_data(type)) {
		deliver(r, n, type, msg, msglen, data, len);
		goto out;
	}
	if (hlen == 0 && len) {
		/* A record too large for the AM header came as the data. */
		msg = data;
		msglen = len;
	} else if (len) {
		r->st.bad++;
		DLOG_W("route: %s from %s carries %zu unexpected data bytes, dropped",
		       droute_ucx_type_name(type), n->name, len);
		goto out;
	}
	deliver(r, n, type, msg, msglen, NULL, 0);
out:
	if (staged) {
		if (slen)
			stage_free(r, data, slen);
		else
			DLOG_E("route: staged payload of unknown extent; staging shrinks");
	}
	if (staged)
		r->st.staged++;
	if (arena) {
		/* Not taken: back to its arena. */
		if (r->lend_arena == data)
			recvpool_free(data);
		r->lend_arena = NULL;
	}
}

void *droute_ucx_take(struct droute_ucx *r, const void *data)
{
	void *p = r ? dte_peer_take(&r->ctx, data) : NULL;

	if (!p && r && data && data == r->lend_arena) {
		p = r->lend_arena;	/* an arena piece: recvpool_free() gives it back */
		r->lend_arena = NULL;
	}
	if (p)
		r->st.handed++;
	return p;
}

static void *on_alloc(dte_peer_t *peer, unsigned type, const void *hdr, size_t hlen,
		      size_t len, void *arg)
{
	struct droute_ucx *r = arg;
	struct rlink *l = dte_peer_get_data(peer);
	struct rslot *s;
	void *p;

	if (!l || !l->node)
		return NULL;
	/* A large part gets memory of its own (the peer layer's malloc),
	 * which the engine keeps as it is: staging it would cost a copy of
	 * every byte to free the extent again. */
	if (has_data(type) && len >= DROUTE_DIRECT_MIN) {
		r->st.direct++;
		/* A fresh sink's dense version: memory faulted in ahead. */
		if (!(p = recvpool_get(len)) || !(s = malloc(sizeof(*s)))) {
			recvpool_free(p);
			return NULL;
		}
		*s = (struct rslot){ .next = l->inflight, .p = p, .len = len, .arena = 1 };
		l->inflight = s;
		return p;
	}
	if (len < STAGE_MIN || !r->stage)
		return NULL;
	s = malloc(sizeof(*s));
	if (!s)
		return NULL;
	p = stage_alloc(r, len);
	if (!p) {
		free(s);
		return NULL;
	}
	*s = (struct rslot){ .next = l->inflight, .p = p, .len = len, .arena = 0 };
	l->inflight = s;
	return p;
}

/* --- link lifecycle --- */

static void send_addr(struct droute_ucx *r, struct rlink *l)
{
	if (!r->address[0])
		return;
	if (dte_peer_send(l->peer, DROUTE_MSG_ADDR, r->address, strlen(r->address), NULL, 0,
			  NULL, NULL) == 0) {
		l->node->msgs_out++;
		l->node->bytes_out += strlen(r->address);
	}
}

/* A node came back under a new incarnation and the old one has no live
 * link left: what the old daemon knew is gone, so the engine hears "down"
 * once, before any record of the new one is used. */
static void node_restarted(struct droute_ucx *r, struct rnode *n, uint64_t inc)
{
	struct rlink *l;

	r->st.restarts++;
	DLOG_N("route: node %s restarted (incarnation %016llx -> %016llx)", n->name,
	       (unsigned long long)n->incarnation, (unsigned long long)inc);
	for (l = n->links; l; l = l->next) {
		if (l->inc == inc || l->stale || !l->up)
			continue;
		l->stale = 1;
		dte_peer_close(l->peer);   /* -EALREADY when already closing */
	}
	/* Told already when the old one went down before the new one came. */
	if (r->p.down && !n->down_told)
		r->p.down(r->p.arg, n->name, "restarted");
}

static void on_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	struct droute_ucx *r = ctx->data;
	struct rlink *l = dte_peer_get_data(peer);
	const char *name = dte_peer_name(peer);
	uint64_t inc = dte_peer_id(peer);
	struct rnode *n, *target;

	if (!l) {
		l = calloc(1, sizeof(*l));
		if (!l) {
			DLOG_E("route: out of memory for a link from %s", name);
			dte_peer_close(peer);
			return;
		}
		l->r = r;
		l->peer = peer;
		dte_peer_set_data(peer, l);
	}
	target = l->node;
	if (!name[0] || strcmp(name, r->node) == 0) {
		DLOG_E("route: a peer greeted us as '%s', %s; closed", name,
		       name[0] ? "our own node name (two daemons share it?)" : "no name");
		l->stale = 1;
		dte_peer_close(peer);
		return;
	}
	if (target && target->name[0] && strcmp(target->name, name)) {
		DLOG_E("route: %s answers as node %s, not %s; check the address book", target->addr,
		       name, target->name);
		l->stale = 1;
		dte_peer_close(peer);
		return;
	}
	n = node_by_name(r, name);
	if (target && l->outgoing && target->addr[0]) {
		/* We connected to this address and it greeted as `name`. */
		if (n)
			snprintf(n->dialed, sizeof(n->dialed), "%s", target->addr);
		snprintf(target->dialed, sizeof(target->dialed), "%s", target->addr);
	}
	if (target && !target->name[0]) {
		if (n && n != target) {
			struct rnode **pp;

			/* Connected by address to a node we already knew by name:
			 * fold the pending node (its queue, this link) into it. */
			link_unlink(l);
			if (target->q_head) {
				if (n->q_tail)
					n->q_tail->next = target->q_head;
				else
					n->q_head = target->q_head;
				n->q_tail = target->q_tail;
				for (struct rmsg *m = target->q_head; m; m = m->next)
					m->node = n;
				n->nq += target->nq;
				n->qbytes += target->qbytes;
			}
			if (!n->addr[0])
				snprintf(n->addr, sizeof(n->addr), "%s", target->addr);
			for (pp = &r->nodes; *pp; pp = &(*pp)->next) {
				if (*pp == target) {
					*pp = target->next;
					break;
				}
			}
			while (target->links) {
				struct rlink *o = target->links;

				target->links = o->next;
				link_add(n, o);
			}
			n->connecting = 1;
			free(target);
			link_add(n, l);
		} else {
			snprintf(target->name, sizeof(target->name), "%s", name);
			n = target;
		}
	}
	if (!n && !(n = node_new(r, name, ""))) {
		DLOG_E("route: out of memory for node %s", name);
		l->stale = 1;
		dte_peer_close(peer);
		return;
	}
	if (!l->node)
		link_add(n, l);
	l->inc = inc;
	l->up = 1;
	if (l->outgoing)
		n->connecting = 0;
	if (n->incarnation && n->incarnation != inc) {
		if (node_up_link(n)) {
			/* The current incarnation still answers: a restart whose
			 * old links have not failed yet, or someone using its
			 * name.  Records from this link are taken (the engine
			 * checks job tokens); ours keep going to the current one
			 * until its last link goes. */
			DLOG_N("route: node %s: a second incarnation (%016llx) connected while "
			       "%016llx is up; it takes over when the old links go", n->name,
			       (unsigned long long)inc, (unsigned long long)n->incarnation);
			send_addr(r, l);
			return;
		}
		node_restarted(r, n, inc);
	}
	n->incarnation = inc;
	n->down_told = 0;
	n->last_fail_ns = 0;
	node_state(n, N_UP);
	DLOG_I("route: node %s up (%s link)", n->name, l->outgoing ? "outgoing" : "accepted");
	send_addr(r, l);
	node_flush(n, l);
}

static void on_down(dte_peer_ctx_t *ctx, dte_peer_t *peer, int status, const char *reason)
{
	struct droute_ucx *r = ctx->data;
	struct rlink *l = dte_peer_get_data(peer), *o;
	struct rnode *n;
	int was_up, stale;
	uint64_t lost;

	if (!l)
		return;
	dte_peer_set_data(peer, NULL);
	slots_release(r, l);
	n = l->node;
	was_up = l->up;
	stale = l->stale;
	link_unlink(l);
	if (n && l->outgoing && !was_up)
		n->connecting = 0;
	free(l);
	if (!n || stale || r->closing)
		return;
	if (node_up_link(n))
		return;
	if ((o = node_other_link(n))) {
		/* The old incarnation's last link went: the new one takes over. */
		node_restarted(r, n, o->inc);
		n->incarnation = o->inc;
		n->down_told = 0;
		if (o->addr[0])
			droute_ucx_learn(r, n->name, o->addr);
		node_state(n, N_UP);
		node_flush(n, o);
		return;
	}
	for (o = n->links; o; o = o->next)
		if (!o->stale && o->outgoing && !o->up)
			return;        /* our own connect may still succeed */
	if (!was_up)
		n->last_fail_ns = uv_hrtime();
	lost = node_drop_pending(r, n);
	node_state(n, N_DOWN);
	if (was_up || lost)
		DLOG_N("route: node %s down: %s%s", node_label(n), reason,
		       lost ? " (records lost)" : "");
	else
		DLOG_W("route: cannot reach node %s: %s", node_label(n), reason);
	n->down_told = 1;
	if (r->p.down)
		r->p.down(r->p.arg, node_label(n), reason);
}

/* --- timer: pooled part copies given back when parts stop going out --- */

static void on_timer(uv_timer_t *t)
{
	(void)t;
	if (!msgs_pooled)
		bpool_trim(&msg_pool);	/* no part went out since the last tick's check */
}

/* --- init / close --- */

static int is_wildcard(const char *a)
{
	return !a || !*a || !strcmp(a, "0.0.0.0") || !strcmp(a, "::") || !strcmp(a, "[::]");
}

/* First non-loopback IPv4 address that is up, else 127.0.0.1. */
static void host_address(char *buf, size_t len)
{
	struct ifaddrs *ifa, *i;

	snprintf(buf, len, "127.0.0.1");
	if (getifaddrs(&ifa) < 0)
		return;
	for (i = ifa; i; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
		    (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
			continue;
		inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf,
			  (socklen_t)len);
		break;
	}
	freeifaddrs(ifa);
}

static void peer_log(int level, const char *msg, void *user)
{
	dlog(level <= LOG_ERR ? DLOG_ERROR : level >= LOG_DEBUG ? DLOG_DEBUG : (enum dlog_level)level,
	     "peer: %s", msg);
}

int droute_ucx_listen(struct droute_ucx *r, const char *listen_address, uint16_t listen_port,
		      const char *advertise)
{
	uint16_t bound = 0;
	int rc;

	if (!r || !listen_address || !*listen_address)
		return -EINVAL;
	if (r->address[0])
		return -EALREADY;
	rc = dte_peer_listen(&r->ctx, listen_address, listen_port, &bound);
	if (rc < 0) {
		/* Not logged: the caller reports it (main.c: once, with the
		 * fix, then a debug line per retry). */
		snprintf(r->listen_error, sizeof(r->listen_error), "cannot bind %s:%u: %s",
			 listen_address, listen_port, strerror(-rc));
		return rc;
	}
	r->listen_error[0] = '\0';
	if (advertise && *advertise) {
		snprintf(r->address, sizeof(r->address), "%s", advertise);
	} else {
		char host[64];

		if (is_wildcard(listen_address))
			host_address(host, sizeof(host));
		else
			snprintf(host, sizeof(host), "%s", listen_address);
		snprintf(r->address, sizeof(r->address), strchr(host, ':') ? "[%s]:%u" : "%s:%u",
			 host, bound);
	}
	return 0;
}

int droute_ucx_init(struct droute_ucx **out, uv_loop_t *loop, const struct droute_ucx_params *p)
{
	dte_peer_params_t pp = {
		.field_mask = DTE_PEER_PARAM_FIELD_NODE_ID | DTE_PEER_PARAM_FIELD_NODE_NAME |
			      DTE_PEER_PARAM_FIELD_UP_CB | DTE_PEER_PARAM_FIELD_DOWN_CB |
			      DTE_PEER_PARAM_FIELD_LOG_CB,
		.up_cb = on_up,
		.down_cb = on_down,
		.log_cb = peer_log,
	};
	struct droute_ucx *r;
	unsigned type;
	int rc;

	if (!out || !loop || !p || !p->node || !*p->node || strlen(p->node) >= DROUTE_NODE_MAX ||
	    (p->advertise && *p->advertise &&
	     (strlen(p->advertise) >= DROUTE_ADDR_MAX ||
	      dconf_parse_hostport(p->advertise, NULL, 0, NULL) < 0)))
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->loop = loop;
	r->p = *p;
	if (!r->p.queue_max_bytes)
		r->p.queue_max_bytes = (size_t)1 << 30;
	snprintf(r->node, sizeof(r->node), "%s", p->node);
	r->p.node = r->node;
	r->p.listen_address = r->p.advertise = NULL;

	/* A fresh incarnation at every start tells peers we restarted. */
	pp.node_id = XXH3_64bits_withSeed(r->node, strlen(r->node), uv_hrtime() ^ (uint64_t)getpid());
	pp.node_name = r->node;
	rc = dte_peer_ctx_init(&r->ctx, loop, &pp);
	if (rc < 0) {
		DLOG_E("route: UCX context: %s", strerror(-rc));
		free(r);
		return rc;
	}
	r->ctx.data = r;
	r->ctx_up = 1;
	/* The header cap: the peer layer's, or less where UCX allows less
	 * (8 bytes of it are the layer's own wire header). */
	r->hdr_cap = DTE_PEER_HEADER_MAX;
	if (r->ctx.max_am_header < r->hdr_cap + 8)
		r->hdr_cap = r->ctx.max_am_header > 8 ? r->ctx.max_am_header - 8 : 0;
	for (type = 1; type <= TYPE_MAX; type++)
		dte_peer_handler_set(&r->ctx, type, on_recv,
				     has_data(type) ? on_alloc : NULL, r);
	dte_peer_handler_set(&r->ctx, DROUTE_MSG_ADDR, on_recv, NULL, r);

	if (p->listen_address && *p->listen_address &&
	    (rc = droute_ucx_listen(r, p->listen_address, p->listen_port, p->advertise)) < 0)
		goto fail;
	if (p->staging_bytes) {
		r->stage = mmap(NULL, p->staging_bytes, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (r->stage == MAP_FAILED) {
			r->stage = NULL;
			rc = -errno;
			DLOG_E("route: staging of %zu bytes: %s", p->staging_bytes, strerror(errno));
			goto fail;
		}
		r->stage_len = p->staging_bytes;
		rc = dte_peer_mem_map(&r->ctx, r->stage, r->stage_len, &r->stage_mem);
		if (rc < 0) {
			DLOG_E("route: registering %zu staging bytes: %s", r->stage_len,
			       strerror(-rc));
			goto fail;
		}
		r->free_ext = calloc(1, sizeof(*r->free_ext));
		if (!r->free_ext) {
			rc = -ENOMEM;
			goto fail;
		}
		r->free_ext->len = r->stage_len;
	}
	uv_timer_init(loop, &r->timer);
	r->timer.data = r;
	r->timer_open = 1;
	uv_timer_start(&r->timer, on_timer, 1000, 1000);
	uv_unref((uv_handle_t *)&r->timer);
	DLOG_I("route: node %s, peers reach it at %s, %zu staging bytes", r->node,
	       r->address[0] ? r->address : "(no listener)", r->stage_len);
	*out = r;
	return 0;

fail:
	/* Nothing is connected yet: closing the context completes within a
	 * few loop turns; the caller's fini runs the loop. */
	droute_ucx_close(r, NULL, NULL);
	return rc;
}

static void router_free(struct droute_ucx *r)
{
	struct rnode *n;
	struct rfree *f;
	void (*cb)(void *) = r->close_cb;
	void *arg = r->close_arg;

	while ((n = r->nodes)) {
		r->nodes = n->next;
		node_state(n, N_DOWN);
		node_drop_pending(r, n);
		free(n);
	}
	while ((f = r->free_ext)) {
		r->free_ext = f->next;
		free(f);
	}
	if (r->stage)
		munmap(r->stage, r->stage_len);
	if (daemon_router == r)
		daemon_router = NULL;
	free(r);
	if (cb)
		cb(arg);
}

static void maybe_done(struct droute_ucx *r)
{
	if (!r->ctx_up && !r->timer_open)
		router_free(r);
}

static void on_timer_closed(uv_handle_t *h)
{
	struct droute_ucx *r = h->data;

	r->timer_open = 0;
	maybe_done(r);
}

static void on_ctx_closed(dte_peer_ctx_t *ctx)
{
	struct droute_ucx *r = ctx->data;

	/* peer_ctx_finish unmapped the staging registration already. */
	r->ctx_up = 0;
	maybe_done(r);
}

void droute_ucx_close(struct droute_ucx *r, void (*cb)(void *arg), void *arg)
{
	if (!r || r->closing)
		return;
	r->closing = 1;
	r->close_cb = cb;
	r->close_arg = arg;
	if (r->timer_open) {
		uv_timer_stop(&r->timer);
		uv_close((uv_handle_t *)&r->timer, on_timer_closed);
	}
	if (r->ctx_up) {
		if (dte_peer_ctx_close(&r->ctx, on_ctx_closed) < 0)
			r->ctx_up = 0;
	}
	if (!r->ctx_up && !r->timer_open)
		router_free(r);
}

/* --- queries --- */

const char *droute_ucx_node(const struct droute_ucx *r)
{
	return r ? r->node : "";
}

const char *droute_ucx_listen_error(const struct droute_ucx *r, uint64_t *tries)
{
	if (tries)
		*tries = r ? r->listen_tries : 0;
	return r ? r->listen_error : "";
}

void droute_ucx_listen_failed(struct droute_ucx *r, const char *why, uint64_t tries)
{
	if (!r)
		return;
	snprintf(r->listen_error, sizeof(r->listen_error), "%s", why);
	r->listen_tries = tries;
}

const char *droute_ucx_address(const struct droute_ucx *r)
{
	return r ? r->address : "";
}

size_t droute_ucx_peers(const struct droute_ucx *r, struct droute_peer_info *out, size_t max)
{
	static const char *const names[] = { "down", "connecting", "up" };
	const struct rnode *n;
	const struct rlink *l;
	size_t i = 0;

	if (!r)
		return 0;
	for (n = r->nodes; n; n = n->next, i++) {
		struct droute_peer_info *o;

		if (i >= max)
			continue;
		o = &out[i];
		memset(o, 0, sizeof(*o));
		snprintf(o->node, sizeof(o->node), "%s", n->name);
		snprintf(o->address, sizeof(o->address), "%s", n->addr);
		o->state = names[n->state];
		for (l = n->links; l; l = l->next)
			o->links += l->up && !l->stale;
		o->msgs_in = n->msgs_in;
		o->bytes_in = n->bytes_in;
		o->msgs_out = n->msgs_out;
		o->bytes_out = n->bytes_out;
		o->queued = n->nq;
		o->dropped = n->dropped;
		o->since_ns = n->since_ns;
		o->incarnation = n->incarnation;
	}
	return i;
}

unsigned droute_ucx_peers_up(const struct droute_ucx *r)
{
	const struct rnode *n;
	unsigned k = 0;

	if (!r)
		return 0;
	for (n = r->nodes; n; n = n->next)
		k += n->state == N_UP;
	return k;
}

void droute_ucx_stats(const struct droute_ucx *r, struct droute_ucx_stats *out)
{
	if (r && out)
		*out = r->st;
}

const dte_peer_ctx_t *droute_ucx_ctx(const struct droute_ucx *r)
{
	return r ? &r->ctx : NULL;
}


void droute_ucx_set_handlers(struct droute_ucx *r, droute_recv_fn recv, droute_down_fn down,
			     void *arg)
{
	if (!r)
		return;
	r->p.recv = recv;
	r->p.down = down;
	r->p.arg = arg;
}
