/* tests/faults/testhook.c — env-gated fault injection (see testhook.h); test
 * build only. */
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/route.h"
#include "tests/faults/testhook.h"

enum fault {
	F_NONE,
	F_DIE_COUNTS,
	F_DIE_PAYLOAD,
	F_CORRUPT,
	F_DUP,
	F_REORDER,
	F_CAPTURE_STALL,
	F_WRONG_VALUE,
	F_DROP_JOIN,
	F_DROP_PLAN,
	F_STORAGE_READ_STALL,
	F_WRONG_DROP,
	F_SKIP_WRITE,
	F_DIE_RELAY,
};

static const struct {
	const char *name;
	enum fault f;
} faults[] = {
	{ "die-in-counts", F_DIE_COUNTS },
	{ "die-in-payload", F_DIE_PAYLOAD },
	{ "corrupt-payload", F_CORRUPT },
	{ "dup", F_DUP },
	{ "reorder", F_REORDER },
	{ "capture-stall", F_CAPTURE_STALL },
	{ "wrong-value", F_WRONG_VALUE },
	{ "drop-join", F_DROP_JOIN },
	{ "drop-plan", F_DROP_PLAN },
	{ "storage-read-stall", F_STORAGE_READ_STALL },
	{ "wrong-drop", F_WRONG_DROP },
	{ "skip-write", F_SKIP_WRITE },
	{ "die-in-relay", F_DIE_RELAY },
};

struct held {
	char from[64];
	Dtep__PeerMsgType type;
	uint8_t *hdr;
	size_t hdrlen;
	uint8_t *data;
	size_t len;
};

static struct {
	enum fault fault;
	uint64_t first, period;
	uv_loop_t *loop;
	int dying;
	uint64_t seen_version;   /* counts hits within one version */
	unsigned seen;
	uint64_t corrupted;      /* last version corrupted (once each) */
	struct held *held;
	uint64_t ctl_sent;       /* drop-join: remote JOINs so far */
	uint64_t relay_armed;    /* die-in-relay: the version whose first record came */
} th;

/* Outside th: th is reset at init, a handle the loop knows must not be. */
static uv_timer_t timer;
static int timer_init;

static int version_hit(uint64_t v)
{
	if (v < th.first)
		return 0;
	return th.period ? (v - th.first) % th.period == 0 : v == th.first;
}

/* The version a data-path record belongs to; 0 for the other types. */
static uint64_t record_version(Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen)
{
	uint64_t v = 0;

	switch (type) {
	case DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS: {
		Dtep__Counts *m = dtep__counts__unpack(NULL, hdrlen, hdr);

		if (m) {
			v = m->version;
			dtep__counts__free_unpacked(m, NULL);
		}
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD: {
		Dtep__Payload *m = dtep__payload__unpack(NULL, hdrlen, hdr);

		if (m) {
			v = m->version;
			dtep__payload__free_unpacked(m, NULL);
		}
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_STAGED: {
		Dtep__Staged *m = dtep__staged__unpack(NULL, hdrlen, hdr);

		if (m) {
			v = m->version;
			dtep__staged__free_unpacked(m, NULL);
		}
		break;
	}
	case DTEP__PEER_MSG_TYPE__PEER_MSG_APPLIED: {
		Dtep__Applied *m = dtep__applied__unpack(NULL, hdrlen, hdr);

		if (m) {
			v = m->version;
			dtep__applied__free_unpacked(m, NULL);
		}
		break;
	}
	default:
		break;
	}
	return v;
}

static void held_free(struct held *h)
{
	if (!h)
		return;
	free(h->hdr);
	free(h->data);
	free(h);
}

static void held_flush(void)
{
	struct held *h = th.held;

	if (!h)
		return;
	th.held = NULL;
	route_receive(h->from, h->type, h->hdr, h->hdrlen, h->data, h->len);
	held_free(h);
}

static void on_timer(uv_timer_t *t)
{
	if (th.dying) {
		DLOG_W("test hook: SIGKILL now");
		raise(SIGKILL);
		return;
	}
	held_flush();
}

int testhook_init(uv_loop_t *loop)
{
	const char *env = getenv("DTE_TEST_HOOK");
	const char *at;
	char *end;
	size_t i, n;

	held_free(th.held);
	memset(&th, 0, sizeof(th));
	if (timer_init)
		uv_timer_stop(&timer);   /* a second init reuses it */
	if (!env || !*env)
		return 0;
	at = strchr(env, '@');
	n = at ? (size_t)(at - env) : strlen(env);
	for (i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		if (strlen(faults[i].name) == n && !strncmp(env, faults[i].name, n))
			th.fault = faults[i].f;
	if (th.fault == F_NONE || !at) {
		/* Refused, not ignored: a test whose hook name is misspelt
		 * must not run fault-free and pass. */
		DLOG_E("test hook: refusing DTE_TEST_HOOK=\"%s\" (want <fault>@<version>[/<period>], "
		       "<fault> one of die-in-counts die-in-payload corrupt-payload dup reorder "
		       "capture-stall wrong-value drop-join drop-plan storage-read-stall wrong-drop skip-write "
		       "die-in-relay)", env);
		th.fault = F_NONE;
		return -1;
	}
	th.first = strtoull(at + 1, &end, 10);
	if (*end == '/') {
		const char *p = end + 1;

		th.period = strtoull(p, &end, 10);
		if (end == p || !th.period)
			end = (char *)p - 1;   /* "V/" or "V/0": refuse below */
	}
	if (*end || !th.first || at[1] < '0' || at[1] > '9') {
		DLOG_E("test hook: refusing DTE_TEST_HOOK=\"%s\" (bad version)", env);
		th.fault = F_NONE;
		return -1;
	}
	if (!timer_init) {
		if (uv_timer_init(loop, &timer) < 0)
			return -1;
		timer_init = 1;
	}
	th.loop = loop;
	DLOG_W("test hook armed: %s", env);
	return 0;
}

void testhook_fini(void)
{
	/* Shutting down: the engine is going away, so drop rather than deliver. */
	held_free(th.held);
	th.held = NULL;
	if (timer_init) {
		uv_timer_stop(&timer);
		uv_close((uv_handle_t *)&timer, NULL);
		timer_init = 0;
	}
	th.fault = F_NONE;
}

int testhook_send(Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen)
{
	Dtep__PeerMsgType want;
	uint64_t v;

	if (th.dying)
		return 1;
	if (th.fault == F_DROP_JOIN && type == DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN) {
		/* The n-th remote JOIN is lost on the way (a dying link): the
		 * retry must bring membership together anyway. */
		if (!version_hit(++th.ctl_sent))
			return 0;
		DLOG_W("test hook: drop-join: JOIN #%llu dropped", (unsigned long long)th.ctl_sent);
		return 1;
	}
	if (th.fault == F_DROP_PLAN && type == DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN) {
		/* The first PLAN of the coordinator's n-th plan (its term's
		 * counter) is lost: nothing newer supersedes it, so only the
		 * retry can deliver it. */
		Dtep__Plan *m = dtep__plan__unpack(NULL, hdrlen, hdr);
		uint64_t term = m ? m->epoch : 0, n = term & ((1ull << 24) - 1);

		if (m)
			dtep__plan__free_unpacked(m, NULL);
		if (!n || !version_hit(n) || th.corrupted == term)
			return 0;
		th.corrupted = term;
		DLOG_W("test hook: drop-plan: PLAN of plan %llu (term %llx) dropped",
		       (unsigned long long)n, (unsigned long long)term);
		return 1;
	}
	if (th.fault == F_DIE_RELAY) {
		/* A relay dies mid-version: its first RELAYED of the version
		 * goes, the rest (and everything else) never does. */
		if (type != DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED || !th.relay_armed ||
		    ++th.seen < 2)
			return 0;
		DLOG_W("test hook: die-in-relay at version %llu: dropping every send, SIGKILL in "
		       "300 ms", (unsigned long long)th.relay_armed);
		th.dying = 1;
		uv_timer_start(&timer, on_timer, 300, 0);
		return 1;
	}
	if (th.fault != F_DIE_COUNTS && th.fault != F_DIE_PAYLOAD)
		return 0;
	want = th.fault == F_DIE_COUNTS ? DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS
					: DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD;
	if (type != want)
		return 0;
	v = record_version(type, hdr, hdrlen);
	if (!version_hit(v))
		return 0;
	if (v != th.seen_version) {
		th.seen_version = v;
		th.seen = 0;
	}
	if (++th.seen < 2)
		return 0;
	DLOG_W("test hook: %s at version %llu: dropping every send, SIGKILL in 300 ms",
	       th.fault == F_DIE_COUNTS ? "die-in-counts" : "die-in-payload",
	       (unsigned long long)v);
	th.dying = 1;
	uv_timer_start(&timer, on_timer, 300, 0);
	return 1;
}

static int hold(const char *from, Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen,
		const void *data, size_t len)
{
	struct held *h = calloc(1, sizeof(*h));

	if (!h)
		return 0;
	snprintf(h->from, sizeof(h->from), "%s", from ? from : "");
	h->type = type;
	h->hdr = malloc(hdrlen ? hdrlen : 1);
	h->data = len ? malloc(len) : NULL;
	if (!h->hdr || (len && !h->data)) {
		held_free(h);
		return 0;     /* no memory: deliver in order rather than lose it */
	}
	memcpy(h->hdr, hdr, hdrlen);
	h->hdrlen = hdrlen;
	if (len)
		memcpy(h->data, data, len);
	h->len = len;
	th.held = h;
	uv_timer_start(&timer, on_timer, 50, 0);
	return 1;
}

int testhook_deliver(const char *from_node, Dtep__PeerMsgType type, const uint8_t *hdr,
		     size_t hdrlen, const void *data, size_t len)
{
	uint64_t v;

	if (th.fault == F_DIE_RELAY && !th.relay_armed) {
		/* From the sources, or relayed from a parent: its version. */
		v = record_version(type, hdr, hdrlen);
		if (type == DTEP__PEER_MSG_TYPE__PEER_MSG_RELAYED) {
			Dtep__Relayed *r = dtep__relayed__unpack(NULL, hdrlen, hdr);

			if (r && r->record_len && r->record_len <= len)
				v = record_version((Dtep__PeerMsgType)r->type,
						   (const uint8_t *)data + len - r->record_len,
						   r->record_len);
			if (r)
				dtep__relayed__free_unpacked(r, NULL);
		}
		if (v && version_hit(v))
			th.relay_armed = v;
	}
	if (th.fault != F_CORRUPT && th.fault != F_DUP && th.fault != F_REORDER)
		return 0;
	if (th.fault == F_REORDER && th.held) {
		/* The newcomer overtakes the held record. */
		uv_timer_stop(&timer);
		route_receive(from_node, type, hdr, hdrlen, data, len);
		held_flush();
		return 1;
	}
	v = record_version(type, hdr, hdrlen);
	if (!v || !version_hit(v))
		return 0;
	switch (th.fault) {
	case F_CORRUPT: {
		uint8_t *copy;

		if (type != DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD || !len || th.corrupted == v)
			return 0;
		copy = malloc(len);
		if (!copy)
			return 0;
		memcpy(copy, data, len);
		copy[len / 2] ^= 0x5a;
		th.corrupted = v;
		DLOG_W("test hook: corrupt-payload: version %llu byte %zu of %zu from %s flipped",
		       (unsigned long long)v, len / 2, len, from_node);
		route_receive(from_node, type, hdr, hdrlen, copy, len);
		free(copy);
		return 1;
	}
	case F_DUP:
		DLOG_W("test hook: dup: version %llu record type %d from %s twice",
		       (unsigned long long)v, (int)type, from_node);
		route_receive(from_node, type, hdr, hdrlen, data, len);
		route_receive(from_node, type, hdr, hdrlen, data, len);
		return 1;
	case F_REORDER:
		if (!hold(from_node, type, hdr, hdrlen, data, len))
			return 0;
		DLOG_W("test hook: reorder: version %llu record type %d from %s held back",
		       (unsigned long long)v, (int)type, from_node);
		return 1;
	default:
		return 0;
	}
}

int testhook_sink_value(uint64_t version)
{
	if (th.fault != F_WRONG_VALUE || !version_hit(version) || th.corrupted == version)
		return 0;
	th.corrupted = version;
	DLOG_W("test hook: wrong-value: version %llu: one staged value flipped",
	       (unsigned long long)version);
	return 1;
}

int testhook_apply_select(uint64_t version)
{
	static uint64_t skipped;

	if (th.fault != F_SKIP_WRITE || !version_hit(version) || skipped == version)
		return 0;
	skipped = version;
	DLOG_W("test hook: skip-write: version %llu: one element of the apply not written",
	       (unsigned long long)version);
	return 1;
}

int testhook_capture_wrong_drop(uint64_t version)
{
	/* Worker thread: read-only state, no log (like capture-stall). */
	return th.fault == F_WRONG_DROP && version_hit(version);
}

void testhook_capture(uint64_t version)
{
	const char *release = getenv("DTE_TEST_HOOK_RELEASE");
	struct timespec tick = { 0, 10 * 1000 * 1000 };

	if (th.fault != F_CAPTURE_STALL || !version_hit(version))
		return;
	/* Worker thread: th is read-only once init has run, and nothing here
	 * logs (the log module belongs to the loop thread).  The test learns
	 * the capture has started and is held from <release>.held.<version>,
	 * written before the wait. */
	if (release) {
		char held[4096];
		FILE *f;

		snprintf(held, sizeof(held), "%s.held.%llu", release, (unsigned long long)version);
		if ((f = fopen(held, "w")))
			fclose(f);
	}
	for (int i = 0; i < 6000; i++) {
		if (release && access(release, F_OK) == 0)
			return;
		nanosleep(&tick, NULL);
	}
}

/* storage-read-stall: the last version held (worker threads). */
static uint64_t read_held;

void testhook_storage_read(uint64_t version)
{
	const char *release = getenv("DTE_TEST_HOOK_RELEASE");
	struct timespec tick = { 0, 10 * 1000 * 1000 };

	if (th.fault != F_STORAGE_READ_STALL || !version_hit(version) ||
	    __atomic_exchange_n(&read_held, version, __ATOMIC_RELAXED) == version)
		return;
	/* Worker thread: no log.  The test learns the read is held from
	 * <release>.held.<version>, written before the wait; the release
	 * file is taken (removed) when it lets the read go, so the next
	 * version's read is held again. */
	if (release) {
		char held[4096];
		FILE *f;

		snprintf(held, sizeof(held), "%s.held.%llu", release, (unsigned long long)version);
		if ((f = fopen(held, "w")))
			fclose(f);
	}
	for (int i = 0; i < 6000; i++) {
		if (release && access(release, F_OK) == 0) {
			unlink(release);
			return;
		}
		nanosleep(&tick, NULL);
	}
}
