/* proto/frame.h — length-prefixed frames on a byte stream.
 *
 * A frame is a 4-byte little-endian body length followed by the body (one
 * protobuf message).  The reader is fed whatever the socket delivered —
 * one byte, half a header, three frames at once — and hands back complete
 * bodies.  It never allocates for a claimed length before checking it
 * against the cap, so a 0xFFFFFFFF prefix costs nothing but an error.
 */
#ifndef DTE_FRAME_H
#define DTE_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#define DTE_FRAME_HDR 4u

enum dte_frame_rc {
	DTE_FRAME_NEED = 0,      /* all input used, frame not complete yet */
	DTE_FRAME_READY = 1,     /* body and len hold one complete frame */
	DTE_FRAME_ETOOBIG = -1,  /* length prefix over the cap */
	DTE_FRAME_EEMPTY = -2,   /* zero length: no message is empty */
	DTE_FRAME_ENOMEM = -3,
};

struct dte_frame_reader {
	uint32_t max;            /* cap on body length */
	uint8_t  hdr[DTE_FRAME_HDR];
	uint32_t hdr_have;
	uint32_t want;           /* body length, valid once the header is in */
	uint32_t have;
	int      delivered;      /* last call returned a frame: reset first */
	uint8_t *buf;
	size_t   bufcap;
};

void dte_frame_reader_init(struct dte_frame_reader *r, uint32_t max);
void dte_frame_reader_fini(struct dte_frame_reader *r);

/* Consume bytes from data[0..n) up to the end of one frame.  *used says how
 * many were taken (call again with the rest: frames may be coalesced).  On
 * DTE_FRAME_READY, *body and *len describe the frame until the next call.
 * After an error the reader is unusable (the stream has lost sync). */
int dte_frame_feed(struct dte_frame_reader *r, const void *data, size_t n,
		   size_t *used, const uint8_t **body, uint32_t *len);

/* The length the peer claimed (for error messages), 0 if no header yet. */
uint32_t dte_frame_claimed(const struct dte_frame_reader *r);

/* True while a frame is partly received (stream ended mid-frame). */
int dte_frame_partial(const struct dte_frame_reader *r);

/* Serialize `m` as one frame into a fresh malloc()ed buffer.  Fails with
 * DTE_FRAME_ETOOBIG when the body would exceed `max`. */
int dte_frame_pack(const ProtobufCMessage *m, uint32_t max, uint8_t **out, size_t *outlen);

const char *dte_frame_strerror(int rc);

#endif
