/* daemon/wire_job.c — a job's creation between struct jcreate_args and the
 * control protocol's JobCreateRequest (daemon/wire_job.h). */
#include <errno.h>
#include <stdlib.h>
#include "daemon/wire_job.h"

void wire_jcreate_args(const Dte__JobCreateRequest *m, struct jcreate_args *a)
{
	*a = (struct jcreate_args){
		.name = m->name,
		.model_config = m->model_config,
		.coordinator = m->coordinator,
		.token = m->token,
		.publish_interval = m->publish_interval,
		.transport = m->transport,
		.storage_root = m->storage_root,
		.storage_role = m->storage_role,
		.keyframe_every = m->keyframe_every,
		.keep_versions = m->keep_versions,
		.keep_keyframes = m->keep_keyframes,
		.storage_watch = m->storage_watch,
		.detect = m->detect,
		.zstd_level = m->zstd_level,
	};
}

/* The wire's strings are never NULL when packed (proto3: "" is unset). */
static char *str(const char *s)
{
	return (char *)(s ? s : "");
}

int wire_jcreate_pack(const struct jcreate_args *a, uint8_t **buf, size_t *len)
{
	Dte__JobCreateRequest m = DTE__JOB_CREATE_REQUEST__INIT;
	size_t n;

	m.name = str(a->name);
	m.model_config = str(a->model_config);
	m.coordinator = str(a->coordinator);
	m.token = str(a->token);
	m.publish_interval = a->publish_interval;
	m.transport = str(a->transport);
	m.storage_root = str(a->storage_root);
	m.storage_role = str(a->storage_role);
	m.keyframe_every = a->keyframe_every;
	m.keep_versions = a->keep_versions;
	m.keep_keyframes = a->keep_keyframes;
	m.storage_watch = str(a->storage_watch);
	m.detect = str(a->detect);
	m.zstd_level = a->zstd_level;
	n = dte__job_create_request__get_packed_size(&m);
	*buf = malloc(n ? n : 1);
	if (!*buf)
		return -ENOMEM;
	*len = dte__job_create_request__pack(&m, *buf);
	return 0;
}

void *wire_jcreate_unpack(const uint8_t *buf, size_t len, struct jcreate_args *a)
{
	Dte__JobCreateRequest *m = dte__job_create_request__unpack(NULL, len, buf);

	if (m)
		wire_jcreate_args(m, a);
	return m;
}

void wire_jcreate_free(void *handle)
{
	if (handle)
		dte__job_create_request__free_unpacked(handle, NULL);
}
