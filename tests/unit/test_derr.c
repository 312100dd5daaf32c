/* tests/unit/test_derr.c — the daemon's one error convention
 * (daemon/derr.h): every errno of the table maps to its wire status, an
 * errno outside it is ERR_INTERNAL, success is OK, and derr_fail() writes
 * the reason and hands the errno back. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>
#include "daemon/derr.h"

static void test_table(void **state)
{
	static const struct {
		int rc;
		Dte__Status want;
	} table[] = {
		{ -EINVAL, DTE__STATUS__STATUS_ERR_INVALID },
		{ -EEXIST, DTE__STATUS__STATUS_ERR_INVALID },
		{ -ENOENT, DTE__STATUS__STATUS_ERR_NOT_FOUND },
		{ -EBUSY, DTE__STATUS__STATUS_ERR_BUSY },
		{ -EAGAIN, DTE__STATUS__STATUS_ERR_BUSY },
		{ -ETIMEDOUT, DTE__STATUS__STATUS_ERR_TIMEOUT },
		{ -EACCES, DTE__STATUS__STATUS_ERR_DENIED },
		{ -EPERM, DTE__STATUS__STATUS_ERR_DENIED },
		{ -EPROTO, DTE__STATUS__STATUS_ERR_PROTOCOL },
		{ -EPROTONOSUPPORT, DTE__STATUS__STATUS_ERR_VERSION },
		{ -ENOSYS, DTE__STATUS__STATUS_ERR_UNKNOWN_COMMAND },
		{ -EOPNOTSUPP, DTE__STATUS__STATUS_ERR_UNIMPLEMENTED },
		{ -ENOMEM, DTE__STATUS__STATUS_ERR_INTERNAL },
		{ -EIO, DTE__STATUS__STATUS_ERR_INTERNAL },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		if (derr_status(table[i].rc) != table[i].want)
			fail_msg("errno %d (%s): status %d, want %d", -table[i].rc,
				 strerror(-table[i].rc), derr_status(table[i].rc), table[i].want);
	}
}

static void test_success_and_unknown(void **state)
{
	(void)state;
	assert_int_equal(derr_status(0), DTE__STATUS__STATUS_OK);
	assert_int_equal(derr_status(7), DTE__STATUS__STATUS_OK);	/* a count is success */
	/* Not in the table: internal, never a status that blames the client. */
	assert_int_equal(derr_status(-EXDEV), DTE__STATUS__STATUS_ERR_INTERNAL);
	assert_int_equal(derr_status(-ENOSPC), DTE__STATUS__STATUS_ERR_INTERNAL);
	assert_int_equal(derr_status(-4095), DTE__STATUS__STATUS_ERR_INTERNAL);
	assert_int_equal(derr_status(-100000), DTE__STATUS__STATUS_ERR_INTERNAL);
}

static void test_fail_writes_reason(void **state)
{
	char err[16] = "untouched";

	(void)state;
	assert_int_equal(derr_fail(err, sizeof(err), -ENOENT, "unknown job \"%s\"", "a"), -ENOENT);
	assert_string_equal(err, "unknown job \"a\"");
	/* Cut to errlen, still terminated. */
	assert_int_equal(derr_fail(err, sizeof(err), -EINVAL, "%s", "0123456789abcdefghij"), -EINVAL);
	assert_string_equal(err, "0123456789abcde");
	/* No room: nothing written. */
	strcpy(err, "kept");
	assert_int_equal(derr_fail(err, 0, -EIO, "x"), -EIO);
	assert_string_equal(err, "kept");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_success_and_unknown),
		cmocka_unit_test(test_fail_writes_reason),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
