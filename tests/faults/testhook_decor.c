/* tests/faults/testhook_decor.c — testhook.c's faults as decorators of the
 * production objects' extension points: the remote transport
 * (struct route_decorator, route.h), the capture, the sink's staged
 * values and the storage reader's read (struct job_ext, job_ext.h).
 *
 * Linked, with testhook.c, only into the test build of the daemon
 * ($(B)/tests/dted-faults, tests/faults/faults.mk); the production dted
 * has neither and never reads DTE_TEST_HOOK.  The constructor below
 * installs the decorators before main() runs; route_init() then calls
 * testhook_init(), which reads DTE_TEST_HOOK and refuses a malformed one
 * (the daemon does not start). */
#include <stdint.h>
#include <string.h>
#include "daemon/job_ext.h"
#include "daemon/route.h"
#include "tests/faults/testhook.h"

/* The remote transport being decorated (route.c keeps it valid). */
static struct route_transport inner;

static int dec_send(void *arg, const char *node, const char *address, Dtep__PeerMsgType type,
		    const uint8_t *hdr, size_t hdrlen, const void *data, size_t len)
{
	/* A fault may drop it (the daemon is dying on purpose). */
	if (testhook_send(type, hdr, hdrlen))
		return 0;
	return inner.send(inner.arg, node, address, type, hdr, hdrlen, data, len);
}

static int dec_send_given(void *arg, const char *node, const char *address,
			  Dtep__PeerMsgType type, const uint8_t *hdr, size_t hdrlen, void *data,
			  size_t len, void (*release)(void *data, void *rarg), void *rarg)
{
	if (testhook_send(type, hdr, hdrlen)) {
		release(data, rarg);
		return 0;
	}
	return inner.send_given(inner.arg, node, address, type, hdr, hdrlen, data, len, release,
				rarg);
}

static void *dec_take(void *arg, const void *data)
{
	return inner.take(inner.arg, data);
}

static void dec_wrap(const struct route_transport *t, struct route_transport *outer)
{
	inner = *t;
	/* Every member not decorated here (arg included: the decorated ones
	 * use inner.arg) passes through as it is, so a member added to
	 * struct route_transport later keeps working in the test build. */
	*outer = *t;
	outer->send = dec_send;
	outer->send_given = t->send_given ? dec_send_given : NULL;
	outer->take = t->take ? dec_take : NULL;
}

static const struct route_decorator decorator = {
	.init = testhook_init,
	.fini = testhook_fini,
	.wrap = dec_wrap,
	.deliver = testhook_deliver,
};

/* wrong-value (testhook_sink_value chose the version): flip one value,
 * the low bit of its high byte, or of the last encoded byte when the entry
 * is kept encoded. */
static void alter(void *bytes, size_t len)
{
	if (len == sizeof(uint16_t)) {
		uint16_t v;

		memcpy(&v, bytes, sizeof(v));
		v ^= 0x0100;
		memcpy(bytes, &v, sizeof(v));
	} else if (len) {
		((uint8_t *)bytes)[len - 1] ^= 0x01;
	}
}

/* skip-write (testhook_apply_select chose the version): the element the
 * apply's first sparse entry wrote first gets its old value back, as if
 * that write had been skipped. */
static void skip(uint16_t *elem, uint16_t old)
{
	*elem = old;
}

/* Every engine of this build starts with these (job_ext.h). */
const struct job_ext job_ext_builtin = {
	.capture_start = testhook_capture,
	.sink_select = testhook_sink_value,
	.sink_alter = alter,
	.storage_read = testhook_storage_read,
	.capture_wrong_drop = testhook_capture_wrong_drop,
	.apply_select = testhook_apply_select,
	.apply_skip = skip,
};

__attribute__((constructor)) static void testhook_install(void)
{
	route_set_decorator(&decorator);
}
