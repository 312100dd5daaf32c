/* tests/unit/test_fixture_explore.c — a seeded schedule explorer on the
 * deterministic multi-engine fixture (tests/unit/fixture.h; issue 31).
 *
 * The nodes of test_fixture.c (node0: coordinator and a Megatron TP=1
 * trainer stepping AdamW; node1, node2: an SGLang TP=1 inference engine
 * each), then per seed a random sequence of actions (ACTIONS_MIN..MAX):
 *  - publish: the trainer steps AdamW and publishes the next version;
 *  - apply: a random attached sink applies the newest version it staged;
 *  - run: 1..RUN_MAX fixture steps;
 *  - partition: a node is cut off (records to and from it lost), and half
 *    the time both ends hear the link go down (fix_node_down); heal: every
 *    partition ends;
 *  - leave: a sink detaches (job_detach) or its connection closes
 *    (job_conn_gone: its buffers go with it); join: a detached sink
 *    attaches again, a quarter of the time as the other sink's replica
 *    (refused while that one holds it);
 *  - restart: a node's engine is freed as a process ends (no detach, no
 *    LEAVE) and a new one made on the same I/O slot; every node keeps its
 *    jobs in a temporary job_state_dir (job_persist.c, as main.c wires
 *    it), so the new engine creates the job again under a new boot; the
 *    client reconnects, registers the same memory again and attaches.
 *    The coordinator (with the trainer's source) restarts too.
 * The transport duplicates and reorders records meanwhile (FX_DUP,
 * FX_REORDER; FX_DROP loses them).  Odd seeds relay (issue 34): every
 * engine runs with relay_fanout 1, so replica 0's sink forwards what it
 * verified to replica 1's through all of the above, under the same
 * invariants (`fixture-explore: relay_schedules=.. relayed_bytes=N`, required
 * above 0).
 *
 * Before every step (and so after every one), whatever runs:
 *  (a) every sink's memory is a whole version: its hash (XXH3 over the
 *      buffers) is that of RNE(θ_v) for a published v, computed when v
 *      was published through the independent mapping (fixture_sync.c), or
 *      of the zeros it started with; and a sink that applied v holds v;
 *  (b) per attached sink, applied <= staged (job_query_version);
 *  (c) terms only grow, as docs/SYNC.md "Terms, acknowledgements and
 *      restarts" orders them: the plan term each node holds (job.epoch)
 *      and the coordinator's newest (job.coord_epoch) never go to a lower
 *      counter of the same boot nor back to a boot they left; a member
 *      only holds a boot some coordinator drew.  A restarted node's own
 *      view starts afresh (its job is new: a new boot, nothing retired).
 * After the sequence: every fault heals (none from here), the sinks
 * attach again as their own replicas, the job must become complete with
 * every pair planned, and a version published then (and the next ones, if
 * a sink refused it) must be staged everywhere and applied exactly: every
 * element checked (sink_violations).
 *
 * A sink refusing a whole version is no violation: a PAYLOAD part that
 * comes twice is refused ("part N twice"), as test_fixture.c counts, and
 * the next version repairs it; they are counted (the sinks' job.refused).
 *
 * Also exercised: a sink parked in wait_staged (the next version may go
 * on arrival into its weights: while parked, its memory is not checked;
 * once wait_staged answers it must be whole again, and a sink that applied
 * v may hold a later version staged in place), and a parked client whose
 * connection closes (not read until it attaches again).
 *
 * What it found:
 *  - A partition nobody hears go down, longer than the coordinator's PLAN
 *    deadline (PEER_PLAN_DEADLINE_MS, 60 s), never heals by itself: the
 *    member's JOIN was acknowledged by an earlier PLAN (no JOIN retry),
 *    the coordinator gave the new PLAN up at its deadline ("its JOIN retry
 *    or its going down takes over": neither comes), and no timer is left
 *    armed; the member holds the old term until some other membership
 *    change re-plans, and every version to it is refused as stale.
 *    FX_SILENT=1 FX_SEED=0xe8b10045 FX_SCHEDULES=1 shows it.  A real
 *    transport notices a broken link (UCX keepalive), so by default a
 *    partition of KEEPALIVE_NS or more ends with both ends told.
 *  - A node's leave of its last participant is a JOIN with none, and
 *    was not retried; when it was lost (FX_DROP, or a partition nobody
 *    is told of) the coordinator kept a ghost participant: still
 *    planned, sent versions ("not attached here (dropped)"), its replica
 *    refused to every other node ("already attached on node2") until
 *    that node attached something again or went down.  Now that JOIN is
 *    retried until the coordinator answers it (docs/SYNC.md, *depart*,
 *    *answer*), and converge() checks that no ghost outlives the faults:
 *    without the retry FX_DROP=3 FX_DUP=20 FX_REORDER=40 FX_SEED=0x5001ae
 *    FX_SCHEDULES=1 fails there, and so do 2 of the default 200.  With
 *    drops a ghost also came back: an earlier JOIN of the node, copied or
 *    retried and reordered behind its answered leave (FX_DROP=3
 *    FX_SEED=0x9900006c); the member now tells the coordinator again when
 *    a plan names a participant of its own it does not hold.
 *  - Silent partitions and drops together (FX_SILENT=1 FX_DROP=2
 *    FX_SEED=0x660000ee) left a member on the old term when its PLAN was
 *    given up at the deadline and no version reached it to make it ask
 *    (the heal waits for every node to be planned before it publishes).
 *    Past its deadline a PLAN now goes every PEER_PLAN_SLOW_MS instead.
 *
 * FX_EXPLORE (environment) sets how many schedules (default below),
 * FX_SEED the first seed (with FX_SEED set, FX_SCHEDULES counts too, so
 * FX_SEED=<seed> FX_SCHEDULES=1 replays one), FX_DROP/FX_DUP/FX_REORDER the
 * transport's faults, FX_SILENT partitions nobody notices, FX_TRACE every
 * action, FX_DEBUG the engines' log.  Each violation prints
 * its seed, step and action; it prints "fixture-explore: nodes=3
 * schedules=S steps=K actions=A partitions=P leaves=L joins=J restarts=R
 * violations=V". */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "tests/unit/fixture.h"
#include "tests/unit/fixture_sync.h"
#include "daemon/buf.h"
#include "daemon/job.h"
#include "daemon/job_persist.h"
#include "daemon/job_state.h"
#include "daemon/metrics.h"
#include "gpu/backend.h"
#include "proto/peer_protocol.h"

#define NODES 3	/* node0: coordinator and source; node1, node2: a sink each */
#define SCHEDULES_DEFAULT 200	/* ~80 ms of CPU each (make test: FX_EXPLORE) */
#define ACTIONS_MIN 20
#define ACTIONS_MAX 60
#define RUN_MAX 300
#define MAXV 512
#define WAIT_STEPS 400000ull	/* a request answered (an attach's deadline is 15 s) */
#define CONVERGE_STEPS 2000000ull
#define STAGE_STEPS 20000ull
#define REPAIRS 32		/* versions after the heal before "never converged" */
#define RETIRED_MAX 64
#define KEEPALIVE_NS 20000000000ull	/* a broken link noticed after 20 s */
#define SRC_DESC "megatron:tp=1"
#define SINK_DESC "sglang:tp=1"

/* dte_engine_free ends the process's buffer registry (dbuf_fini: one
 * engine per process, daemon/job.h); here nodes restart one at a time, so
 * the link wraps it (daemon/daemon.mk) and the schedule ends the registry
 * itself once its last engine is gone. */
void __wrap_dbuf_fini(void);
void __real_dbuf_fini(void);

void __wrap_dbuf_fini(void)
{
}

/* A term view: the newest term seen, and the boots left behind. */
struct tview {
	uint64_t last;
	uint64_t left[RETIRED_MAX];
	unsigned nleft;
};

/* A node's client: the trainer at node0, an inference engine elsewhere. */
struct client {
	struct side sd;
	uint64_t conn;		/* its connection now; 0: none */
	unsigned gen;		/* connections made */
	int attached;
	uint32_t replica;
	/* PARKED: in wait_staged (request park_id), its weights may hold part
	 * of a version (apply on arrival); ORPHANED: its connection closed
	 * while parked, the daemon undoes on a worker: unread until it
	 * attaches again. */
	int park;
	uint32_t park_id;
};

enum { UNPARKED, PARKED, ORPHANED };

struct xnode {
	struct dte_engine *e;
	char dir[64];		/* its job_state_dir */
	struct tview member, coord;
	int cut;		/* partitioned */
	int told;		/* ... and both ends heard its links go down */
	uint64_t cut_since;	/* fix_now when it was cut off */
};

struct xstats {
	uint64_t steps, actions, publishes, publish_refused, applies, apply_refused;
	uint64_t partitions, downs, keepalive_downs, heals;
	uint64_t leaves, joins, join_refused, restarts, coord_restarts;
	uint64_t sink_refused, repairs, records, cut;
	uint64_t parks, parks_staged, parks_expired, orphaned;
	uint64_t arrival_parts, arrival_versions, arrival_undos, arrival_retreats;
};

static struct {
	struct fx *fx;
	uint64_t seed, rng;
	struct xnode n[NODES];
	struct client c[NODES];
	uint64_t hash[MAXV];	/* [0]: the zeros; [v]: RNE(θ_v) once v went out */
	uint64_t version;	/* the newest version published (or tried) */
	int64_t step;		/* the trainer's optimizer step */
	uint64_t coord_boots[RETIRED_MAX];
	unsigned ncoord_boots;
	uint32_t next_id;
	unsigned act;
	const char *doing;
	uint64_t violations;
	int relay;		/* this schedule's sinks relay (odd seeds) */
	struct xstats s;
} X;

/* splitmix64, the explorer's own: the fixture keeps its draws. */
static uint64_t xrnd(void)
{
	uint64_t z = (X.rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t cur_step(void)
{
	struct fix_stats st;

	fix_stats(X.fx, &st);
	return st.steps;
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void violation(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (X.violations++ < 20)
		print_message("fixture-explore: VIOLATION seed 0x%llx step %llu action %u (%s): %s\n",
			      (unsigned long long)X.seed, (unsigned long long)cur_step(), X.act,
			      X.doing, msg);
}

/* ------------------------------------------------------------------ invariants */

static int boot_in(const uint64_t *boots, unsigned n, uint64_t boot)
{
	for (unsigned i = 0; i < n; i++)
		if (boots[i] == boot)
			return 1;
	return 0;
}

/* Term t seen where tv saw its last: it may only grow (same boot, a
 * counter at least as large; or a boot never left behind). */
static void term_seen(struct tview *tv, uint64_t t, unsigned node, const char *what)
{
	uint64_t b = peer_term_boot(t), lb = peer_term_boot(tv->last);

	if (t == tv->last)
		return;
	if (!t) {
		violation("node%u: %s term %llx went to none", node, what,
			  (unsigned long long)tv->last);
	} else if (tv->last && b == lb) {
		if (peer_term_counter(t) < peer_term_counter(tv->last))
			violation("node%u: %s term went down: %llx -> %llx", node, what,
				  (unsigned long long)tv->last, (unsigned long long)t);
	} else if (boot_in(tv->left, tv->nleft, b)) {
		violation("node%u: %s term %llx of a boot left behind (last %llx)", node, what,
			  (unsigned long long)t, (unsigned long long)tv->last);
	} else if (tv->last && tv->nleft < RETIRED_MAX) {
		tv->left[tv->nleft++] = lb;
	}
	tv->last = t;
}

/* Whether sink memory hash h is a whole version: that version, or -1. */
static int64_t version_of(uint64_t h)
{
	for (uint64_t v = X.version + 1; v-- > 0;)
		if (X.hash[v] == h && (v == 0 || h))
			return (int64_t)v;
	return -1;
}

/* The sink's participant at node k, or NULL. */
static struct jlocal *sink_local(unsigned k)
{
	struct job *j = X.n[k].e ? job_find(X.n[k].e, "fx") : NULL;

	for (struct jlocal *l = j ? j->locals : NULL; l; l = l->next)
		if (l->info.role == JROLE_SINK && l->owner == X.c[k].conn)
			return l;
	return NULL;
}

/* Whether version v is staged in place at sink k (applied on arrival,
 * verified, not yet applied: docs/SYNC.md, "Apply on arrival"), or may
 * be: an apply on a worker took the staged versions up to
 * jsink.applying, in place ones among them. */
static int in_place(unsigned k, uint64_t v)
{
	struct jlocal *l = sink_local(k);

	if (l && jsink_of(l)->applying && v <= jsink_of(l)->applying)
		return 1;
	for (const struct jstaged *st = l ? jsink_of(l)->staged : NULL; st; st = st->next)
		if (st->in_place && st->version == v)
			return 1;
	return 0;
}

/* The arrival counters of the sink at node k, before it goes. */
static void sink_counts(unsigned k)
{
	struct jlocal *l = k ? sink_local(k) : NULL;

	if (!l)
		return;
	X.s.arrival_parts += jsink_of(l)->arrival_parts;
	X.s.arrival_versions += jsink_of(l)->arrival_versions;
	X.s.arrival_undos += jsink_of(l)->arrival_undos;
	X.s.arrival_retreats += jsink_of(l)->arrival_retreats;
}

static void check(void)
{
	for (unsigned i = 0; i < NODES; i++) {
		struct job *j = X.n[i].e ? job_find(X.n[i].e, "fx") : NULL;

		if (!j || !j->is_coord || !j->coord_epoch)
			continue;
		if (!boot_in(X.coord_boots, X.ncoord_boots, peer_term_boot(j->coord_epoch)) &&
		    X.ncoord_boots < RETIRED_MAX)
			X.coord_boots[X.ncoord_boots++] = peer_term_boot(j->coord_epoch);
		term_seen(&X.n[i].coord, j->coord_epoch, i, "coordinator's");
	}
	for (unsigned i = 0; i < NODES; i++) {
		struct job *j = X.n[i].e ? job_find(X.n[i].e, "fx") : NULL;

		if (!j)
			continue;
		if (j->epoch && !boot_in(X.coord_boots, X.ncoord_boots, peer_term_boot(j->epoch)))
			violation("node%u holds term %llx of a boot no coordinator drew", i,
				  (unsigned long long)j->epoch);
		term_seen(&X.n[i].member, j->epoch, i, "plan");
	}
	for (unsigned k = 1; k < NODES; k++) {
		struct client *c = &X.c[k];
		uint64_t h, staged = 0, applied = 0;
		int64_t v;

		if (c->park == PARKED && ans.seen[c->park_id & 255]) {
			c->park = UNPARKED;
			if (ans.rc[c->park_id & 255])
				X.s.parks_expired++;
			else
				X.s.parks_staged++;
		}
		if (c->park != UNPARKED)
			continue;
		h = side_hash(&c->sd);
		v = version_of(h);
		if (v < 0)
			violation("sink node%u holds no whole version (hash %016llx)", k,
				  (unsigned long long)h);
		if (!c->attached || fxs_query(X.n[k].e, c->conn, &c->sd, &staged, &applied))
			continue;
		if (applied > staged)
			violation("sink node%u: applied v%llu > staged v%llu", k,
				  (unsigned long long)applied, (unsigned long long)staged);
		if (applied && v >= 0 && (uint64_t)v != applied &&
		    ((uint64_t)v < applied || !in_place(k, (uint64_t)v)))
			violation("sink node%u applied v%llu but holds v%lld", k,
				  (unsigned long long)applied, (long long)v);
	}
}

static int checked_never(void *arg)
{
	check();
	return 0;
}

/* n steps (fewer when nothing can happen), each checked. */
static void run_steps(uint64_t n)
{
	fix_run_until(X.fx, checked_never, NULL, n);
}

/* ------------------------------------------------------------------ nodes */

static void created(struct dte_engine *e, const struct jcreate_args *a)
{
	jpersist_save(e, a);
}

/* Node i's engine on its I/O slot, keeping jobs in its directory. */
static struct dte_engine *engine_make(unsigned i)
{
	struct dte_engine_io eio;
	struct dte_engine *e;
	char err[256];

	fix_io(X.fx, i, &eio);
	assert_non_null(e = dte_engine_new_io(&eio, dtc_backend_cpu(), "cpu"));
	job_set_created_hook(e, created);
	/* Odd seeds: relay on, as [peer] relay_fanout = 1 on every daemon
	 * (the coordinator's rules it): replica 0's sink feeds replica 1's,
	 * through every leave, join, restart and partition below. */
	if (X.relay)
		job_set_relay(e, 1, 1, 0);
	if (jpersist_init(e, X.n[i].dir, err, sizeof(err)))
		fail_msg("job_state_dir: %s", err);
	return e;
}

static void dir_remove(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char path[512];

	while (d && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
			unlink(path);
		}
	if (d)
		closedir(d);
	rmdir(dir);
}

static const char *role_of(unsigned i)
{
	return i ? "sink" : "source";
}

/* Client i attaches (a new connection first when it has none, its memory
 * registered again): 0, or the refusal's errno. */
static int client_join(unsigned i, uint32_t replica)
{
	struct client *c = &X.c[i];
	char err[512];
	int rc;

	if (!c->conn) {
		c->conn = (uint64_t)i * 1000 + ++c->gen;
		side_reregister(&c->sd, c->conn);
	}
	rc = fxs_attach(X.fx, X.n[i].e, &c->sd, c->conn, ++X.next_id, role_of(i),
			i ? SINK_DESC : SRC_DESC, replica, WAIT_STEPS, err, sizeof(err));
	if (rc == FXS_NOANSWER)
		violation("node%u: attach never answered", i);
	if (rc) {
		if (getenv("FX_DEBUG"))
			print_message("node%u: attach as replica %u refused: %s\n", i, replica, err);
		return rc;
	}
	c->attached = 1;
	c->replica = replica;
	if (c->park == ORPHANED)
		c->park = UNPARKED;
	return 0;
}

/* What the sink node i's job refused (job.refused: versions it refused,
 * records it dropped as stale or malformed), before its engine goes. */
static void sink_refusals(unsigned i)
{
	struct job *j = X.n[i].e ? job_find(X.n[i].e, "fx") : NULL;

	if (i && j)
		X.s.sink_refused += j->refused;
}

/* Node i's process ends and starts again: no detach and no LEAVE; its
 * connections break (the others hear it go down), its client's buffer
 * registrations go with it; the new engine restores the job from its
 * job_state_dir and the client attaches again with the same memory. */
static void node_restart(unsigned i)
{
	struct client *c = &X.c[i];
	struct job *j;
	int n;

	sink_refusals(i);
	sink_counts(i);
	dte_engine_free(X.n[i].e);
	X.n[i].e = NULL;
	/* Shutdown undoes what arrived before the buffers go (job_sink.c). */
	c->park = UNPARKED;
	if (c->conn)
		dbuf_release_owner(c->conn);
	c->conn = 0;
	c->attached = 0;
	fix_node_gone(X.fx, i);
	X.n[i].e = engine_make(i);
	memset(&X.n[i].member, 0, sizeof(X.n[i].member));
	memset(&X.n[i].coord, 0, sizeof(X.n[i].coord));
	n = jpersist_restore(X.n[i].e);
	if (n != 1 || !(j = job_find(X.n[i].e, "fx")))
		violation("node%u: the job was not restored from %s (%d tried)", i, X.n[i].dir, n);
	X.s.restarts++;
	X.s.coord_restarts += i == 0;
	client_join(i, i ? c->replica : 0);
}

/* Every attached sink and the source planned together, on every node. */
static int job_ready(void *arg)
{
	struct job *j0 = job_find(X.n[0].e, "fx");

	check();
	if (!j0 || !j0->complete || !X.c[0].attached)
		return 0;
	for (unsigned k = 1; k < NODES; k++) {
		struct job *jk = job_find(X.n[k].e, "fx");

		if (!jk || !jk->complete || !X.c[k].attached ||
		    !job_pair(j0, X.c[0].sd.participant, X.c[k].sd.participant) ||
		    !job_pair(jk, X.c[0].sd.participant, X.c[k].sd.participant))
			return 0;
	}
	return 1;
}

/* ------------------------------------------------------------------ actions */

static int publish_next(void)
{
	struct client *src = &X.c[0];
	char err[512];
	int rc;

	if (!src->attached || X.version + 1 >= MAXV)
		return -EAGAIN;
	X.step++;
	adamw_step(&src->sd, X.step, (unsigned)(X.seed * 31 + (uint64_t)X.step));
	/* Its image before it goes: a sink may hold it from the next step. */
	X.hash[++X.version] = sink_expected_hash(&src->sd, &X.c[1].sd);
	rc = fxs_publish(X.fx, X.n[0].e, &src->sd, src->conn, ++X.next_id, X.version, X.step,
			 WAIT_STEPS, err, sizeof(err));
	X.s.publishes++;
	if (rc == FXS_NOANSWER)
		violation("publish v%llu never answered", (unsigned long long)X.version);
	if (rc) {
		X.s.publish_refused++;
		if (getenv("FX_DEBUG"))
			print_message("publish v%llu: %s\n", (unsigned long long)X.version, err);
	}
	return rc;
}

static void apply_at(unsigned k)
{
	struct client *c = &X.c[k];
	struct japply_res rep;
	uint64_t staged = 0, applied = 0;
	char err[512];
	int rc;

	if (!c->attached || c->park || fxs_query(X.n[k].e, c->conn, &c->sd, &staged, &applied) ||
	    staged <= applied)
		return;
	rc = fxs_apply(X.fx, X.n[k].e, &c->sd, c->conn, ++X.next_id, staged, &rep, WAIT_STEPS, err,
		       sizeof(err));
	X.s.applies++;
	if (rc == FXS_NOANSWER)
		violation("apply v%llu at node%u never answered", (unsigned long long)staged, k);
	else if (rc)
		X.s.apply_refused++;
	else if (!rep.checksum_ok || rep.version != staged)
		violation("apply v%llu at node%u: holds v%llu, checksum %s",
			  (unsigned long long)staged, k, (unsigned long long)rep.version,
			  rep.checksum_ok ? "ok" : "failed");
}

static void leave(unsigned k)
{
	struct client *c = &X.c[k];
	char err[512];

	if (!c->attached)
		return;
	X.s.leaves++;
	sink_counts(k);
	if (c->park == PARKED) {
		/* Its thread waits in wait_staged: only its connection can go. */
		X.s.orphaned++;
		c->park = ORPHANED;
		job_conn_gone(X.n[k].e, c->conn);
		c->conn = 0;
	} else if (xrnd() % 2) {
		if (job_detach(X.n[k].e, c->conn, "fx", c->sd.participant, err, sizeof(err)))
			violation("node%u: detach: %s", k, err);
	} else {
		job_conn_gone(X.n[k].e, c->conn);
		c->conn = 0;
	}
	c->attached = 0;
}

/* Every partition ends.  One that lasted KEEPALIVE_NS or more was
 * noticed by the transport meanwhile (UCX's keepalive): both ends hear
 * its links go down, unless FX_SILENT (a transport that never notices:
 * see the report in the file's header). */
static void heal_all(void)
{
	for (unsigned i = 0; i < NODES; i++) {
		if (!X.n[i].cut)
			continue;
		if (!X.n[i].told && !getenv("FX_SILENT") &&
		    fix_now(X.fx) - X.n[i].cut_since >= KEEPALIVE_NS) {
			X.s.keepalive_downs++;
			fix_node_down(X.fx, i);
		}
		if (getenv("FX_TRACE"))
			print_message("fixture-explore: node%u heals\n", i);
		X.n[i].cut = 0;
		fix_partition(X.fx, i, 0);
	}
}

/* Sink k's client waits in wait_staged for up to 2 s (parked: the next
 * version may go on arrival into its weights). */
static void park(unsigned k)
{
	struct client *c = &X.c[k];
	struct jwait_args rq = { 0 };
	struct jstaged_res rep = { 0 };
	char err[512];
	int deferred = 0;
	uint32_t id = ++X.next_id;

	if (!c->attached || c->park)
		return;
	rq.job = "fx";
	rq.participant = c->sd.participant;
	rq.timeout_ms = 1 + (uint32_t)(xrnd() % 2000);
	ans.seen[id & 255] = 0;
	if (job_wait_staged(X.n[k].e, RQ(c->conn, id), &rq, &rep, &deferred, err, sizeof(err)) ||
	    !deferred)
		return;	/* answered now: something is staged already */
	X.s.parks++;
	c->park = PARKED;
	c->park_id = id;
}

enum { A_PUBLISH, A_APPLY, A_RUN, A_PARTITION, A_HEAL, A_LEAVE, A_JOIN, A_RESTART, A_COORD_RESTART,
       A_PARK, A_N };
static const unsigned weight[A_N] = { 22, 18, 20, 7, 7, 8, 8, 6, 4, 10 };
static const char *const aname[A_N] = { "publish", "apply", "run", "partition", "heal",
					"leave", "join", "restart", "coordinator restart",
					"park" };

static void act(void)
{
	unsigned total = 0, a = 0, k = 1 + (unsigned)(xrnd() % (NODES - 1));
	uint64_t r;

	for (unsigned i = 0; i < A_N; i++)
		total += weight[i];
	r = xrnd() % total;
	while (r >= weight[a])
		r -= weight[a++];
	X.doing = aname[a];
	X.s.actions++;
	if (getenv("FX_TRACE"))
		print_message("fixture-explore: step %llu action %u: %s (sink node%u)\n",
			      (unsigned long long)cur_step(), X.act, X.doing, k);
	switch (a) {
	case A_PUBLISH:
		publish_next();
		break;
	case A_APPLY:
		apply_at(k);
		break;
	case A_RUN:
		run_steps(1 + xrnd() % RUN_MAX);
		break;
	case A_PARTITION: {
		unsigned i = (unsigned)(xrnd() % NODES);

		X.s.partitions++;
		if (!X.n[i].cut) {
			X.n[i].cut = 1;
			X.n[i].told = 0;
			X.n[i].cut_since = fix_now(X.fx);
			fix_partition(X.fx, i, 1);
		}
		if (!X.n[i].told && xrnd() % 2) {
			X.s.downs++;
			X.n[i].told = 1;
			fix_node_down(X.fx, i);
		}
		if (getenv("FX_TRACE"))
			print_message("fixture-explore: node%u cut off%s\n", i,
				      X.n[i].told ? ", told" : "");
		break;
	}
	case A_HEAL:
		X.s.heals++;
		heal_all();
		break;
	case A_LEAVE:
		leave(k);
		break;
	case A_JOIN:
		if (X.c[k].attached)
			break;
		X.s.joins++;
		if (client_join(k, xrnd() % 4 ? k - 1 : 2 - k))
			X.s.join_refused++;
		break;
	case A_RESTART:
		node_restart(k);
		break;
	case A_COORD_RESTART:
		node_restart(0);
		break;
	case A_PARK:
		park(k);
		break;
	}
	check();
}

/* ------------------------------------------------------------------ a schedule */

static void schedule_start(uint64_t seed, const struct fx_faults *faults)
{
	struct jcreate_args jc = { 0 };
	char err[512];

	memset(&X, 0, sizeof(X));
	memset(&ans, 0, sizeof(ans));
	X.seed = seed;
	X.rng = seed ^ 0x6578706c6f726521ull;
	X.relay = (int)(seed & 1);
	X.doing = "start";
	assert_non_null(X.fx = fix_new(NODES, seed, faults));
	for (unsigned i = 0; i < NODES; i++) {
		struct jcreate_res jr = { 0 };

		snprintf(X.n[i].dir, sizeof(X.n[i].dir), "/tmp/fx-explore.XXXXXX");
		assert_non_null(mkdtemp(X.n[i].dir));
		X.n[i].e = engine_make(i);
		jc.name = "fx";
		jc.model_config = fxs_config;
		jc.token = "tok";
		jc.coordinator = fix_node_address(X.fx, 0);
		if (job_create(X.n[i].e, &jc, &jr, err, sizeof(err)))
			fail_msg("job_create on node%u: %s", i, err);
		assert_int_equal(jr.coordinator, i == 0);
	}
	for (unsigned i = 0; i < NODES; i++) {
		X.c[i].conn = (uint64_t)i * 1000 + ++X.c[i].gen;
		side_register(&X.c[i].sd, X.c[i].conn, i ? SINK_DESC : SRC_DESC,
			      i ? DTE_LAYOUT_SINK : DTE_LAYOUT_SOURCE);
	}
	X.hash[0] = side_hash(&X.c[1].sd);	/* the zeros */
	fxs_each_step = check;
	for (unsigned i = 0; i < NODES; i++)
		if (client_join(i, i ? i - 1 : 0))
			fail_msg("seed 0x%llx: node%u's first attach refused", (unsigned long long)seed,
				 i);
}

/* What each node holds, after a convergence failed. */
static void dump_nodes(void)
{
	for (unsigned i = 0; i < NODES; i++) {
		struct job *j = job_find(X.n[i].e, "fx");
		uint64_t staged = 0, applied = 0;

		if (i && X.c[i].attached)
			fxs_query(X.n[i].e, X.c[i].conn, &X.c[i].sd, &staged, &applied);
		print_message("  node%u: term %llx%s, coordinator's %llx, %s participant %llx, "
			      "staged v%llu applied v%llu%s\n", i,
			      j ? (unsigned long long)j->epoch : 0ull,
			      j && j->complete ? " complete" : "",
			      j ? (unsigned long long)j->coord_epoch : 0ull,
			      X.c[i].attached ? "attached" : "detached",
			      (unsigned long long)X.c[i].sd.participant, (unsigned long long)staged,
			      (unsigned long long)applied,
			      j && j->join_acked < j->join_seq ? " (JOIN unacknowledged)" : "");
	}
}

/* Node i's name, as the coordinator knows its members. */
static int node_index(const char *name)
{
	for (unsigned i = 0; i < NODES; i++)
		if (X.n[i].e && !strcmp(jio_self(X.n[i].e), name))
			return (int)i;
	return -1;
}

/* The first participant the coordinator holds that its node does not
 * (a ghost): 1 with *node and *id, else 0. */
static int ghost_of(unsigned *node, uint64_t *id)
{
	struct job *j0 = X.n[0].e ? job_find(X.n[0].e, "fx") : NULL;

	for (const struct jmember *m = j0 ? j0->members : NULL; m; m = m->next) {
		int i = node_index(m->node);
		struct job *ji = i >= 0 ? job_find(X.n[i].e, "fx") : NULL;

		for (size_t q = 0; q < m->n; q++)
			if (!ji || !job_local(ji, m->p[q].id)) {
				*node = i >= 0 ? (unsigned)i : NODES;
				*id = m->p[q].id;
				return 1;
			}
	}
	return 0;
}

static int no_ghost(void *arg)
{
	unsigned node;
	uint64_t id;

	(void)arg;
	check();
	return !ghost_of(&node, &id);
}

/* Faults healed: every sink as its own replica again, the job complete,
 * and the next version (or the one after, where a sink refused it) staged
 * at every sink and applied exactly. */
static void converge(void)
{
	uint64_t bad = 0, v = 0;
	unsigned tries;

	X.doing = "converge";
	X.act++;
	heal_all();
	fix_set_faults(X.fx, NULL);
	for (unsigned k = 1; k < NODES; k++)
		if (X.c[k].park == PARKED && fxs_await(X.fx, X.c[k].park_id, WAIT_STEPS))
			violation("node%u: wait_staged never answered", k);
	for (unsigned k = 1; k < NODES; k++)
		if (X.c[k].attached && X.c[k].replica != k - 1)
			leave(k);
	/* A leave is a JOIN with the participants that stay (none, for the
	 * last), retried until the coordinator answers: once the faults
	 * heal, the coordinator holds no participant its node has not. */
	if (fix_run_until(X.fx, no_ghost, NULL, CONVERGE_STEPS)) {
		unsigned node = NODES;
		uint64_t id = 0;

		ghost_of(&node, &id);
		violation("after the heal the coordinator still plans participant %llx of node%u, "
			  "which that node does not hold (a ghost)", (unsigned long long)id, node);
		dump_nodes();
	}
	/* In rounds: an attach refused while the other node's leave of that
	 * replica is still on its way is tried again. */
	for (tries = 0; tries < 8; tries++) {
		int all = 1;

		for (unsigned i = 0; i < NODES; i++)
			if (!X.c[i].attached && client_join(i, i ? i - 1 : 0))
				all = 0;
		if (all)
			break;
		run_steps(RUN_MAX);
	}
	if (fix_run_until(X.fx, job_ready, NULL, CONVERGE_STEPS)) {
		violation("the job never became complete with every pair after the heal");
		dump_nodes();
		return;
	}
	for (tries = 0; tries < REPAIRS; tries++) {
		uint64_t staged = 0, applied = 0;
		int all = 1;

		if (publish_next())
			continue;
		v = X.version;
		for (uint64_t n = 0; n < STAGE_STEPS && all; n++) {
			all = 0;
			for (unsigned k = 1; k < NODES; k++)
				if (fxs_query(X.n[k].e, X.c[k].conn, &X.c[k].sd, &staged, &applied) ||
				    staged < v)
					all = 1;
			if (all && fix_step(X.fx) < 0)
				break;
			check();
		}
		if (!all)
			break;
		X.s.repairs++;
	}
	if (tries == REPAIRS) {
		violation("no version staged at every sink after %u tries", REPAIRS);
		dump_nodes();
		return;
	}
	for (unsigned k = 1; k < NODES; k++) {
		apply_at(k);
		bad += sink_violations(&X.c[0].sd, &X.c[k].sd);
	}
	if (bad)
		violation("after the heal, v%llu: %llu sink elements differ from RNE(theta)",
			  (unsigned long long)v, (unsigned long long)bad);
}

static void schedule_end(void)
{
	struct fix_stats st;

	X.doing = "end";
	fxs_each_step = NULL;
	for (unsigned i = NODES; i-- > 0;) {
		sink_counts(i);
		if (X.c[i].conn)
			job_conn_gone(X.n[i].e, X.c[i].conn);
	}
	fix_settle(X.fx, CONVERGE_STEPS);
	fix_stats(X.fx, &st);
	X.s.steps = st.steps;
	X.s.records = st.records;
	X.s.cut = st.cut;
	for (unsigned i = NODES; i-- > 0;) {
		sink_refusals(i);
		dte_engine_free(X.n[i].e);
		X.n[i].e = NULL;
		dir_remove(X.n[i].dir);
	}
	__real_dbuf_fini();
	fix_free(X.fx);
	for (unsigned i = 0; i < NODES; i++)
		side_unmap(&X.c[i].sd);
}

/* One schedule under seed: its violations; its counts in *s. */
static uint64_t one_schedule(uint64_t seed, const struct fx_faults *faults, struct xstats *s)
{
	unsigned nact;

	schedule_start(seed, faults);
	nact = ACTIONS_MIN + (unsigned)(xrnd() % (ACTIONS_MAX - ACTIONS_MIN + 1));
	for (X.act = 1; X.act <= nact; X.act++)
		act();
	converge();
	schedule_end();
	if (X.violations)
		print_message("fixture-explore: seed 0x%llx: %llu violations; replay: FX_SEED=0x%llx "
			      "FX_SCHEDULES=1 %s\n", (unsigned long long)seed,
			      (unsigned long long)X.violations, (unsigned long long)seed,
			      "build/tests/test_fixture_explore");
	*s = X.s;
	return X.violations;
}

static unsigned env_num(const char *name, unsigned dflt)
{
	const char *v = getenv(name);

	return v && *v ? (unsigned)strtoul(v, NULL, 0) : dflt;
}

static void test_fixture_explore(void **state)
{
	const char *first = getenv("FX_SEED");
	uint64_t seed0 = first && *first ? strtoull(first, NULL, 0) : 0xe8b10000ull;
	uint64_t schedules = env_num("FX_EXPLORE", first && *first ?
					     env_num("FX_SCHEDULES", SCHEDULES_DEFAULT) :
					     SCHEDULES_DEFAULT);
	uint64_t violations = 0;
	struct xstats t = { 0 };
	struct fx_faults f = { .drop_pct = env_num("FX_DROP", 0), .dup_pct = env_num("FX_DUP", 10),
			       .reorder_pct = env_num("FX_REORDER", 30) };

	for (uint64_t i = 0; i < schedules; i++) {
		struct xstats s;

		violations += one_schedule(seed0 + i, &f, &s);
		t.steps += s.steps;
		t.actions += s.actions;
		t.publishes += s.publishes;
		t.publish_refused += s.publish_refused;
		t.applies += s.applies;
		t.apply_refused += s.apply_refused;
		t.partitions += s.partitions;
		t.downs += s.downs;
		t.keepalive_downs += s.keepalive_downs;
		t.heals += s.heals;
		t.leaves += s.leaves;
		t.joins += s.joins;
		t.join_refused += s.join_refused;
		t.restarts += s.restarts;
		t.coord_restarts += s.coord_restarts;
		t.sink_refused += s.sink_refused;
		t.repairs += s.repairs;
		t.parks += s.parks;
		t.parks_staged += s.parks_staged;
		t.parks_expired += s.parks_expired;
		t.orphaned += s.orphaned;
		t.arrival_parts += s.arrival_parts;
		t.arrival_versions += s.arrival_versions;
		t.arrival_undos += s.arrival_undos;
		t.arrival_retreats += s.arrival_retreats;
		t.records += s.records;
		t.cut += s.cut;
	}
	/* The same seed, the same schedule. */
	{
		struct xstats a, b;

		one_schedule(seed0, &f, &a);
		one_schedule(seed0, &f, &b);
		assert_int_equal(a.steps, b.steps);
		assert_int_equal(a.actions, b.actions);
		assert_int_equal(a.records, b.records);
		assert_int_equal(a.sink_refused, b.sink_refused);
		assert_int_equal(a.join_refused, b.join_refused);
		assert_int_equal(a.publish_refused, b.publish_refused);
	}
	print_message("fixture-explore: publishes=%llu (refused %llu) applies=%llu (refused %llu) "
		      "partitions_told=%llu (keepalive %llu) heals=%llu joins_refused=%llu "
		      "coordinator_restarts=%llu records=%llu cut=%llu refused_at_sinks=%llu "
		      "repair_versions=%llu\n",
		      (unsigned long long)t.publishes, (unsigned long long)t.publish_refused,
		      (unsigned long long)t.applies, (unsigned long long)t.apply_refused,
		      (unsigned long long)t.downs, (unsigned long long)t.keepalive_downs,
		      (unsigned long long)t.heals,
		      (unsigned long long)t.join_refused, (unsigned long long)t.coord_restarts,
		      (unsigned long long)t.records, (unsigned long long)t.cut,
		      (unsigned long long)t.sink_refused, (unsigned long long)t.repairs);
	print_message("fixture-explore: parks=%llu (staged %llu, expired %llu, orphaned %llu) "
		      "on arrival: parts=%llu versions=%llu undos=%llu retreats=%llu\n",
		      (unsigned long long)t.parks, (unsigned long long)t.parks_staged,
		      (unsigned long long)t.parks_expired, (unsigned long long)t.orphaned,
		      (unsigned long long)t.arrival_parts, (unsigned long long)t.arrival_versions,
		      (unsigned long long)t.arrival_undos, (unsigned long long)t.arrival_retreats);
	/* Re-plans carried only what changed to members that held the plan
	 * before (peer protocol 8), and members that did not (a restart, a
	 * lost plan) asked for the whole one: both happen under these
	 * schedules, and no invariant broke. */
	{
		double kinds[4] = { 0 }, relayed = 0, relay_failed = 0;
		static const char *const names[4] = { "sent_whole", "sent_changes", "taken_changes",
						       "changes_refused" };
		size_t len = 0;
		char *text = dmetrics_render(&len);
		const char *at;

		if (text && (at = strstr(text, "dted_relayed_bytes_total{outcome=\"sent\"} ")))
			relayed = strtod(at + strlen("dted_relayed_bytes_total{outcome=\"sent\"} "),
					 NULL);
		if (text && (at = strstr(text, "dted_relayed_bytes_total{outcome=\"failed\"} ")))
			relay_failed = strtod(at + strlen("dted_relayed_bytes_total{outcome=\"failed\"} "),
					      NULL);

		for (int k = 0; text && k < 4; k++) {
			char key[96];

			snprintf(key, sizeof(key), "dted_plans_total{kind=\"%s\"} ", names[k]);
			if ((at = strstr(text, key)))
				kinds[k] = strtod(at + strlen(key), NULL);
		}
		free(text);
		print_message("fixture-explore: plans sent_whole=%.0f sent_changes=%.0f "
			      "taken_changes=%.0f changes_refused=%.0f\n", kinds[0], kinds[1],
			      kinds[2], kinds[3]);
		assert_true(kinds[1] > 0 && kinds[2] > 0);
		/* half the schedules relay (odd seeds): the relay really
		 * forwarded, under the same invariants */
		print_message("fixture-explore: relay_schedules=%llu relayed_bytes=%.0f "
			      "relay_failed_bytes=%.0f\n", (unsigned long long)(schedules + 1) / 2,
			      relayed, relay_failed);
		if (schedules >= 2)
			assert_true(relayed > 0);
	}
	print_message("fixture-explore: nodes=%d schedules=%llu steps=%llu actions=%llu "
		      "partitions=%llu leaves=%llu joins=%llu restarts=%llu violations=%llu\n", NODES,
		      (unsigned long long)schedules, (unsigned long long)t.steps,
		      (unsigned long long)t.actions, (unsigned long long)t.partitions,
		      (unsigned long long)t.leaves, (unsigned long long)t.joins,
		      (unsigned long long)t.restarts, (unsigned long long)violations);
	assert_int_equal(violations, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixture_explore),
	};

	return cmocka_run_group_tests(tests, fxs_setup, fxs_teardown);
}
