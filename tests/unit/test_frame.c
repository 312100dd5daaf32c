/* tests/unit/test_frame.c — the bounded, incremental frame reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "proto/dte.pb-c.h"
#include "proto/frame.h"

/* Frame of one PingRequest with the given nonce. */
static uint8_t *ping_frame(uint64_t nonce, size_t *len)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__PingRequest ping = DTE__PING_REQUEST__INIT;
	uint8_t *buf;

	ping.nonce = nonce;
	req.cmd_case = DTE__REQUEST__CMD_PING;
	req.ping = &ping;
	req.id = (uint32_t)nonce;
	assert_int_equal(dte_frame_pack(&req.base, 1024, &buf, len), 0);
	return buf;
}

static uint64_t nonce_of(const uint8_t *body, uint32_t len)
{
	Dte__Request *req = dte__request__unpack(NULL, len, body);
	uint64_t n;

	assert_non_null(req);
	assert_int_equal(req->cmd_case, DTE__REQUEST__CMD_PING);
	n = req->ping->nonce;
	dte__request__free_unpacked(req, NULL);
	return n;
}

static void test_byte_by_byte(void **state)
{
	struct dte_frame_reader r;
	size_t len, used;
	uint8_t *f = ping_frame(77, &len);
	const uint8_t *body = NULL;
	uint32_t blen = 0;
	int frames = 0;

	dte_frame_reader_init(&r, 1024);
	for (size_t i = 0; i < len; i++) {
		int rc = dte_frame_feed(&r, f + i, 1, &used, &body, &blen);

		assert_int_equal(used, 1);
		if (i + 1 < len) {
			assert_int_equal(rc, DTE_FRAME_NEED);
			assert_true(dte_frame_partial(&r));
		} else {
			assert_int_equal(rc, DTE_FRAME_READY);
			frames++;
		}
	}
	assert_int_equal(frames, 1);
	assert_int_equal(blen, len - 4);
	assert_int_equal(nonce_of(body, blen), 77);
	free(f);
	dte_frame_reader_fini(&r);
}

static void test_coalesced(void **state)
{
	struct dte_frame_reader r;
	uint8_t all[4096];
	size_t off = 0, len;
	uint64_t seen[10];
	int n = 0;

	for (uint64_t k = 0; k < 10; k++) {
		uint8_t *f = ping_frame(1000 + k * 7919, &len);

		memcpy(all + off, f, len);
		off += len;
		free(f);
	}
	dte_frame_reader_init(&r, 1024);
	/* Feed in uneven chunks that split headers and bodies anywhere. */
	size_t pos = 0, step = 3;

	while (pos < off) {
		size_t chunk = pos + step > off ? off - pos : step;
		const uint8_t *p = all + pos;
		size_t left = chunk;

		while (left) {
			const uint8_t *body;
			uint32_t blen;
			size_t used;
			int rc = dte_frame_feed(&r, p, left, &used, &body, &blen);

			assert_true(rc >= 0);
			assert_true(used <= left);
			p += used;
			left -= used;
			if (rc == DTE_FRAME_READY)
				seen[n++] = nonce_of(body, blen);
			else
				assert_int_equal(left, 0);
		}
		pos += chunk;
		step = step * 5 % 17 + 1;
	}
	assert_int_equal(n, 10);
	for (int k = 0; k < 10; k++)
		assert_int_equal(seen[k], 1000 + (uint64_t)k * 7919);
	assert_false(dte_frame_partial(&r));
	dte_frame_reader_fini(&r);
}

static void test_oversize_allocates_nothing(void **state)
{
	struct dte_frame_reader r;
	const uint8_t huge[] = { 0xff, 0xff, 0xff, 0xff, 1, 2, 3 };
	const uint8_t *body;
	uint32_t blen;
	size_t used;

	dte_frame_reader_init(&r, 4096);
	assert_int_equal(dte_frame_feed(&r, huge, sizeof(huge), &used, &body, &blen),
			 DTE_FRAME_ETOOBIG);
	assert_int_equal(used, 4);
	assert_int_equal(dte_frame_claimed(&r), 0xffffffffu);
	assert_null(r.buf);
	assert_int_equal(r.bufcap, 0);
	dte_frame_reader_fini(&r);

	/* One over the cap is refused, exactly the cap is accepted. */
	uint8_t over[4] = { 0x01, 0x10, 0, 0 }; /* 4097 */
	uint8_t at[4] = { 0x00, 0x10, 0, 0 };   /* 4096 */

	dte_frame_reader_init(&r, 4096);
	assert_int_equal(dte_frame_feed(&r, over, 4, &used, &body, &blen), DTE_FRAME_ETOOBIG);
	dte_frame_reader_fini(&r);
	dte_frame_reader_init(&r, 4096);
	assert_int_equal(dte_frame_feed(&r, at, 4, &used, &body, &blen), DTE_FRAME_NEED);
	dte_frame_reader_fini(&r);
}

static void test_zero_length(void **state)
{
	struct dte_frame_reader r;
	const uint8_t zero[] = { 0, 0, 0, 0, 0x08, 0x01 };
	const uint8_t *body;
	uint32_t blen;
	size_t used;

	dte_frame_reader_init(&r, 4096);
	assert_int_equal(dte_frame_feed(&r, zero, sizeof(zero), &used, &body, &blen),
			 DTE_FRAME_EEMPTY);
	assert_int_equal(used, 4);
	dte_frame_reader_fini(&r);
}

static void test_pack_cap(void **state)
{
	Dte__Response resp = DTE__RESPONSE__INIT;
	char msg[600];
	uint8_t *buf;
	size_t len;

	memset(msg, 'x', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	resp.message = msg;
	assert_int_equal(dte_frame_pack(&resp.base, 100, &buf, &len), DTE_FRAME_ETOOBIG);
	assert_int_equal(dte_frame_pack(&resp.base, 1024, &buf, &len), 0);
	assert_true(len > sizeof(msg));
	assert_int_equal(buf[0] | buf[1] << 8, len - 4);
	free(buf);
	/* An empty message would be a zero-length frame: refused. */
	Dte__Response empty = DTE__RESPONSE__INIT;

	assert_int_equal(dte_frame_pack(&empty.base, 1024, &buf, &len), DTE_FRAME_EEMPTY);
}

static void test_buffer_reuse_and_release(void **state)
{
	struct dte_frame_reader r;
	static uint8_t big[4 + 100000];
	const uint8_t *body;
	uint32_t blen;
	size_t used;

	big[0] = 100000 & 0xff;
	big[1] = (100000 >> 8) & 0xff;
	big[2] = 100000 >> 16;
	dte_frame_reader_init(&r, 1u << 20);
	assert_int_equal(dte_frame_feed(&r, big, sizeof(big), &used, &body, &blen), DTE_FRAME_READY);
	assert_int_equal(blen, 100000);
	/* The next frame starts with a reset that returns the big buffer. */
	assert_int_equal(dte_frame_feed(&r, big, 2, &used, &body, &blen), DTE_FRAME_NEED);
	assert_null(r.buf);
	dte_frame_reader_fini(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_byte_by_byte),
		cmocka_unit_test(test_coalesced),
		cmocka_unit_test(test_oversize_allocates_nothing),
		cmocka_unit_test(test_zero_length),
		cmocka_unit_test(test_pack_cap),
		cmocka_unit_test(test_buffer_reuse_and_release),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
