/* tests/unit/fixture_sync.h — what the fixture's sync tests share
 * (tests/unit/test_fixture.c, tests/unit/test_fixture_explore.c; issue
 * 31): the clients' sides (buffers registered as memfds, the trainer's
 * AdamW step), the expected sink contents through the independent mapping
 * (tiny_llama_ref.h, not the product's plan), and the deferred answers of
 * the control requests.  Include after <cmocka.h>; the functions fail the
 * running test on what can only be a test's own mistake. */
#ifndef DTE_TEST_FIXTURE_SYNC_H
#define DTE_TEST_FIXTURE_SYNC_H

#include <stddef.h>
#include <stdint.h>
#include "tests/unit/fixture.h"
#include "daemon/job.h"
#include "daemon/layout/layout.h"
#include "gpu/compute.h"

#include "tests/unit/fixture_side.h"

/* Every element of every buffer of sink k against RNE of the trainer's θ
 * (src now) where SGLang holds a model element, zero in the padding: the
 * number of elements that differ (the first few printed). */
uint64_t sink_violations(const struct side *src, const struct side *k);
/* A 64-bit hash (XXH3, chained over the buffers) of what sink k must hold
 * for src's θ now; side_hash, of what it holds. */
uint64_t sink_expected_hash(const struct side *src, const struct side *k);
uint64_t side_hash(const struct side *k);

/* Deferred answers, by request id (its low 8 bits). */
struct fxs_answers {
	int seen[256];
	int rc[256];
	char msg[256][256];
	uint64_t apply_version;
	int apply_checksum_ok;
};
extern struct fxs_answers ans;

void catch_done(const struct jreq *rq, int rc, const char *err, const struct jres *res);
/* A request of connection c with id i, answered in catch_done. */
#define RQ(c, i) (&(struct jreq){ .conn = (c), .id = (i), .done = catch_done })

/* Node i's engine on the fixture's I/O with the job "fx" of fxs_config
 * (token "tok"), node 0 its coordinator. */
struct dte_engine *fxs_engine(struct fx *fx, unsigned i);
/* The job complete on nodes 0..n-1, and each sink k (1 <= k < n, on node
 * k) planned from src (on node 0) both there and on node 0. */
int fxs_pairs_ready(struct dte_engine *const *eng, unsigned n, const struct side *src,
		    const struct side *sinks);

/* Called before every step the helpers below run (the explorer's
 * invariants); NULL: none. */
extern void (*fxs_each_step)(void);
/* Steps until request id is answered: 0 (its rc in ans.rc), or -1 when
 * max_steps ran out or nothing could happen. */
int fxs_await(struct fx *fx, uint32_t id, uint64_t max_steps);

/* A deferred request not answered within its steps (no errno: the
 * engine answers -ETIMEDOUT itself, an attach's deadline). */
#define FXS_NOANSWER (-100000)

/* Requests as a client sends them; 0 or a negative errno with the reason
 * in err (deferred ones awaited for max_steps: FXS_NOANSWER past it). */
int fxs_attach(struct fx *fx, struct dte_engine *e, struct side *sd, uint64_t conn, uint32_t id,
	       const char *role, const char *desc, uint32_t replica, uint64_t max_steps,
	       char *err, size_t errlen);
int fxs_publish(struct fx *fx, struct dte_engine *e, const struct side *src, uint64_t conn,
		uint32_t id, uint64_t version, int64_t step, uint64_t max_steps, char *err,
		size_t errlen);
int fxs_apply(struct fx *fx, struct dte_engine *e, const struct side *k, uint64_t conn, uint32_t id,
	      uint64_t version, struct japply_res *rep, uint64_t max_steps, char *err,
	      size_t errlen);
/* Its staged (newest staged or applied) and applied versions: 0, or -1
 * when the participant is not attached there. */
int fxs_query(struct dte_engine *e, uint64_t conn, const struct side *k, uint64_t *staged,
	      uint64_t *applied);

#endif
