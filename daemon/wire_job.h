/* daemon/wire_job.h — a job's creation between the engine's plain request
 * (struct jcreate_args, daemon/job_api.h) and the control protocol's
 * JobCreateRequest.  The control handler (daemon/cmd_job.c) reads a
 * request with it; daemon/job_persist.c keeps a created job on disk as
 * the packed request, the format its files always had.  A wire adapter,
 * not an engine file: the engine's headers and files name no wire type
 * (tests/system/engine_api.sh). */
#ifndef DTED_WIRE_JOB_H
#define DTED_WIRE_JOB_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/job_api.h"
#include "proto/dte.pb-c.h"

/* m's fields into *a (its strings borrowed from m). */
void wire_jcreate_args(const Dte__JobCreateRequest *m, struct jcreate_args *a);
/* a packed as a JobCreateRequest into *buf (malloc'd, the caller frees)
 * of *len bytes: 0, or -ENOMEM. */
int wire_jcreate_pack(const struct jcreate_args *a, uint8_t **buf, size_t *len);
/* A JobCreateRequest of len bytes into *a, whose strings belong to the
 * handle returned (wire_jcreate_free); NULL when buf is not one. */
void *wire_jcreate_unpack(const uint8_t *buf, size_t len, struct jcreate_args *a);
void wire_jcreate_free(void *handle);

#endif
