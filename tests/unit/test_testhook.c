/* tests/unit/test_testhook.c — DTE_TEST_HOOK parsing and the send-side
 * cut point (the receive side and the SIGKILL are exercised by
 * tests/faults/faults.py against real daemons). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>
#include <uv.h>
#include "tests/faults/testhook.h"
#include "proto/peer_protocol.h"

static size_t pack_counts(uint64_t version, uint8_t *buf)
{
	Dtep__Counts c = DTEP__COUNTS__INIT;

	c.version = version;
	return dtep__counts__pack(&c, buf);
}

static size_t pack_payload(uint64_t version, uint8_t *buf)
{
	Dtep__Payload p = DTEP__PAYLOAD__INIT;

	p.version = version;
	return dtep__payload__pack(&p, buf);
}

static int send_counts(uint64_t v)
{
	uint8_t buf[64];
	size_t n = pack_counts(v, buf);

	return testhook_send(DTEP__PEER_MSG_TYPE__PEER_MSG_COUNTS, buf, n);
}

static int send_payload(uint64_t v)
{
	uint8_t buf[64];
	size_t n = pack_payload(v, buf);

	return testhook_send(DTEP__PEER_MSG_TYPE__PEER_MSG_PAYLOAD, buf, n);
}

static void with_hook(const char *spec, uv_loop_t *loop)
{
	if (spec)
		setenv("DTE_TEST_HOOK", spec, 1);
	else
		unsetenv("DTE_TEST_HOOK");
	assert_int_equal(testhook_init(loop), 0);
}

static void done(uv_loop_t *loop)
{
	testhook_fini();
	uv_run(loop, UV_RUN_NOWAIT);
}

static void test_inert_without_env(void **state)
{
	uv_loop_t *loop = *state;

	with_hook(NULL, loop);
	for (uint64_t v = 1; v < 10; v++) {
		assert_int_equal(send_counts(v), 0);
		assert_int_equal(send_counts(v), 0);
		assert_int_equal(send_payload(v), 0);
	}
	done(loop);
}

/* A malformed spec or an unknown fault is refused (the daemon then does not
 * start), and nothing fires: a misspelt hook cannot run fault-free. */
static void test_bad_specs_refused(void **state)
{
	uv_loop_t *loop = *state;
	const char *bad[] = { "die-in-counts", "die-in-counts@", "die-in-counts@x",
			      "die-in-counts@0", "die-in-counts@3/", "explode@3",
			      "die-in-counts@3junk", "die-in-count@3", "die-in-countsx@3",
			      "@3", "die-in-counts@3/0" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("DTE_TEST_HOOK", bad[i], 1);
		assert_int_equal(testhook_init(loop), -1);
		assert_int_equal(send_counts(3), 0);
		assert_int_equal(send_counts(3), 0);
		done(loop);
	}
	/* A good spec after a refused one arms as usual. */
	with_hook("die-in-counts@3", loop);
	assert_int_equal(send_counts(3), 0);
	assert_int_equal(send_counts(3), 1);
	done(loop);
}

/* The second COUNTS of the hooked version is the cut: it and everything
 * after it is dropped; other versions and types pass before it. */
static void test_die_in_counts_cut_point(void **state)
{
	uv_loop_t *loop = *state;

	with_hook("die-in-counts@5/3", loop);
	assert_int_equal(send_counts(4), 0);
	assert_int_equal(send_counts(4), 0);
	assert_int_equal(send_counts(5), 0);
	assert_int_equal(send_payload(5), 0);
	assert_int_equal(send_counts(5), 1);
	assert_int_equal(send_payload(5), 1);
	assert_int_equal(send_counts(6), 1);
	done(loop);   /* closes the timer before it can fire */
}

static void test_die_in_payload_period(void **state)
{
	uv_loop_t *loop = *state;

	with_hook("die-in-payload@2/4", loop);
	for (uint64_t v = 1; v < 6; v++) {   /* 2 and 6 are hit; 3..5 are not */
		if (v == 2)
			continue;
		assert_int_equal(send_payload(v), 0);
		assert_int_equal(send_payload(v), 0);
	}
	assert_int_equal(send_payload(6), 0);
	assert_int_equal(send_counts(6), 0);
	assert_int_equal(send_payload(6), 1);
	done(loop);
}

static int send_join(void)
{
	Dtep__Join m = DTEP__JOIN__INIT;
	uint8_t buf[64];

	return testhook_send(DTEP__PEER_MSG_TYPE__PEER_MSG_JOIN, buf, dtep__join__pack(&m, buf));
}

static int send_plan(uint64_t term)
{
	Dtep__Plan m = DTEP__PLAN__INIT;
	uint8_t buf[64];

	m.epoch = term;
	return testhook_send(DTEP__PEER_MSG_TYPE__PEER_MSG_PLAN, buf, dtep__plan__pack(&m, buf));
}

/* drop-join@2: the second JOIN only; drop-plan@3: the first PLAN of the
 * coordinator's third plan (a term's counter), its retry goes. */
static void test_drop_join_plan(void **state)
{
	uv_loop_t *loop = *state;
	uint64_t boot = 0x1234567ull << PEER_TERM_COUNTER_BITS;

	with_hook("drop-join@2", loop);
	assert_int_equal(send_join(), 0);
	assert_int_equal(send_join(), 1);
	assert_int_equal(send_join(), 0);
	assert_int_equal(send_plan(boot | 2), 0);   /* other kinds untouched */
	assert_int_equal(send_counts(2), 0);
	done(loop);
	with_hook("drop-plan@3", loop);
	assert_int_equal(send_plan(boot | 2), 0);
	assert_int_equal(send_join(), 0);
	assert_int_equal(send_plan(boot | 3), 1);
	assert_int_equal(send_plan(boot | 3), 0);   /* the retry */
	assert_int_equal(send_plan(boot | 4), 0);
	done(loop);
}

static int setup(void **state)
{
	uv_loop_t *loop = malloc(sizeof(*loop));

	if (!loop || uv_loop_init(loop))
		return -1;
	*state = loop;
	return 0;
}

static int teardown(void **state)
{
	uv_loop_t *loop = *state;

	uv_run(loop, UV_RUN_NOWAIT);
	uv_loop_close(loop);
	free(loop);
	unsetenv("DTE_TEST_HOOK");
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inert_without_env),
		cmocka_unit_test(test_bad_specs_refused),
		cmocka_unit_test(test_die_in_counts_cut_point),
		cmocka_unit_test(test_die_in_payload_period),
		cmocka_unit_test(test_drop_join_plan),
	};

	return cmocka_run_group_tests_name("testhook", tests, setup, teardown);
}
