/* tests/fuzz/fuzz_frame.c — control frames: the incremental reader fed an
 * arbitrary byte stream in arbitrary pieces, and every frame it delivers
 * decoded and run through the daemon's dispatch ladder, as ctl.c does.
 *
 * Input: [flags u8][split seed u32][stream...].  flags picks the frame cap
 * and whether the session is denied.  Properties checked:
 *  - the reader delivers exactly the frames a one-shot parse of the whole
 *    stream finds (same bodies, same error at the same place), whatever
 *    the split, and never consumes more than it was given;
 *  - every dispatched request gets one reply frame whose length prefix is
 *    right, that decodes as a Response, echoes a decodable request's id,
 *    and carries a message whenever the code is an error;
 *  - a denied session never gets STATUS_OK and is always closed (ERR_DENIED,
 *    or ERR_PROTOCOL when the request did not even decode).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/dispatch.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "proto/frame.h"
#include "tests/fuzz/fuzz_util.h"

static struct dconf conf;
static struct dsrv srv;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[128];

	dlog_init(DLOG_ERROR);
	dconf_defaults(&conf);
	snprintf(conf.node_name, sizeof(conf.node_name), "fuzz");
	if (dconf_finish(&conf, err, sizeof(err)))
		abort();
	srv.conf = &conf;
	srv.backend = "cpu";
	srv.start_ns = uv_hrtime();
	dreg_init();
	return 0;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* What a one-shot parse finds at `*pos`: DTE_FRAME_READY with the body,
 * an error, or DTE_FRAME_NEED when the stream ends inside the frame. */
static int ref_next(const uint8_t *s, size_t n, size_t *pos, uint32_t max,
		    const uint8_t **body, uint32_t *len)
{
	uint32_t claimed;

	if (n - *pos < DTE_FRAME_HDR)
		return DTE_FRAME_NEED;
	claimed = le32(s + *pos);
	if (claimed == 0)
		return DTE_FRAME_EEMPTY;
	if (claimed > max)
		return DTE_FRAME_ETOOBIG;
	if (n - *pos - DTE_FRAME_HDR < claimed)
		return DTE_FRAME_NEED;
	*body = s + *pos + DTE_FRAME_HDR;
	*len = claimed;
	*pos += DTE_FRAME_HDR + claimed;
	return DTE_FRAME_READY;
}

static void check_reply(struct dsess *s, const uint8_t *body, uint32_t len)
{
	Dte__Request *req = dte__request__unpack(NULL, len, body);
	Dte__Response *resp;
	uint8_t *out = NULL;
	size_t olen = 0;
	int denied = s->denied;

	FUZZ_CHECK(ddispatch(&srv, s, body, len, &out, &olen) == 0, "no reply");
	FUZZ_CHECK(olen > DTE_FRAME_HDR && le32(out) == olen - DTE_FRAME_HDR,
		   "reply frame of %zu bytes has a wrong prefix", olen);
	FUZZ_CHECK(olen - DTE_FRAME_HDR <= conf.max_frame_bytes, "reply over the cap");
	resp = dte__response__unpack(NULL, olen - DTE_FRAME_HDR, out + DTE_FRAME_HDR);
	FUZZ_CHECK(resp != NULL, "reply does not decode");
	if (resp->code != DTE__STATUS__STATUS_OK)
		FUZZ_CHECK(resp->message && resp->message[0], "error %d without a message",
			   resp->code);
	if (req)
		FUZZ_CHECK(resp->id == req->id, "reply id %u for request %u", resp->id, req->id);
	else
		FUZZ_CHECK(resp->code == DTE__STATUS__STATUS_ERR_PROTOCOL && s->close_after,
			   "undecodable request answered with %d", resp->code);
	if (denied)
		FUZZ_CHECK(resp->code != DTE__STATUS__STATUS_OK && s->close_after,
			   "denied session got %d", resp->code);
	dte__response__free_unpacked(resp, NULL);
	if (req)
		dte__request__free_unpacked(req, NULL);
	free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint32_t caps[4] = { DCONF_MIN_FRAME, 4096, 65536, 4u << 20 };
	struct fuzz_in in = { data, size };
	uint8_t flags = fuzz_u8(&in);
	uint64_t seed = fuzz_uint(&in, 4);
	const uint8_t *s = in.p;
	size_t n = in.n, off = 0, refpos = 0;
	struct dte_frame_reader r;
	struct dsess sess = { .denied = (flags >> 2) & 1, .uid = 4242, .pid = 1 };
	int rc = DTE_FRAME_NEED, want;

	conf.max_frame_bytes = caps[flags & 3];
	dte_frame_reader_init(&r, conf.max_frame_bytes);
	while (off < n) {
		/* Mostly small pieces (1..16 bytes), sometimes everything left. */
		uint64_t z = fuzz_mix(&seed);
		size_t piece = (z & 7) == 0 ? n - off : 1 + (size_t)((z >> 3) % 16);
		const uint8_t *body = NULL;
		uint32_t len = 0;
		size_t used = 0;

		if (piece > n - off)
			piece = n - off;
		rc = dte_frame_feed(&r, s + off, piece, &used, &body, &len);
		FUZZ_CHECK(used <= piece, "used %zu of %zu", used, piece);
		off += used;
		if (rc == DTE_FRAME_NEED) {
			FUZZ_CHECK(used == piece, "NEED after using %zu of %zu", used, piece);
			continue;
		}
		const uint8_t *rbody = NULL;
		uint32_t rlen = 0;

		want = ref_next(s, n, &refpos, conf.max_frame_bytes, &rbody, &rlen);
		FUZZ_CHECK(rc == want, "reader says %d, whole-stream parse %d at %zu", rc, want,
			   refpos);
		if (rc != DTE_FRAME_READY)
			break;	/* the stream lost sync: ctl.c closes here */
		FUZZ_CHECK(off == refpos, "frame ends at %zu, expected %zu", off, refpos);
		FUZZ_CHECK(len == rlen && memcmp(body, rbody, len) == 0, "frame body differs");
		check_reply(&sess, body, len);
		if (sess.close_after)
			break;
	}
	if (rc == DTE_FRAME_NEED) {
		const uint8_t *rbody;
		uint32_t rlen;

		want = ref_next(s, n, &refpos, conf.max_frame_bytes, &rbody, &rlen);
		FUZZ_CHECK(want == DTE_FRAME_NEED, "reader wants more, whole-stream parse %d", want);
		FUZZ_CHECK(dte_frame_partial(&r) == (refpos < n), "partial flag wrong");
	}
	dte_frame_reader_fini(&r);
	return 0;
}
