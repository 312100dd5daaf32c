/* tests/fuzz/fuzz_peer_msg.c — the UCX transport's receive side
 * (daemon/peer): the user-message wire header and the HELLO record, parsed
 * by the real active-message callbacks dte_peer__msg_cb and
 * dte_peer__hello_cb, called in-process as UCX would call them.
 *
 * No UCX worker exists here: the context is a zeroed dte_peer_ctx_t with one
 * peer whose endpoint is a dummy pointer (only compared, never used), so
 * only paths that do not touch UCX are reachable: eager messages (a
 * rendezvous one calls ucp_am_recv_data_nbx) and HELLO replies (a HELLO
 * request makes the callback answer with ucp_am_send_nbx; for those inputs
 * the harness sets the reply flag — the parse before it is the same).
 *
 * Input: [state u8][recv_attr u8][msg ids to register u8 x2][split u16]
 *        [header+data bytes...]
 * Properties: the callbacks never read outside header[0..header_len) and
 * data[0..len) (both are exact-size heap copies); a message is delivered
 * only if its wire header is well formed (magic, hdr_len consistent and
 * under DTE_PEER_HEADER_MAX, id registered, peer up), and then with the
 * user header and data exactly as sent; anything else is dropped and
 * counted, never delivered.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/peer/peer_int.h"
#include "tests/fuzz/fuzz_util.h"

static struct {
	int calls;
	unsigned msg_id;
	const uint8_t *hdr;
	size_t hdr_len;
	const uint8_t *data;
	size_t len;
	void *staged;		/* what alloc_cb handed out */
	int up_calls;
} seen;

static void on_recv(dte_peer_t *peer, unsigned msg_id, const void *header, size_t header_len,
		    void *data, size_t len, void *arg)
{
	seen.calls++;
	seen.msg_id = msg_id;
	seen.hdr = header;
	seen.hdr_len = header_len;
	seen.data = data;
	seen.len = len;
	/* Touch every byte: ASan checks the callback was given real memory. */
	volatile uint8_t sink = 0;
	for (size_t i = 0; i < header_len; i++)
		sink ^= ((const uint8_t *)header)[i];
	for (size_t i = 0; i < len; i++)
		sink ^= ((const uint8_t *)data)[i];
	(void)sink;
}

static void *on_alloc(dte_peer_t *peer, unsigned msg_id, const void *header, size_t header_len,
		      size_t len, void *arg)
{
	seen.staged = malloc(len ? len : 1);
	return seen.staged;
}

static void on_up(dte_peer_ctx_t *ctx, dte_peer_t *peer)
{
	seen.up_calls++;
}

static void on_log(int level, const char *msg, void *user_data)
{
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	uint8_t state = fuzz_u8(&in), attr = fuzz_u8(&in);
	unsigned id_a = fuzz_u8(&in), id_b = fuzz_u8(&in);
	size_t split = (size_t)fuzz_uint(&in, 2);
	dte_peer_ctx_t *ctx = calloc(1, sizeof(*ctx));
	dte_peer_t *peer = calloc(1, sizeof(*peer));
	ucp_am_recv_param_t param = { 0 };
	struct dte_peer_wire_hdr wh = { 0 };
	uint8_t *hdr, *body;
	size_t hlen, blen;
	ucs_status_t st;

	if (!ctx || !peer)
		abort();
	memset(&seen, 0, sizeof(seen));
	ctx->params.field_mask = DTE_PEER_PARAM_FIELD_LOG_CB | DTE_PEER_PARAM_FIELD_UP_CB;
	ctx->params.log_cb = on_log;
	ctx->params.up_cb = on_up;
	ctx->params.max_recv = 1u << 20;
	peer->ctx = ctx;
	peer->ep = (ucp_ep_h)(uintptr_t)0x1000;	/* compared only */
	peer->refs = 1;
	peer->state = (state & 1) ? DTE_PEER_CONNECTING : DTE_PEER_UP;
	snprintf(peer->addr, sizeof(peer->addr), "fuzz");
	ctx->peers = peer;
	if (dte_peer_handler_set(ctx, id_a, on_recv, (state & 2) ? on_alloc : NULL, NULL))
		abort();
	if (dte_peer_handler_set(ctx, id_b, on_recv, NULL, NULL))
		abort();

	/* The rest splits into the AM header and the eager data. */
	hlen = split % (in.n + 1);
	blen = in.n - hlen;
	hdr = malloc(hlen ? hlen : 1);
	body = malloc(blen ? blen : 1);
	if (!hdr || !body)
		abort();
	memcpy(hdr, in.p, hlen);
	memcpy(body, in.p + hlen, blen);

	/* No rendezvous: that path needs a UCX worker. */
	param.recv_attr = attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP;
	param.reply_ep = (state & 4) ? (ucp_ep_h)(uintptr_t)0x2000 : peer->ep;

	if (state & 8) {
		struct dte_peer_hello h = { 0 };

		if (hlen == sizeof(h)) {
			memcpy(&h, hdr, sizeof(h));
			/* A request would be answered through UCX: make it a reply. */
			h.flags |= DTE_PEER_HELLO_REPLY;
			memcpy(hdr, &h, sizeof(h));
		}
		st = dte_peer__hello_cb(ctx, hdr, hlen, body, blen, &param);
		int ok = peer->state == DTE_PEER_UP && seen.up_calls == 1;
		int valid = (state & 1) && !(state & 4) && param.recv_attr && hlen == sizeof(h) &&
			    blen == 0 && h.magic == DTE_PEER_MAGIC && h.version == DTE_PEER_VERSION;

		FUZZ_CHECK(ok == valid, "HELLO accepted=%d but well formed=%d", ok, valid);
		if (ok)
			FUZZ_CHECK(memchr(peer->remote_name, 0, sizeof(peer->remote_name)) != NULL,
				   "remote name not terminated");
		FUZZ_CHECK(seen.calls == 0, "HELLO delivered as a user message");
	} else {
		int valid = peer->state == DTE_PEER_UP && !(state & 4) && param.recv_attr &&
			    hlen >= sizeof(wh);

		if (valid) {
			memcpy(&wh, hdr, sizeof(wh));
			valid = wh.magic == DTE_PEER_MAGIC && wh.hdr_len <= DTE_PEER_HEADER_MAX &&
				hlen == sizeof(wh) + wh.hdr_len &&
				(wh.msg_id == id_a || wh.msg_id == id_b);
		}
		st = dte_peer__msg_cb(ctx, hdr, hlen, body, blen, &param);
		FUZZ_CHECK(st == UCS_OK, "eager message answered %d", (int)st);
		FUZZ_CHECK(seen.calls == valid, "delivered %d times, well formed=%d", seen.calls,
			   valid);
		if (valid) {
			FUZZ_CHECK(seen.msg_id == wh.msg_id, "delivered as id %u, sent as %u",
				   seen.msg_id, wh.msg_id);
			FUZZ_CHECK(seen.hdr_len == wh.hdr_len &&
				   memcmp(seen.hdr, hdr + sizeof(wh), wh.hdr_len) == 0,
				   "user header changed");
			FUZZ_CHECK(seen.len == blen && (blen == 0 || memcmp(seen.data, body, blen) == 0),
				   "data changed");
			FUZZ_CHECK(ctx->stats.msgs_recv == 1 && ctx->stats.bytes_recv == blen,
				   "receive counters wrong");
		} else {
			FUZZ_CHECK(ctx->stats.dropped_bad + ctx->stats.dropped_unknown == 1,
				   "a dropped message was not counted");
		}
	}
	free(seen.staged);	/* the alloc callback's buffer belongs to the caller */
	free(hdr);
	free(body);
	free(peer);
	free(ctx);
	return 0;
}
