/* daemon/job_storage.h — the storage transport of a job (docs/STORAGE.md):
 * the sync engine on one side of a shared directory, daemon/storage on
 * the other.
 *
 * Writer (transport storage or both, on the job's coordinator): a
 * daemon-owned sink participant with the "canonical" layout (one BF16
 * buffer holding every spec tensor row-major, back to back) joins the
 * plan like any sink.  Sources capture into it with the engine's own
 * sparse/dense rules, COUNTS/PAYLOAD and checksums; once a version is
 * staged there it is applied and verified like any sink, the canonical
 * delta (what really changed against the verified previous content) is
 * written as chunks, a keyframe is added every N versions or on request,
 * and the manifest is committed last; then retention runs.
 *
 * Reader (role reader, transport storage): local sink participants are
 * fed from the directory instead of from sources: the newest keyframe,
 * then every version in order, each fully verified by the library, mapped
 * through the sink layout's pieces, staged for wait_staged/apply and
 * checked after apply against a predicted checksum.
 *
 * Relay reader (role reader, transport both): one reader for a whole
 * cluster.  The job's coordinator alone reads the directory, into a
 * daemon-owned source participant (the canonical layout, FP32, detect =
 * snapshot), and publishes each version it read; the cluster's sinks, on
 * any daemon, are planned from that source and fed over UCX like any
 * sink, relayed between sink daemons where the coordinator's relay_fanout
 * says so.  The other daemons of the job read nothing.
 */
#ifndef DTED_JOB_STORAGE_H
#define DTED_JOB_STORAGE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_api.h"

struct dte_engine;
struct job;
struct jlocal;
struct dte_spec;
struct dte_layout;

struct jstore_cfg {
	int      transport;        /* enum below */
	int      reader;           /* role reader (else writer) */
	int      relay;            /* reader with transport both: a relay reader */
	char     root[4096];
	uint32_t keyframe_every;
	uint32_t keep_versions;
	uint32_t keep_keyframes;
	int      watch_mode;       /* enum dts_watch_mode */
};

enum { JSTORE_UCX = 0, JSTORE_STORAGE = 1, JSTORE_BOTH = 2 };

/* Parse and check the storage fields of a JobCreate; -EINVAL with the reason. */
int jstore_parse(const struct jcreate_args *a, struct jstore_cfg *cfg, char *err,
		 size_t errlen);
/* Whether the job has this configuration (idempotent create). */
int jstore_same_job(const struct job *j, const struct jstore_cfg *c);
const char *jstore_transport_name(int transport);

/* After the job is linked: open the writer or reader.  A negative errno
 * (derr.h) with the reason. */
int jstore_start(struct job *j, const struct jstore_cfg *cfg, char *err, size_t errlen);
/* Before the job is freed (its locals are gone already). */
void jstore_free(struct job *j);

/* JSTORE_CANON_LAYOUT and jstore_canonical_layout(): daemon/job_state.h
 * (job_state.c builds every participant's layout, this one too). */

/* Whether a participant of this role may attach here; -EINVAL with the reason. */
int jstore_attach_check(const struct job *j, int role, char *err, size_t errlen);
/* Whether a sink whose layout holds FP8 weights may attach here: not to a
 * plain reader, which writes stored BF16 values into its sinks' pieces
 * (the FP8 codes and scales are the source's to compute); a relay
 * reader's job is fed by its source, which computes them.  -EOPNOTSUPP
 * with the reason. */
int jstore_fp8_check(const struct job *j, char *err, size_t errlen);


/* dtectl job */
void jstore_info(const struct job *j, struct jjob_info *res);

#endif
