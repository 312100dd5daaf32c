/* tests/unit/io_filter.h — a lost record, as a test arranges it: an
 * engine I/O (daemon/engine_io.h) whose send and send_given ask a filter
 * first and lose what it picks (the record never leaves; a given
 * payload is released as the transport would release it).  Everything
 * else is the wrapped I/O's own, with its own context.
 *
 * The engine has no seam for this (issue 31: fault seams live in tests):
 * a test wraps whatever I/O it runs on (the fixture's, fix_io; or the
 * default libuv one, dte_engine_io_uv) before dte_engine_new_io.  One
 * filtered engine per test binary (the filter is this file's static). */
#ifndef DTE_TEST_IO_FILTER_H
#define DTE_TEST_IO_FILTER_H

#include "daemon/engine_io.h"

/* Nonzero: the record is lost. */
typedef int (*io_filter_fn)(const char *node, Dtep__PeerMsgType type, const ProtobufCMessage *msg,
			    const void *data, size_t len);

static struct {
	int (*send)(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
		    const ProtobufCMessage *msg, const void *data, size_t len);
	int (*send_given)(void *ctx, const char *node, const char *address,
			  Dtep__PeerMsgType type, const ProtobufCMessage *msg, void *data,
			  size_t len, void (*release)(void *data, void *rarg), void *rarg);
	io_filter_fn drop;
	unsigned long long lost;
} io_filter;

static int io_filter_send(void *ctx, const char *node, const char *address, Dtep__PeerMsgType type,
			  const ProtobufCMessage *msg, const void *data, size_t len)
{
	if (io_filter.drop && io_filter.drop(node, type, msg, data, len)) {
		io_filter.lost++;
		return 0;	/* lost on the way, as far as the sender can tell */
	}
	return io_filter.send(ctx, node, address, type, msg, data, len);
}

static int io_filter_send_given(void *ctx, const char *node, const char *address,
				Dtep__PeerMsgType type, const ProtobufCMessage *msg, void *data,
				size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	if (io_filter.drop && io_filter.drop(node, type, msg, data, len)) {
		io_filter.lost++;
		release(data, rarg);
		return 0;
	}
	return io_filter.send_given(ctx, node, address, type, msg, data, len, release, rarg);
}

/* Wraps *io in place (before dte_engine_new_io copies it). */
static inline void io_filter_wrap(struct dte_engine_io *io)
{
	io_filter.send = io->send;
	io_filter.send_given = io->send_given;
	io_filter.drop = NULL;
	io->send = io_filter_send;
	io->send_given = io_filter_send_given;
}

/* From here on, fn (NULL: none) picks the records that are lost. */
static inline void io_filter_set(io_filter_fn fn)
{
	io_filter.drop = fn;
}

#endif
