/* tests/unit/test_proto.c — request decoding and the dispatch ladder,
 * driven with raw bytes: garbage never crashes, hello comes first, every
 * reply carries a code and a message, the command table matches dte.proto. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/dispatch.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "proto/cmdtab.h"
#include "proto/frame.h"

static struct dconf conf;
static struct dsrv srv;

static int setup(void **state)
{
	char err[128];

	dlog_init(DLOG_ERROR);
	dconf_defaults(&conf);
	snprintf(conf.node_name, sizeof(conf.node_name), "unit");
	assert_int_equal(dconf_finish(&conf, err, sizeof(err)), 0);
	memset(&srv, 0, sizeof(srv));
	srv.conf = &conf;
	srv.backend = "cpu";
	srv.start_ns = uv_hrtime();
	dreg_init();
	return 0;
}

/* Run one request (packed body) through the ladder; returns the decoded
 * reply, which the caller frees. */
static Dte__Response *roundtrip(struct dsess *s, const uint8_t *body, size_t len)
{
	uint8_t *out;
	size_t olen;
	Dte__Response *resp;

	assert_int_equal(ddispatch(&srv, s, body, len, &out, &olen), 0);
	assert_true(olen > 4);
	assert_int_equal(out[0] | out[1] << 8 | out[2] << 16 | (uint32_t)out[3] << 24, olen - 4);
	resp = dte__response__unpack(NULL, olen - 4, out + 4);
	free(out);
	assert_non_null(resp);
	if (resp->code != DTE__STATUS__STATUS_OK)
		assert_true(resp->message && resp->message[0]);
	return resp;
}

static Dte__Response *send_req(struct dsess *s, Dte__Request *req)
{
	uint8_t buf[1024];
	size_t len = dte__request__get_packed_size(req);

	assert_true(len <= sizeof(buf));
	dte__request__pack(req, buf);
	return roundtrip(s, buf, len);
}

static Dte__Response *hello(struct dsess *s, uint32_t lo, uint32_t hi)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__HelloRequest h = DTE__HELLO_REQUEST__INIT;

	h.min_version = lo;
	h.max_version = hi;
	req.id = 7;
	req.cmd_case = DTE__REQUEST__CMD_HELLO;
	req.hello = &h;
	return send_req(s, &req);
}

static Dte__Response *status(struct dsess *s)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__StatusRequest st = DTE__STATUS_REQUEST__INIT;

	req.id = 8;
	req.cmd_case = DTE__REQUEST__CMD_STATUS;
	req.status = &st;
	return send_req(s, &req);
}

static void test_hello_then_status(void **state)
{
	struct dsess s = { 0 };
	Dte__Response *r = hello(&s, 1, 5);

	assert_int_equal(r->code, DTE__STATUS__STATUS_OK);
	assert_int_equal(r->id, 7);
	assert_int_equal(r->body_case, DTE__RESPONSE__BODY_HELLO);
	assert_int_equal(r->hello->version, DTE_PROTO_VERSION);
	assert_string_equal(r->hello->daemon_version, DTE_VERSION);
	assert_string_equal(r->hello->node_name, "unit");
	assert_false(s.close_after);
	dte__response__free_unpacked(r, NULL);

	srv.clients = 3;
	srv.refused = 2;
	dreg_job_added();
	r = status(&s);
	assert_int_equal(r->code, DTE__STATUS__STATUS_OK);
	assert_int_equal(r->body_case, DTE__RESPONSE__BODY_STATUS);
	assert_string_equal(r->status->version, DTE_VERSION);
	assert_int_equal(r->status->protocol, DTE_PROTO_VERSION);
	assert_string_equal(r->status->backend, "cpu");
	assert_int_equal(r->status->jobs, 1);
	assert_int_equal(r->status->peers, 0);
	assert_int_equal(r->status->clients, 3);
	assert_int_equal(r->status->refused, 2);
	assert_int_equal(r->status->pid, getpid());
	dte__response__free_unpacked(r, NULL);
	dreg_job_removed();
	assert_false(s.close_after);
}

static void test_status_before_hello(void **state)
{
	struct dsess s = { 0 };
	Dte__Response *r = status(&s);

	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_PROTOCOL);
	assert_non_null(strstr(r->message, "before hello"));
	assert_int_equal(r->body_case, DTE__RESPONSE__BODY__NOT_SET);
	assert_true(s.close_after);
	dte__response__free_unpacked(r, NULL);
}

static void test_version_mismatch(void **state)
{
	struct dsess s = { 0 };
	Dte__Response *r = hello(&s, DTE_PROTO_VERSION + 1, DTE_PROTO_VERSION + 3);

	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_VERSION);
	assert_non_null(strstr(r->message, "no common protocol version"));
	assert_true(s.close_after);
	assert_int_equal(s.version, 0);
	dte__response__free_unpacked(r, NULL);

	struct dsess s2 = { 0 };

	r = hello(&s2, 3, 1); /* inverted range */
	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_VERSION);
	dte__response__free_unpacked(r, NULL);
}

static void test_unknown_command(void **state)
{
	/* Field 99, length-delimited, empty: a command from a newer client. */
	const uint8_t body[] = { 0x08, 0x05, 0x9a, 0x06, 0x00 };
	struct dsess s = { .version = 1 };
	Dte__Response *r = roundtrip(&s, body, sizeof(body));

	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND);
	assert_non_null(strstr(r->message, "99"));
	assert_int_equal(r->id, 5);
	assert_true(s.close_after);
	dte__response__free_unpacked(r, NULL);

	/* An id and nothing else names no command. */
	const uint8_t idonly[] = { 0x08, 0x01 };
	struct dsess s2 = { .version = 1 };

	r = roundtrip(&s2, idonly, sizeof(idonly));
	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_PROTOCOL);
	assert_true(s2.close_after);
	dte__response__free_unpacked(r, NULL);
}

static void test_denied(void **state)
{
	struct dsess s = { .denied = 1, .uid = 65534 };
	Dte__Response *r = hello(&s, 1, 1);

	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_DENIED);
	assert_non_null(strstr(r->message, "65534"));
	assert_true(s.close_after);
	assert_int_equal(s.version, 0);
	dte__response__free_unpacked(r, NULL);
}

static void test_undecodable(void **state)
{
	const uint8_t bad[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	struct dsess s = { 0 };
	Dte__Response *r = roundtrip(&s, bad, sizeof(bad));

	assert_int_equal(r->code, DTE__STATUS__STATUS_ERR_PROTOCOL);
	assert_true(s.close_after);
	dte__response__free_unpacked(r, NULL);
}

/* Random bytes, and random mutations of valid requests, through the
 * decoder and the whole ladder: any reply is fine, a crash or a leak
 * (under ASan) is not. */
static void test_garbage_never_crashes(void **state)
{
	uint8_t valid[64], buf[256];
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__HelloRequest h = DTE__HELLO_REQUEST__INIT;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	size_t vlen;

	h.min_version = 1;
	h.max_version = 1;
	h.client = "fuzz";
	req.cmd_case = DTE__REQUEST__CMD_HELLO;
	req.hello = &h;
	vlen = dte__request__pack(&req, valid);

	for (int iter = 0; iter < 20000; iter++) {
		size_t len;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (iter & 1) {
			len = 1 + x % sizeof(buf);
			for (size_t i = 0; i < len; i++) {
				x ^= x << 13; x ^= x >> 7; x ^= x << 17;
				buf[i] = (uint8_t)x;
			}
		} else {
			memcpy(buf, valid, vlen);
			len = vlen;
			for (int m = 0; m < 3; m++) {
				x ^= x << 13; x ^= x >> 7; x ^= x << 17;
				buf[x % vlen] = (uint8_t)(x >> 32);
			}
			len = 1 + (x >> 40) % vlen;
		}
		Dte__Request *d = dte__request__unpack(NULL, len, buf);

		if (d)
			dte__request__free_unpacked(d, NULL);

		struct dsess s = { .version = (uint32_t)(iter & 2) >> 1 };
		uint8_t *out;
		size_t olen;

		assert_int_equal(ddispatch(&srv, &s, buf, len, &out, &olen), 0);
		Dte__Response *r = dte__response__unpack(NULL, olen - 4, out + 4);

		assert_non_null(r);
		if (r->code != DTE__STATUS__STATUS_OK) {
			assert_true(r->message[0] != '\0');
			assert_true(s.close_after || r->code == DTE__STATUS__STATUS_ERR_UNIMPLEMENTED);
		}
		dte__response__free_unpacked(r, NULL);
		free(out);
	}
}

/* The command table, dte.proto and the daemon's handlers agree. */
static void test_cmdtab_consistent(void **state)
{
	for (size_t i = 0; i < DTE_CMD__COUNT; i++) {
		const struct dte_cmd *c = &dte_cmdtab[i];

		assert_int_equal(c->id, i);
		assert_ptr_equal(dte_cmd_by_name(c->name), c);
		if (!(c->flags & DTE_CMD_DAEMON)) {
			assert_int_equal(c->field, 0);
			continue;
		}
		const ProtobufCFieldDescriptor *rq =
			protobuf_c_message_descriptor_get_field(&dte__request__descriptor, c->field);
		const ProtobufCFieldDescriptor *rs =
			protobuf_c_message_descriptor_get_field(&dte__response__descriptor, c->field);
		/* A command name may use '-' where a proto identifier has '_'. */
		char ident[64];

		snprintf(ident, sizeof(ident), "%s", c->name);
		for (char *p = ident; *p; p++)
			if (*p == '-')
				*p = '_';
		if (!rq || !rs || strcmp(rq->name, ident) || strcmp(rs->name, ident))
			fail_msg("%s: field %u is not '%s' in Request.cmd and Response.body",
				 c->name, c->field, c->name);
		assert_ptr_equal(dte_cmd_by_field(c->field), c);
		if (!ddispatch_handler(c->id))
			fail_msg("daemon command %s has no handler in daemon/dispatch.c", c->name);
	}
	assert_null(dte_cmd_by_name("nope"));
	assert_null(dte_cmd_by_field(0));
	assert_null(dte_cmd_by_field(99));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_then_status),
		cmocka_unit_test(test_status_before_hello),
		cmocka_unit_test(test_version_mismatch),
		cmocka_unit_test(test_unknown_command),
		cmocka_unit_test(test_denied),
		cmocka_unit_test(test_undecodable),
		cmocka_unit_test(test_garbage_never_crashes),
		cmocka_unit_test(test_cmdtab_consistent),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
