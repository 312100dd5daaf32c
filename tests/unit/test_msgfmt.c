/* tests/unit/test_msgfmt.c — dtectl's descriptor-driven printing and
 * argument parsing, the path every command without a printer takes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "client/msgfmt.h"
#include "proto/dte.pb-c.h"

static char *print_to_string(const ProtobufCMessage *m)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	dte_msg_print(f, m, "");
	fclose(f);
	return buf;
}

static void test_text_and_json(void **state)
{
	Dte__StatusReply st = DTE__STATUS_REPLY__INIT;
	char *text;
	json_t *j;

	st.version = "9.9.9";
	st.protocol = 1;
	st.uptime_s = 12;
	st.backend = "cpu";
	st.refused = 18446744073709551615ull;
	text = print_to_string(&st.base);
	assert_non_null(strstr(text, "version: 9.9.9\n"));
	assert_non_null(strstr(text, "protocol: 1\n"));
	assert_non_null(strstr(text, "uptime_s: 12\n"));
	assert_non_null(strstr(text, "jobs: 0\n"));
	assert_non_null(strstr(text, "refused: 18446744073709551615\n"));
	free(text);

	j = dte_msg_to_json(&st.base);
	assert_string_equal(json_string_value(json_object_get(j, "backend")), "cpu");
	assert_int_equal(json_integer_value(json_object_get(j, "uptime_s")), 12);
	assert_int_equal(json_integer_value(json_object_get(j, "peers")), 0);
	/* above INT64_MAX: a decimal string, never a wrapped negative number */
	assert_string_equal(json_string_value(json_object_get(j, "refused")),
			    "18446744073709551615");
	json_decref(j);

	st.refused = 9223372036854775807ull;
	j = dte_msg_to_json(&st.base);
	assert_true(json_is_integer(json_object_get(j, "refused")));
	assert_true(json_integer_value(json_object_get(j, "refused")) == INT64_MAX);
	json_decref(j);
}

static void test_nested_oneof_and_enum(void **state)
{
	Dte__Response resp = DTE__RESPONSE__INIT;
	Dte__PingReply ping = DTE__PING_REPLY__INIT;
	char *text;
	json_t *j;

	ping.nonce = 42;
	resp.code = DTE__STATUS__STATUS_ERR_BUSY;
	resp.body_case = DTE__RESPONSE__BODY_PING;
	resp.ping = &ping;
	text = print_to_string(&resp.base);
	assert_non_null(strstr(text, "code: STATUS_ERR_BUSY\n"));
	assert_non_null(strstr(text, "ping.nonce: 42\n"));
	/* Unchosen oneof members are not printed. */
	assert_null(strstr(text, "hello."));
	assert_null(strstr(text, "status."));
	free(text);

	j = dte_msg_to_json(&resp.base);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "ping"), "nonce")), 42);
	assert_null(json_object_get(j, "hello"));
	json_decref(j);
}

/* Ids and epochs print in hex (0x, the log's digits), spec hashes as 16
 * hex digits; JSON keeps them numbers; arguments take the hex back. */
static void test_ids_in_hex(void **state)
{
	Dte__JobReply jr = DTE__JOB_REPLY__INIT;
	Dte__ParticipantInfo p = DTE__PARTICIPANT_INFO__INIT, *ps[1] = { &p };
	Dte__ResyncRequest rq = DTE__RESYNC_REQUEST__INIT;
	char *argv[] = { "job1", "0x5a0b1b3200000003" };
	char err[128], *text;
	json_t *j;

	jr.epoch = 0x7802737de1000002ull;
	jr.spec_hash = 0xabcull;
	jr.n_participants = 1;
	jr.participants = ps;
	p.id = 0x5a0b1b3200000003ull;
	p.version = 12;
	text = print_to_string(&jr.base);
	assert_non_null(strstr(text, "epoch: 0x7802737de1000002\n"));
	assert_non_null(strstr(text, "spec_hash: 0000000000000abc\n"));
	assert_non_null(strstr(text, "participants[0].id: 0x5a0b1b3200000003\n"));
	assert_non_null(strstr(text, "participants[0].version: 12\n"));
	free(text);
	j = dte_msg_to_json(&jr.base);
	assert_true(json_integer_value(json_object_get(j, "epoch")) == 0x7802737de1000002ll);
	json_decref(j);
	assert_int_equal(dte_msg_from_args(&rq.base, 2, argv, err, sizeof(err)), 0);
	assert_true(rq.sink == 0x5a0b1b3200000003ull);
}

static void test_from_args(void **state)
{
	Dte__HelloRequest h = DTE__HELLO_REQUEST__INIT;
	char a0[] = "2", a1[] = "client=me", a2[] = "max_version=7";
	char *ok[] = { a0, a1, a2 };
	char err[128];

	assert_int_equal(dte_msg_from_args(&h.base, 3, ok, err, sizeof(err)), 0);
	assert_int_equal(h.min_version, 2);
	assert_int_equal(h.max_version, 7);
	assert_string_equal(h.client, "me");

	char b0[] = "min_version=-1";
	char *neg[] = { b0 };

	assert_int_equal(dte_msg_from_args(&h.base, 1, neg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "min_version"));

	char c0[] = "max_version=99999999999";
	char *big[] = { c0 };

	assert_int_equal(dte_msg_from_args(&h.base, 1, big, err, sizeof(err)), -1);

	char d0[] = "nosuch=1";
	char *unk[] = { d0 };

	assert_int_equal(dte_msg_from_args(&h.base, 1, unk, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "nosuch"));

	char e0[] = "1", e1[] = "2", e2[] = "x", e3[] = "extra";
	char *many[] = { e0, e1, e2, e3 };

	assert_int_equal(dte_msg_from_args(&h.base, 4, many, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "too many"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_and_json),
		cmocka_unit_test(test_nested_oneof_and_enum),
		cmocka_unit_test(test_from_args),
		cmocka_unit_test(test_ids_in_hex),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
