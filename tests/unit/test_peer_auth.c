/* tests/unit/test_peer_auth.c — record MACs of peer protocol 5
 * (proto/peer_auth.h): a sealed record verifies after the wire (packed,
 * unpacked); any change to a header field, to the payload, or a record
 * sealed under another token's key, or one without a MAC, does not. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "proto/peer_auth.h"

static uint8_t key[PEER_AUTH_KEYBYTES];
static uint8_t data[4096];

static int setup(void **state)
{
	assert_int_equal(peer_auth_init(), 0);
	peer_auth_key(key, "job1", "secret-token");
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7 + 1);
	return 0;
}

/* A PAYLOAD part as a source seals it, off the wire as the receiver
 * decodes it (the caller frees it with dtep__payload__free_unpacked). */
static Dtep__Payload *wire_payload(const uint8_t *k, uint64_t version)
{
	Dtep__Payload m = DTEP__PAYLOAD__INIT;
	Dtep__JobRef ref = DTEP__JOB_REF__INIT;
	uint8_t mac[PEER_AUTH_MACBYTES], buf[512];
	size_t n;

	ref.job = "job1";
	m.job = &ref;
	m.epoch = 5;
	m.version = version;
	m.src = 1;
	m.dst = 2;
	m.part = 3;
	assert_int_equal(peer_auth_seal(k, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &m.base, data,
					sizeof(data), mac), 0);
	assert_int_equal(ref.mac.len, PEER_AUTH_MACBYTES);
	n = dtep__payload__get_packed_size(&m);
	assert_true(n <= sizeof(buf));
	dtep__payload__pack(&m, buf);
	return dtep__payload__unpack(NULL, n, buf);
}

static int check(const Dtep__Payload *p, const void *d, size_t len)
{
	return peer_auth_check(key, DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, &p->base, d, len);
}

static void test_sealed_verifies(void **state)
{
	Dtep__Payload *p = wire_payload(key, 7);

	assert_non_null(p);
	assert_int_equal(check(p, data, sizeof(data)), 0);
	/* The token never goes with it. */
	assert_true(!p->job->token || !*p->job->token);
	dtep__payload__free_unpacked(p, NULL);
}

static void test_tampered_header(void **state)
{
	Dtep__Payload *p = wire_payload(key, 7);

	p->version = 8;
	assert_int_equal(check(p, data, sizeof(data)), -EBADMSG);
	p->version = 7;
	p->dst = 3;
	assert_int_equal(check(p, data, sizeof(data)), -EBADMSG);
	p->dst = 2;
	p->job->token = "secret-token";	/* the right token in clear proves nothing */
	assert_int_equal(check(p, data, sizeof(data)), -EBADMSG);
	p->job->token = NULL;
	assert_int_equal(check(p, data, sizeof(data)), 0);
	dtep__payload__free_unpacked(p, NULL);
}

static void test_tampered_payload(void **state)
{
	Dtep__Payload *p = wire_payload(key, 7);
	uint8_t *d = malloc(sizeof(data));

	memcpy(d, data, sizeof(data));
	d[sizeof(data) - 1] ^= 1;
	assert_int_equal(check(p, d, sizeof(data)), -EBADMSG);
	assert_int_equal(check(p, data, sizeof(data) - 1), -EBADMSG);	/* truncated */
	assert_int_equal(check(p, NULL, 0), -EBADMSG);			/* data dropped */
	free(d);
	dtep__payload__free_unpacked(p, NULL);
}

static void test_wrong_key_or_none(void **state)
{
	uint8_t other[PEER_AUTH_KEYBYTES];
	Dtep__Payload *p;

	peer_auth_key(other, "job1", "guessed");
	p = wire_payload(other, 7);
	assert_int_equal(check(p, data, sizeof(data)), -EBADMSG);
	/* The same token under another job's name is another key. */
	peer_auth_key(other, "job2", "secret-token");
	assert_memory_not_equal(other, key, sizeof(key));
	free(p->job->mac.data);
	p->job->mac.data = NULL;
	p->job->mac.len = 0;
	assert_int_equal(check(p, data, sizeof(data)), -ENOKEY);
	dtep__payload__free_unpacked(p, NULL);
}

/* REFUSED has no JobRef (it names its job as a string) but its own mac:
 * unsealed it is -ENOKEY, sealed it verifies, tampered it does not; a
 * record with neither a JobRef nor a mac field is -EINVAL. */
static void test_refused(void **state)
{
	Dtep__Refused r = DTEP__REFUSED__INIT;
	Dtep__PlanAck a = DTEP__PLAN_ACK__INIT;
	uint8_t mac[PEER_AUTH_MACBYTES];

	(void)state;
	r.job = "j";
	r.reason = "no";
	assert_null(peer_auth_ref(&r.base));
	assert_int_equal(peer_auth_check(key, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &r.base,
					 NULL, 0), -ENOKEY);
	assert_int_equal(peer_auth_mac(key, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &r.base, NULL, 0,
				       mac), 0);
	r.mac.data = mac;
	r.mac.len = sizeof(mac);
	assert_int_equal(peer_auth_check(key, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &r.base,
					 NULL, 0), 0);
	r.reason = "forged";
	assert_int_equal(peer_auth_check(key, DTEP__PEER_MSG_TYPE__PEER_MSG_REFUSED, &r.base,
					 NULL, 0), -EBADMSG);
	/* A PLAN_ACK without its JobRef set: nowhere to put a MAC. */
	assert_int_equal(peer_auth_check(key, DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN_ACK, &a.base,
					 NULL, 0), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sealed_verifies),
		cmocka_unit_test(test_tampered_header),
		cmocka_unit_test(test_tampered_payload),
		cmocka_unit_test(test_wrong_key_or_none),
		cmocka_unit_test(test_refused),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
