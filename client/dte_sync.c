/* client/dte_sync.c — libdte's same-cluster sync calls (dte.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "client/dte_internal.h"
#include "daemon/layout/layout.h"
#include "daemon/layout/spec.h"

#define FITS(type, out, f) (offsetof(type, f) + sizeof((out)->f) <= (out)->size)

static int do_call(dte_t *h, Dte__Request *req, int fd, unsigned wait_ms, Dte__Response **resp)
{
	return dte__call_ex(h, req, fd, wait_ms, resp);
}

static int register_common(dte_t *h, Dte__RegisterBufferRequest *rb, int fd, uint64_t *id)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	req.cmd_case = DTE__REQUEST__CMD_REGISTER_BUFFER;
	req.register_buffer = rb;
	rc = do_call(h, &req, fd, 0, &resp);
	if (rc < 0)
		return rc;
	if (id)
		*id = resp->register_buffer->buffer;
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

static const char *dtype_str(int dtype)
{
	return dtype == DTE_FP32 ? "fp32" : dtype == DTE_BF16 ? "bf16" : NULL;
}

int dte_buffer_register_fd(dte_t *h, int fd, uint64_t offset, uint64_t length, int dtype,
			   const char *name, uint64_t *id)
{
	Dte__RegisterBufferRequest rb = DTE__REGISTER_BUFFER_REQUEST__INIT;

	if (!h || fd < 0 || !dtype_str(dtype))
		return DTE_ERR_INVAL;
	rb.dtype = (char *)dtype_str(dtype);
	rb.offset = offset;
	rb.length = length;
	rb.name = (char *)(name ? name : "");
	return register_common(h, &rb, fd, id);
}

int dte_buffer_register_cuda(dte_t *h, const void *ipc_handle, size_t handle_len,
			     const void *ipc_event, size_t event_len, int device, uint64_t offset,
			     uint64_t length, int dtype, const char *name, uint64_t *id)
{
	Dte__RegisterBufferRequest rb = DTE__REGISTER_BUFFER_REQUEST__INIT;

	if (!h || !ipc_handle || !handle_len || !dtype_str(dtype) || (event_len && !ipc_event))
		return DTE_ERR_INVAL;
	rb.dtype = (char *)dtype_str(dtype);
	rb.offset = offset;
	rb.length = length;
	rb.name = (char *)(name ? name : "");
	rb.cuda = 1;
	rb.cuda_ipc_handle.data = (uint8_t *)ipc_handle;
	rb.cuda_ipc_handle.len = handle_len;
	rb.cuda_ipc_event.data = (uint8_t *)ipc_event;
	rb.cuda_ipc_event.len = event_len;
	rb.cuda_device = device;
	return register_common(h, &rb, -1, id);
}

int dte_buffer_unregister(dte_t *h, uint64_t id)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__UnregisterBufferRequest ub = DTE__UNREGISTER_BUFFER_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	ub.buffer = id;
	req.cmd_case = DTE__REQUEST__CMD_UNREGISTER_BUFFER;
	req.unregister_buffer = &ub;
	rc = do_call(h, &req, -1, 0, &resp);
	if (rc == DTE_OK)
		dte__response__free_unpacked(resp, NULL);
	return rc;
}

int dte_job_create(dte_t *h, const struct dte_job_params *p, int *created)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__JobCreateRequest jc = DTE__JOB_CREATE_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !p || p->size < offsetof(struct dte_job_params, transport) || !p->name ||
	    !p->model_config || !p->token)
		return DTE_ERR_INVAL;
	jc.name = (char *)p->name;
	jc.model_config = (char *)p->model_config;
	jc.coordinator = (char *)(p->coordinator ? p->coordinator : "local");
	jc.token = (char *)p->token;
	jc.publish_interval = p->publish_interval;
	jc.transport = (char *)(FITS(struct dte_job_params, p, transport) && p->transport ?
				p->transport : "ucx");
	if (FITS(struct dte_job_params, p, storage_watch)) {
		jc.storage_root = (char *)(p->storage_root ? p->storage_root : "");
		jc.storage_role = (char *)(p->storage_role ? p->storage_role : "");
		jc.keyframe_every = p->keyframe_every;
		jc.keep_versions = p->keep_versions;
		jc.keep_keyframes = p->keep_keyframes;
		jc.storage_watch = (char *)(p->storage_watch ? p->storage_watch : "");
	}
	if (FITS(struct dte_job_params, p, zstd_level)) {
		jc.detect = (char *)(p->detect ? p->detect : "");
		jc.zstd_level = p->zstd_level;
	}
	req.cmd_case = DTE__REQUEST__CMD_JOB_CREATE;
	req.job_create = &jc;
	rc = do_call(h, &req, -1, 0, &resp);
	if (rc < 0)
		return rc;
	if (created)
		*created = resp->job_create->created;
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

/* The daemon waits up to 15 s for the coordinator's plan. */
#define ATTACH_WAIT_MS 20000u

int dte_attach(dte_t *h, const struct dte_attach_params *p, uint64_t *participant)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__AttachRequest at = DTE__ATTACH_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !p || p->size < offsetof(struct dte_attach_params, shards) || !p->job || !p->token || !p->layout ||
	    (p->role != DTE_SOURCE && p->role != DTE_SINK) || (p->nbuffers && !p->buffers))
		return DTE_ERR_INVAL;
	at.job = (char *)p->job;
	at.token = (char *)p->token;
	at.role = (char *)(p->role == DTE_SOURCE ? "source" : "sink");
	at.layout = (char *)p->layout;
	at.rank = p->rank;
	at.replica = p->replica;
	at.n_buffers = p->nbuffers;
	at.buffers = (uint64_t *)p->buffers;
	if (FITS(struct dte_attach_params, p, shards) && p->shards)
		at.shards = (char *)p->shards;
	if (FITS(struct dte_attach_params, p, flags))
		at.rederives = (p->flags & DTE_ATTACH_REDERIVES) != 0;
	req.cmd_case = DTE__REQUEST__CMD_ATTACH;
	req.attach = &at;
	rc = do_call(h, &req, -1, ATTACH_WAIT_MS, &resp);
	if (rc < 0)
		return rc;
	if (participant)
		*participant = resp->attach->participant;
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

int dte_detach(dte_t *h, const char *job, uint64_t participant)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__DetachRequest d = DTE__DETACH_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !job)
		return DTE_ERR_INVAL;
	d.job = (char *)job;
	d.participant = participant;
	req.cmd_case = DTE__REQUEST__CMD_DETACH;
	req.detach = &d;
	rc = do_call(h, &req, -1, 0, &resp);
	if (rc == DTE_OK)
		dte__response__free_unpacked(resp, NULL);
	return rc;
}

/* The request's groups, malloc'd (*hp, *pp; free both). */
static int fill_groups(const struct dte_hparams *g, const int64_t *steps, size_t n,
		       Dte__HParams **hpo, Dte__HParams ***ppo)
{
	Dte__HParams *hp;
	Dte__HParams **pp;

	*hpo = NULL;
	*ppo = NULL;
	if (n > DTE_MAX_GROUPS || (n && !g))
		return DTE_ERR_INVAL;
	hp = calloc(n ? n : 1, sizeof(*hp));
	pp = calloc(n ? n : 1, sizeof(*pp));
	if (!hp || !pp) {
		free(hp);
		free(pp);
		return DTE_ERR_NOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		dte__hparams__init(&hp[i]);
		hp[i].lr = g[i].lr;
		hp[i].beta1 = g[i].beta1;
		hp[i].beta2 = g[i].beta2;
		hp[i].eps = g[i].eps;
		hp[i].weight_decay = g[i].weight_decay;
		hp[i].variant = (char *)(g[i].variant == DTE_ADAMW_FUSED ? "fused" : "torch");
		if (steps && steps[i] == DTE_GROUP_UNCHANGED) {
			hp[i].unchanged = 1;
		} else if (steps) {
			if (steps[i] < 0) {
				free(hp);
				free(pp);
				return DTE_ERR_INVAL;
			}
			hp[i].step = steps[i];
		}
		pp[i] = &hp[i];
	}
	*hpo = hp;
	*ppo = pp;
	return DTE_OK;
}

int dte_publish(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		int64_t step, const struct dte_hparams *groups, size_t ngroups,
		struct dte_publish_info *info)
{
	return dte_publish_steps(h, job, participant, version, step, groups, NULL, ngroups, info);
}

static void fill_publish_info(struct dte_publish_info *info, const Dte__PublishReply *r,
			      int captured)
{
	typedef struct dte_publish_info T;

	info->field_mask = 0;
	if (FITS(T, info, dense)) {
		info->sinks = r->sinks;
		info->dense = r->dense;
		info->field_mask |= DTE_PUBLISH_COUNTS;
	}
	if (FITS(T, info, bytes)) {
		info->changed = r->changed;
		info->elements = r->elements;
		info->bytes = r->bytes;
		info->field_mask |= DTE_PUBLISH_SIZES;
	}
	if (FITS(T, info, capture_ms)) {
		info->capture_ms = r->capture_ms;
		info->field_mask |= DTE_PUBLISH_TIME;
	}
	if (FITS(T, info, captured)) {
		info->captured = captured;
		info->field_mask |= DTE_PUBLISH_CAPTURED;
	}
	if (FITS(T, info, cuda_event_len)) {
		size_t n = r->cuda_capture_event.len;

		info->cuda_event_len = 0;
		if (n && n <= sizeof(info->cuda_event)) {
			memcpy(info->cuda_event, r->cuda_capture_event.data, n);
			info->cuda_event_len = (uint32_t)n;
			info->field_mask |= DTE_PUBLISH_CUDA_EVENT;
		}
	}
}

int dte_publish_steps(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		      int64_t step, const struct dte_hparams *groups, const int64_t *group_steps,
		      size_t ngroups, struct dte_publish_info *info)
{
	return dte_publish_ex(h, job, participant, version, step, groups, group_steps, ngroups, 0,
			      info);
}

int dte_publish_ex(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		   int64_t step, const struct dte_hparams *groups, const int64_t *group_steps,
		   size_t ngroups, unsigned flags, struct dte_publish_info *info)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__PublishRequest pr = DTE__PUBLISH_REQUEST__INIT;
	Dte__HParams *hp, **pp;
	Dte__Response *resp;
	int rc;

	if (!h || !job || (info && info->size < offsetof(struct dte_publish_info, sinks)))
		return DTE_ERR_INVAL;
	if ((rc = fill_groups(groups, group_steps, ngroups, &hp, &pp)) < 0)
		return rc;
	pr.job = (char *)job;
	pr.participant = participant;
	pr.version = version;
	pr.step = step;
	pr.n_groups = ngroups;
	pr.groups = pp;
	/* Protocol 1 knows no async: the answer then comes after the capture. */
	pr.async = (flags & DTE_PUBLISH_ASYNC) && dte__version(h) >= 2;
	req.cmd_case = DTE__REQUEST__CMD_PUBLISH;
	req.publish = &pr;
	if (pr.async) {
		/* Pipelined: the accept reply is read by the next call on the
		 * handle, its refusal returned by dte_wait_captured (dte.h). */
		rc = dte__send_async(h, &req);
		free(hp);
		free(pp);
		if (rc == DTE_OK && info) {
			typedef struct dte_publish_info T;

			memset((char *)info + offsetof(T, sinks), 0, info->size - offsetof(T, sinks));
			info->field_mask = FITS(T, info, captured) ? DTE_PUBLISH_CAPTURED : 0;
		}
		return rc;
	}
	rc = do_call(h, &req, -1, 0, &resp);
	free(hp);
	free(pp);
	if (rc < 0)
		return rc;
	if (info)
		fill_publish_info(info, resp->publish, !pr.async);
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

int dte_wait_captured(dte_t *h, const char *job, uint64_t participant, uint64_t version,
		      unsigned timeout_ms, struct dte_publish_info *info)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__WaitCapturedRequest w = DTE__WAIT_CAPTURED_REQUEST__INIT;
	struct dte_pending pend;
	Dte__Response *resp;
	int rc, acc;

	if (!h || !job || (info && info->size < offsetof(struct dte_publish_info, sinks)))
		return DTE_ERR_INVAL;
	if (info)
		info->field_mask = 0;
	if (dte__version(h) < 2)
		return DTE_OK;  /* protocol 1: the publish answered after its capture */
	/* The publish's own answer first: a refused version never had a
	 * capture (the daemon's answer about it would be another's). */
	if ((acc = dte__take_pending(h, job, participant, version, &pend)) < 0)
		return acc;
	w.job = (char *)job;
	w.participant = participant;
	w.version = version;
	w.timeout_ms = timeout_ms;
	req.cmd_case = DTE__REQUEST__CMD_WAIT_CAPTURED;
	req.wait_captured = &w;
	rc = do_call(h, &req, -1, timeout_ms, &resp);
	if (rc < 0)
		return rc;
	if (info && resp->wait_captured && resp->wait_captured->publish)
		fill_publish_info(info, resp->wait_captured->publish, 1);
	if (info && acc == 1 && pend.cuda_event_len && FITS(struct dte_publish_info, info,
							   cuda_event_len) &&
	    !(info->field_mask & DTE_PUBLISH_CUDA_EVENT)) {
		memcpy(info->cuda_event, pend.cuda_event, pend.cuda_event_len);
		info->cuda_event_len = pend.cuda_event_len;
		info->field_mask |= DTE_PUBLISH_CUDA_EVENT;
	}
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

int dte_mark(dte_t *h, const char *job, uint64_t participant, int64_t step,
	     const struct dte_hparams *groups, size_t ngroups, uint64_t *dirty)
{
	return dte_mark_steps(h, job, participant, step, groups, NULL, ngroups, dirty);
}

int dte_mark_steps(dte_t *h, const char *job, uint64_t participant, int64_t step,
		   const struct dte_hparams *groups, const int64_t *group_steps, size_t ngroups,
		   uint64_t *dirty)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__MarkRequest mr = DTE__MARK_REQUEST__INIT;
	Dte__HParams *hp, **pp;
	Dte__Response *resp;
	int rc;

	if (!h || !job)
		return DTE_ERR_INVAL;
	if ((rc = fill_groups(groups, group_steps, ngroups, &hp, &pp)) < 0)
		return rc;
	mr.job = (char *)job;
	mr.participant = participant;
	mr.step = step;
	mr.n_groups = ngroups;
	mr.groups = pp;
	req.cmd_case = DTE__REQUEST__CMD_MARK;
	req.mark = &mr;
	rc = do_call(h, &req, -1, 0, &resp);
	free(hp);
	free(pp);
	if (rc < 0)
		return rc;
	if (dirty)
		*dirty = resp->mark->dirty;
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

int dte_wait(dte_t *h, const char *job, uint64_t version, unsigned timeout_ms)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__WaitRequest w = DTE__WAIT_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !job)
		return DTE_ERR_INVAL;
	w.job = (char *)job;
	w.version = version;
	w.timeout_ms = timeout_ms;
	req.cmd_case = DTE__REQUEST__CMD_WAIT;
	req.wait = &w;
	rc = do_call(h, &req, -1, timeout_ms, &resp);
	if (rc == DTE_OK)
		dte__response__free_unpacked(resp, NULL);
	return rc;
}

int dte_wait_staged(dte_t *h, const char *job, uint64_t participant, unsigned timeout_ms,
		    uint64_t *version)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__WaitStagedRequest w = DTE__WAIT_STAGED_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !job)
		return DTE_ERR_INVAL;
	w.job = (char *)job;
	w.participant = participant;
	w.timeout_ms = timeout_ms;
	req.cmd_case = DTE__REQUEST__CMD_WAIT_STAGED;
	req.wait_staged = &w;
	rc = do_call(h, &req, -1, timeout_ms, &resp);
	if (rc < 0)
		return rc;
	if (version)
		*version = resp->wait_staged->version;
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

int dte_apply(dte_t *h, const char *job, uint64_t participant, uint64_t version,
	      struct dte_apply_info *info)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__ApplyRequest a = DTE__APPLY_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !job || (info && info->size < offsetof(struct dte_apply_info, version)))
		return DTE_ERR_INVAL;
	a.job = (char *)job;
	a.participant = participant;
	a.version = version;
	req.cmd_case = DTE__REQUEST__CMD_APPLY;
	req.apply = &a;
	rc = do_call(h, &req, -1, 0, &resp);
	if (rc < 0)
		return rc;
	if (info) {
		const Dte__ApplyReply *r = resp->apply;
		typedef struct dte_apply_info T;

		info->field_mask = 0;
		if (FITS(T, info, applied)) {
			info->version = r->version;
			info->applied = r->applied;
			info->field_mask |= DTE_APPLY_VERSION;
		}
		if (FITS(T, info, checksum_failures)) {
			info->checksum_ok = r->checksum_ok;
			info->checksum_failures = r->checksum_failures;
			info->field_mask |= DTE_APPLY_CHECKSUM;
		}
		if (FITS(T, info, apply_ms)) {
			info->apply_ms = r->apply_ms;
			info->field_mask |= DTE_APPLY_TIME;
		}
	}
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

int dte_query_version(dte_t *h, const char *job, uint64_t participant, uint64_t *applied,
		      uint64_t *staged)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__QueryVersionRequest q = DTE__QUERY_VERSION_REQUEST__INIT;
	Dte__Response *resp;
	int rc;

	if (!h || !job)
		return DTE_ERR_INVAL;
	q.job = (char *)job;
	q.participant = participant;
	req.cmd_case = DTE__REQUEST__CMD_QUERY_VERSION;
	req.query_version = &q;
	rc = do_call(h, &req, -1, 0, &resp);
	if (rc < 0)
		return rc;
	if (applied)
		*applied = resp->query_version->applied;
	if (staged)
		*staged = resp->query_version->staged;
	dte__response__free_unpacked(resp, NULL);
	return DTE_OK;
}

/* Builds the layout a client asks about; DTE_OK, or DTE_ERR_INVAL with
 * the reason in err. */
static int client_layout(const char *fn, const char *model_config, const char *layout, int role,
			 size_t cap, const void *out, const size_t *n, struct dte_layout *l,
			 char *err, size_t errlen)
{
	struct dte_spec spec;
	char e[256];

	if (!model_config || !layout || !n || (cap && !out) ||
	    (role != DTE_SOURCE && role != DTE_SINK)) {
		if (err && errlen)
			snprintf(err, errlen, "%s: bad argument", fn);
		return DTE_ERR_INVAL;
	}
	if (dte_spec_load_string(&spec, model_config, e, sizeof(e)) < 0) {
		if (err && errlen)
			snprintf(err, errlen, "model config: %s", e);
		return DTE_ERR_INVAL;
	}
	if (dte_layout_from_desc(l, &spec, layout, role == DTE_SOURCE ? DTE_LAYOUT_SOURCE :
				 DTE_LAYOUT_SINK, e, sizeof(e))) {
		if (err && errlen)
			snprintf(err, errlen, "%s", e);
		dte_spec_fini(&spec);
		return DTE_ERR_INVAL;
	}
	dte_spec_fini(&spec);
	return DTE_OK;
}

int dte_layout_buffers(const char *model_config, const char *layout, int role, uint32_t rank,
		       struct dte_layout_buffer_info *out, size_t cap, size_t *n, char *err,
		       size_t errlen)
{
	struct dte_layout l;
	size_t k = 0;
	int rc = client_layout("dte_layout_buffers", model_config, layout, role, cap, out, n, &l,
			       err, errlen);

	if (rc != DTE_OK)
		return rc;
	for (size_t i = 0; i < l.nbufs; i++) {
		if (l.bufs[i].rank != rank)
			continue;
		if (k < cap) {
			out[k].id = l.bufs[i].id;
			out[k].length = role == DTE_SINK ?
				dte_layout_units(&l, rank, l.bufs[i].id, l.bufs[i].length) :
				l.bufs[i].length;
			snprintf(out[k].name, sizeof(out[k].name), "%s", l.bufs[i].name);
		}
		k++;
	}
	*n = k;
	dte_layout_fini(&l);
	return DTE_OK;
}

_Static_assert(sizeof(((struct dte_layout_tensor_info *)0)->shape) ==
	       DTE_MAX_DIMS * sizeof(int64_t), "dte.h shape[] must hold DTE_MAX_DIMS dims");
_Static_assert(sizeof(((struct dte_layout_tensor_info *)0)->name) == DTE_LAYOUT_NAME_MAX,
	       "dte.h name[] must hold DTE_LAYOUT_NAME_MAX");

int dte_layout_tensors(const char *model_config, const char *layout, int role, uint32_t rank,
		       struct dte_layout_tensor_info *out, size_t cap, size_t *n, char *err,
		       size_t errlen)
{
	struct dte_layout l;
	size_t k = 0;
	int rc = client_layout("dte_layout_tensors", model_config, layout, role, cap, out, n, &l,
			       err, errlen);

	if (rc != DTE_OK)
		return rc;
	for (size_t i = 0; i < l.ntensors; i++) {
		const struct dte_layout_tensor *t = &l.tensors[i];

		if (t->rank != rank)
			continue;
		if (k < cap) {
			memset(&out[k], 0, sizeof(out[k]));
			out[k].buffer = t->buf;
			out[k].ndim = t->ndim;
			out[k].offset = t->offset;
			memcpy(out[k].shape, t->shape, t->ndim * sizeof(t->shape[0]));
			snprintf(out[k].name, sizeof(out[k].name), "%s", t->name);
		}
		k++;
	}
	*n = k;
	dte_layout_fini(&l);
	return DTE_OK;
}

_Static_assert(sizeof(((struct dte_model_tensor_name *)0)->name) == DTE_SPEC_NAME_MAX,
	       "dte.h dte_model_tensor_name.name[] must hold DTE_SPEC_NAME_MAX");

int dte_model_fp32_tensors(const char *model_config, struct dte_model_tensor_name *out, size_t cap,
			   size_t *n, char *err, size_t errlen)
{
	struct dte_spec spec;
	size_t k = 0;
	char e[256];

	if (!model_config || !n || (cap && !out)) {
		if (err && errlen)
			snprintf(err, errlen, "dte_model_fp32_tensors: bad argument");
		return DTE_ERR_INVAL;
	}
	if (dte_spec_load_string(&spec, model_config, e, sizeof(e)) < 0) {
		if (err && errlen)
			snprintf(err, errlen, "model config: %s", e);
		return DTE_ERR_INVAL;
	}
	for (uint32_t i = 0; i < spec.n; i++) {
		if (!dte_spec_is_halves(&spec, i))
			continue;
		if (k < cap)
			snprintf(out[k].name, sizeof(out[k].name), "%s", spec.t[i].name);
		k++;
	}
	*n = k;
	dte_spec_fini(&spec);
	return DTE_OK;
}
