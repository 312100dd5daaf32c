/* daemon/job_coord.h — membership and plans (daemon/job_coord.c): the
 * coordinator's JOINs, LEAVEs and re-plans, a member's PLAN.
 *
 * One header per layer (docs/SYNC.md, "Layers"): an engine file includes
 * the headers of the layers it may call, below its own, and the compiler
 * refuses a call to a layer it does not include; tests/system/
 * engine_layers.sh checks both the includes and the calls. */
#ifndef DTED_JOB_COORD_H
#define DTED_JOB_COORD_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_state.h"

void jcoord_join(struct job *j, const char *from, const Dtep__Join *m);
void jcoord_leave(struct job *j, const char *from, const Dtep__Leave *m);
void jcoord_node_down(struct job *j, const char *node);
void jcoord_free(struct job *j);
/* Whether this daemon reports or uses send rates in job j: a coordinator
 * with relay_shape measured, a member whose plan has relay trees and
 * whose coordinator speaks peer protocol 10. */
int  jcoord_rates_wanted(const struct job *j);
/* A member's measured send rates (peer protocol 10; the relay shape). */
void jcoord_rates(struct job *j, const char *from, const Dtep__Rates *m);
/* A PLAN_ACK from a member. */
void jcoord_plan_ack(struct job *j, const char *from, const Dtep__PlanAck *m);
/* Retries of JOINs and PLANs not acknowledged yet; (re)arms e->ctl_timer. */
void jctl_retry(struct dte_engine *e);
void jctl_update(struct dte_engine *e);
/* Member: the coordinator went down; rejoin when it is back. */
void jmember_coord_down(struct job *j, const char *node);
/* A random boot id (PEER_TERM_BOOT_BITS, never 0). */
uint64_t job_boot_new(void);
/* A JOIN with this daemon's participants now (a new join_seq)... */
void job_send_join(struct job *j);
/* ...or the newest one again (a retry: same join_seq). */
void job_send_join_again(struct job *j);
/* Member side: a PLAN arrived.  -1 with the reason in why when it is
 * refused (not from the job's coordinator, not a term, another peer
 * protocol): the caller answers REFUSED. */
int  jplan_recv(struct job *j, const char *from, const Dtep__Plan *m, char *why, size_t whylen);
void jplan_free(struct job *j);

#endif
