/* daemon/registry.c — job and peer counts (single-threaded: loop only). */
#include "daemon/registry.h"

/* Process-wide, not engine state (struct dte_engine): the daemon's counts
 * of buffers and jobs, which `dtectl status` reports. */
static struct dreg_counts counts;

void dreg_init(void)
{
	counts.jobs = 0;
	counts.peers = 0;
}

void dreg_fini(void)
{
	counts.jobs = 0;
	counts.peers = 0;
}

void dreg_job_added(void)
{
	counts.jobs++;
}

void dreg_job_removed(void)
{
	if (counts.jobs)
		counts.jobs--;
}

void dreg_peer_added(void)
{
	counts.peers++;
}

void dreg_peer_removed(void)
{
	if (counts.peers)
		counts.peers--;
}

struct dreg_counts dreg_counts(void)
{
	return counts;
}
