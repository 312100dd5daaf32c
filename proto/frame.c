/* proto/frame.c — incremental, bounded frame reader and frame packer. */
#include <stdlib.h>
#include <string.h>
#include "proto/frame.h"

/* Buffers above this are returned after each frame, so an idle connection
 * that once sent a big request does not keep holding it. */
#define KEEP_BUF_BYTES (64u * 1024u)

void dte_frame_reader_init(struct dte_frame_reader *r, uint32_t max)
{
	memset(r, 0, sizeof(*r));
	r->max = max;
}

void dte_frame_reader_fini(struct dte_frame_reader *r)
{
	free(r->buf);
	r->buf = NULL;
	r->bufcap = 0;
}

static void reader_reset(struct dte_frame_reader *r)
{
	r->hdr_have = 0;
	r->want = 0;
	r->have = 0;
	r->delivered = 0;
	if (r->bufcap > KEEP_BUF_BYTES) {
		free(r->buf);
		r->buf = NULL;
		r->bufcap = 0;
	}
}

int dte_frame_feed(struct dte_frame_reader *r, const void *data, size_t n,
		   size_t *used, const uint8_t **body, uint32_t *len)
{
	const uint8_t *p = data;
	size_t off = 0;

	*used = 0;
	if (r->delivered)
		reader_reset(r);

	while (r->hdr_have < DTE_FRAME_HDR && off < n)
		r->hdr[r->hdr_have++] = p[off++];
	if (r->hdr_have < DTE_FRAME_HDR) {
		*used = off;
		return DTE_FRAME_NEED;
	}
	if (r->want == 0) {
		uint32_t claimed = (uint32_t)r->hdr[0] | (uint32_t)r->hdr[1] << 8 |
				   (uint32_t)r->hdr[2] << 16 | (uint32_t)r->hdr[3] << 24;
		*used = off;
		if (claimed == 0)
			return DTE_FRAME_EEMPTY;
		if (claimed > r->max)
			return DTE_FRAME_ETOOBIG;
		/* Only now, with the length checked, may memory be committed. */
		if (r->bufcap < claimed) {
			uint8_t *nb = realloc(r->buf, claimed);

			if (!nb)
				return DTE_FRAME_ENOMEM;
			r->buf = nb;
			r->bufcap = claimed;
		}
		r->want = claimed;
	}

	size_t take = r->want - r->have;

	if (take > n - off)
		take = n - off;
	memcpy(r->buf + r->have, p + off, take);
	r->have += (uint32_t)take;
	off += take;
	*used = off;
	if (r->have < r->want)
		return DTE_FRAME_NEED;

	r->delivered = 1;
	*body = r->buf;
	*len = r->want;
	return DTE_FRAME_READY;
}

uint32_t dte_frame_claimed(const struct dte_frame_reader *r)
{
	if (r->hdr_have < DTE_FRAME_HDR)
		return 0;
	return (uint32_t)r->hdr[0] | (uint32_t)r->hdr[1] << 8 |
	       (uint32_t)r->hdr[2] << 16 | (uint32_t)r->hdr[3] << 24;
}

int dte_frame_partial(const struct dte_frame_reader *r)
{
	return !r->delivered && r->hdr_have > 0;
}

int dte_frame_pack(const ProtobufCMessage *m, uint32_t max, uint8_t **out, size_t *outlen)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	uint8_t *buf;

	if (len == 0 || len > max)
		return len == 0 ? DTE_FRAME_EEMPTY : DTE_FRAME_ETOOBIG;
	buf = malloc(DTE_FRAME_HDR + len);
	if (!buf)
		return DTE_FRAME_ENOMEM;
	buf[0] = (uint8_t)len;
	buf[1] = (uint8_t)(len >> 8);
	buf[2] = (uint8_t)(len >> 16);
	buf[3] = (uint8_t)(len >> 24);
	protobuf_c_message_pack(m, buf + DTE_FRAME_HDR);
	*out = buf;
	*outlen = DTE_FRAME_HDR + len;
	return 0;
}

const char *dte_frame_strerror(int rc)
{
	switch (rc) {
	case DTE_FRAME_NEED: return "incomplete frame";
	case DTE_FRAME_READY: return "frame ready";
	case DTE_FRAME_ETOOBIG: return "frame length over the cap";
	case DTE_FRAME_EEMPTY: return "zero-length frame";
	case DTE_FRAME_ENOMEM: return "out of memory";
	}
	return "unknown frame error";
}
