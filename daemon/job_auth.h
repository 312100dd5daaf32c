/* daemon/job_auth.h — peers that prove who they are (peer protocol 5).
 *
 * Each job with auth on (the default) holds a key derived from its token
 * (proto/peer_auth.h).  Every record leaving for another daemon is sealed
 * with it (job_auth_seal, route.c's sealer), and every record from
 * another daemon is checked where it enters the job layer
 * (job_auth_check, from job.c's check_ref) before any handler reads it:
 * no MAC, or one that does not verify, and the record is refused, logged
 * and counted (the job's refused and auth_refused, dted_refused_total
 * {reason="auth"}), nothing else changes.  REFUSED records are sealed
 * and checked too (job_auth_check_refused).  Records between a daemon's own
 * roles never leave the process and carry none.
 *
 * The operator turns auth off for jobs on fabrics they trust: conf
 * [peer] auth = off (every job) or auth_off_jobs = a,b (those jobs).  Such
 * a job sends and checks the token in clear, as protocol 4 did; both ends
 * of a job must agree. */
#ifndef DTED_JOB_AUTH_H
#define DTED_JOB_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>
#include "proto/peer.pb-c.h"
#include "proto/peer_auth.h"

struct dte_engine;
struct job;

/* The operator's switch: on (1) or off (0) for every job, and a list of
 * job names (comma or space separated, may be NULL) for which it is off.
 * Read at job creation. */
void job_auth_configure(struct dte_engine *e, int on, const char *off_jobs);

/* At job creation: whether auth is on for j, its key, its JOIN nonce. */
void job_auth_setup(struct job *j);

/* route.c's sealer (route_set_sealer, its context the struct dte_engine):
 * 1 with the MAC of a record of a job with auth on, else 0. */
int job_auth_seal(void *engine, Dtep__PeerMsgType type, const ProtobufCMessage *msg,
		  const void *data, size_t len, uint8_t mac[PEER_AUTH_MACBYTES]);

/* A record for j from daemon `from` (not this one): 0 when it may be read,
 * else -EACCES with the reason in why (counted here). */
int job_auth_check(struct job *j, const char *from, Dtep__PeerMsgType type,
		   const ProtobufCMessage *msg, const void *data, size_t len, char *why,
		   size_t whylen);

/* A REFUSED of one of our records for j from daemon `from`: 0 when it may
 * be acted on (auth off for j: anyone may send one; auth on: its MAC
 * verifies under j's key), else -EACCES with the reason in why (counted
 * here).  An unverified refusal is a forgery, or a peer that holds
 * another token: it changes nothing but a hint (job.c, on_refused). */
int job_auth_check_refused(struct job *j, const char *from, const Dtep__Refused *m, char *why,
			   size_t whylen);

#endif
