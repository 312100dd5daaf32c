/* daemon/registry.h — what this daemon currently serves: jobs and peers.
 *
 * Empty until the sync layer lands; it exists now so `status` reports real
 * counts through one place and later layers fill it instead of adding
 * counters of their own.
 */
#ifndef DTED_REGISTRY_H
#define DTED_REGISTRY_H

#include <stdint.h>

struct dreg_counts {
	uint32_t jobs;
	uint32_t peers;
};

void dreg_init(void);
void dreg_fini(void);

/* Called by the job/peer layers as entries come and go. */
void dreg_job_added(void);
void dreg_job_removed(void);
void dreg_peer_added(void);
void dreg_peer_removed(void);

struct dreg_counts dreg_counts(void);

#endif
