/* daemon/peer/peer_mem.c — staging regions registered with UCX once.
 *
 * Registering per message would pin and unpin the same pages for every
 * rendezvous; a region mapped here is handed to UCX as the memh of any send
 * or receive that lies wholly inside it.
 */
#include "daemon/peer/peer_int.h"

#include <errno.h>
#include <stdlib.h>

int dte_peer_mem_map(dte_peer_ctx_t *ctx, void *addr, size_t len,
                     dte_peer_mem_t **mem_out)
{
	ucp_mem_map_params_t mp = {
		.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
		              UCP_MEM_MAP_PARAM_FIELD_LENGTH,
		.address = addr,
		.length = len,
	};
	dte_peer_mem_t *mem;
	ucs_status_t st;

	if (!ctx || !ctx->ucp || ctx->closing || !addr || !len || !mem_out)
		return -EINVAL;
	mem = calloc(1, sizeof(*mem));
	if (!mem)
		return -ENOMEM;
	st = ucp_mem_map(ctx->ucp, &mp, &mem->memh);
	if (st != UCS_OK) {
		dte_peer__log(ctx, LOG_ERR, "registering %zu bytes: %s", len,
		              ucs_status_string(st));
		free(mem);
		return dte_peer__errno(st);
	}
	mem->addr = addr;
	mem->len = len;
	mem->next = ctx->mems;
	ctx->mems = mem;
	*mem_out = mem;
	return 0;
}

int dte_peer_mem_unmap(dte_peer_ctx_t *ctx, dte_peer_mem_t *mem)
{
	dte_peer_mem_t **pp;

	if (!ctx || !mem)
		return -EINVAL;
	for (pp = &ctx->mems; *pp; pp = &(*pp)->next) {
		if (*pp == mem) {
			*pp = mem->next;
			ucp_mem_unmap(ctx->ucp, mem->memh);
			free(mem);
			return 0;
		}
	}
	return -ENOENT;
}

ucp_mem_h dte_peer__mem_find(dte_peer_ctx_t *ctx, const void *addr,
                             size_t len)
{
	const char *p = addr;
	dte_peer_mem_t *m;

	for (m = ctx->mems; m; m = m->next)
		if (p >= m->addr && len <= m->len &&
		    (size_t)(p - m->addr) <= m->len - len)
			return m->memh;
	return NULL;
}
