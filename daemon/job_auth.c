/* daemon/job_auth.c — seal and check job records (job_auth.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "daemon/job_auth.h"
#include "daemon/job_state.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "proto/peer_auth.h"

/* The operator's switch lives in the engine (e->auth). */
void job_auth_configure(struct dte_engine *e, int on, const char *off_jobs)
{
	e->auth.off = !on;
	snprintf(e->auth.off_jobs, sizeof(e->auth.off_jobs), "%s", off_jobs ? off_jobs : "");
}

static int listed_off(const struct dte_engine *e, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = e->auth.off_jobs; *p;) {
		size_t k = strcspn(p, ", \t");

		if (k == n && !strncmp(p, name, n))
			return 1;
		p += k;
		p += strspn(p, ", \t");
	}
	return 0;
}

void job_auth_setup(struct job *j)
{
	j->auth = !j->eng->auth.off && !listed_off(j->eng, j->name);
	peer_auth_key(j->auth_key, j->name, j->token);
	peer_auth_random(j->auth_nonce, sizeof(j->auth_nonce));
	if (!j->auth)
		DLOG_N("job %s: peer auth off (conf [peer]): its token travels in clear", j->name);
}

int job_auth_seal(void *engine, Dtep__PeerMsgType type, const ProtobufCMessage *msg,
		  const void *data, size_t len, uint8_t mac[PEER_AUTH_MACBYTES])
{
	Dtep__JobRef *ref = peer_auth_ref(msg);
	const char *name = ref ? ref->job : NULL;
	struct job *j;
	int rc;

	/* A REFUSED names its job as a string and is sealed when this daemon
	 * holds that job (a refusal of an unknown job cannot be). */
	if (msg && msg->descriptor == &dtep__refused__descriptor)
		name = ((const Dtep__Refused *)msg)->job;
	if (!name || !(j = job_find(engine, name)) || !j->auth)
		return 0;
	if (ref && ref->token && *ref->token) {
		DLOG_E("job %s: a record to send carries the token (bug): not sent", j->name);
		return -EPERM;
	}
	rc = peer_auth_mac(j->auth_key, type, msg, data, len, mac);
	return rc < 0 ? rc : 1;
}

static int auth_refuse(struct job *j, const char *from, Dtep__PeerMsgType type, size_t len,
		       int rc, char *why, size_t whylen)
{
	j->auth_refused++;
	dmetrics_add(DM_REFUSED, "auth", 1);
	snprintf(why, whylen, "wrong token: %s",
		 rc == -ENOKEY ? "the record carries no MAC of the job key (peer auth is on)" :
		 rc == -EBADMSG ? "the record's MAC does not verify under the job key" :
		 "the record's MAC cannot be checked");
	DLOG_W("job %s: %s record from %s refused by peer auth (%zu data bytes): %s", j->name,
	       dtep__peer_msg_type__descriptor.values[type < dtep__peer_msg_type__descriptor.n_values ?
						      type : 0].name, from, len, why);
	return -EACCES;
}

int job_auth_check(struct job *j, const char *from, Dtep__PeerMsgType type,
		   const ProtobufCMessage *msg, const void *data, size_t len, char *why,
		   size_t whylen)
{
	const Dtep__JobRef *ref = peer_auth_ref(msg);
	int rc;

	if (!j->auth) {
		if (ref && ref->token && !strcmp(ref->token, j->token))
			return 0;
		snprintf(why, whylen, "wrong token");
		return -EACCES;
	}
	rc = peer_auth_check(j->auth_key, type, msg, data, len);
	return rc ? auth_refuse(j, from, type, len, rc, why, whylen) : 0;
}

int job_auth_check_refused(struct job *j, const char *from, const Dtep__Refused *m, char *why,
			   size_t whylen)
{
	int rc;

	if (!j->auth)
		return 0;
	rc = peer_auth_check(j->auth_key, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &m->base, NULL, 0);
	return rc ? auth_refuse(j, from, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, 0, rc, why, whylen) : 0;
}
