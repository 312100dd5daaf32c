/* tests/unit/test_conf.c — config parsing: defaults, values, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "daemon/conf.h"
#include "daemon/log.h"

static int load(struct dconf *c, const char *text, char *err, size_t n)
{
	dconf_defaults(c);
	err[0] = '\0';
	return dconf_load_string(c, text, "t.conf", err, n);
}

static void test_defaults(void **state)
{
	struct dconf c;
	char err[256];

	assert_int_equal(load(&c, "", err, sizeof(err)), 0);
	assert_int_equal(dconf_finish(&c, err, sizeof(err)), 0);
	assert_string_equal(c.runtime_dir, "/run/dted");
	assert_string_equal(c.socket, "/run/dted/dted.sock");
	assert_int_equal(c.log_level, DLOG_NOTICE);
	assert_int_equal(c.max_frame_bytes, 4u << 20);
	assert_string_equal(c.compute_backend, "auto");
	assert_int_equal(c.peer_listen_port, 7370);
	assert_int_equal(c.peer_part_bytes, 256u << 10);
	assert_int_equal(c.peer_relay_lag_ms, 1000);
	assert_true(c.node_name[0] != '\0');
}

/* The shipped file must parse: every key in it is commented-out default. */
static void test_shipped_file(void **state)
{
	struct dconf c;
	char err[256];

	dconf_defaults(&c);
	assert_int_equal(dconf_load_file(&c, "conf/dted.conf", err, sizeof(err)), 0);
	assert_int_equal(c.max_frame_bytes, 4u << 20);
}

static void test_values(void **state)
{
	struct dconf c;
	char err[256];

	assert_int_equal(load(&c,
			      "[daemon]\n"
			      "runtime_dir = /tmp/x\n"
			      "log_level = debug\n"
			      "max_frame_bytes = 64K\n"
			      "allow_uids = 1000, root 1234\n"
			      "allow_gids = 0\n"
			      "compute_backend = cpu\n"
			      "node_name = n1\n"
			      "[peer]\n"
			      "listen_port = 9000\n"
			      "part_size = 256K\n"
			      "relay_lag_ms = 0\n",
			      err, sizeof(err)), 0);
	assert_int_equal(dconf_finish(&c, err, sizeof(err)), 0);
	assert_string_equal(c.socket, "/tmp/x/dted.sock");
	assert_int_equal(c.log_level, DLOG_DEBUG);
	assert_int_equal(c.max_frame_bytes, 65536);
	assert_int_equal(c.n_allow_uids, 3);
	assert_int_equal(c.allow_uids[0], 1000);
	assert_int_equal(c.allow_uids[1], 0);
	assert_int_equal(c.allow_uids[2], 1234);
	assert_int_equal(c.n_allow_gids, 1);
	assert_string_equal(c.node_name, "n1");
	assert_int_equal(c.peer_listen_port, 9000);
	assert_int_equal(c.peer_part_bytes, 256u << 10);
	assert_int_equal(c.peer_relay_lag_ms, 0);
}

struct bad_case {
	const char *text;
	const char *expect;     /* substring of the error, after "t.conf:LINE: " */
	int line;
};

static void test_errors_name_file_line(void **state)
{
	static const struct bad_case cases[] = {
		{ "[daemon]\nlog_level = loud\n", "log_level: invalid value 'loud'", 2 },
		{ "[daemon]\n\n# c\nbogus = 1\n", "unknown key 'bogus' in [daemon]", 4 },
		{ "[daemon]\n[extra]\nx = 1\n", "unknown section [extra]", 3 },
		{ "[daemon]\nmax_frame_bytes = 12\n", "max_frame_bytes: invalid value", 2 },
		{ "[daemon]\nmax_frame_bytes = 1T\n", "max_frame_bytes: invalid value", 2 },
		{ "[daemon]\nmax_frame_bytes = 99999999999999999999\n", "invalid value", 2 },
		{ "[daemon]\nmax_frame_bytes = -5\n", "invalid value", 2 },
		{ "[daemon]\nmax_clients = 0\n", "max_clients: invalid value", 2 },
		{ "[daemon]\ncompute_backend = tpu\n", "auto|cpu|cuda", 2 },
		{ "[daemon]\nsocket = relative/path\n", "absolute path", 2 },
		{ "[daemon]\nruntime_dir = \n", "absolute path", 2 },
		{ "[daemon]\nallow_uids = no-such-user-xyz\n", "unknown user 'no-such-user-xyz'", 2 },
		{ "[daemon]\nallow_gids = 5, no-such-group-xyz\n", "unknown group", 2 },
		{ "[peer]\nlisten_port = 70000\n", "listen_port: invalid value", 2 },
		{ "[peer]\npart_size = 1K\n", "part_size: invalid value", 2 },
		{ "[peer]\npart_size = 2G\n", "part_size: invalid value", 2 },
		{ "[peer]\nrelay_lag_ms = 3600001\n", "relay_lag_ms: invalid value", 2 },
		{ "[peer]\nlisten_addr = x\n", "unknown key 'listen_addr' in [peer]", 2 },
		{ "x = 1\n", "outside any section", 1 },
		{ "[daemon]\nthis line has no equals\n", "syntax error", 2 },
		/* First error wins even when later lines are also bad. */
		{ "[daemon]\nlog_level = info\nnode_name = a\nfoo = 1\nbar = 2\n", "'foo'", 4 },
	};
	char err[256], prefix[32];
	struct dconf c;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(load(&c, cases[i].text, err, sizeof(err)), -1);
		snprintf(prefix, sizeof(prefix), "t.conf:%d: ", cases[i].line);
		if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, cases[i].expect))
			fail_msg("case %zu: got '%s', want '%s...%s'", i, err, prefix, cases[i].expect);
	}
}

static void test_long_values(void **state)
{
	char text[1024], err[256];
	struct dconf c;

	snprintf(text, sizeof(text), "[daemon]\nnode_name = %0100d\n", 7);
	assert_int_equal(load(&c, text, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "longer than"));
}

static void test_missing_file(void **state)
{
	struct dconf c;
	char err[256];

	dconf_defaults(&c);
	assert_int_equal(dconf_load_file(&c, "/nonexistent/dted.conf", err, sizeof(err)), -1);
	assert_non_null(strstr(err, "/nonexistent/dted.conf"));
}

static void test_peer_allowed(void **state)
{
	struct dconf c;
	char err[256];
	gid_t groups[] = { 50, 60 };

	assert_int_equal(load(&c, "[daemon]\nallow_uids = 1000\nallow_gids = 60\n", err,
			      sizeof(err)), 0);
	assert_true(dconf_peer_allowed(&c, 0, 0, NULL, 0));
	assert_true(dconf_peer_allowed(&c, geteuid(), 99, NULL, 0));
	assert_true(dconf_peer_allowed(&c, 1000, 99, NULL, 0));
	assert_true(dconf_peer_allowed(&c, 2000, 60, NULL, 0));
	assert_true(dconf_peer_allowed(&c, 2000, 99, groups, 2));
	assert_false(dconf_peer_allowed(&c, 2000, 99, groups, 1));
	assert_false(dconf_peer_allowed(&c, 65534, 65534, NULL, 0));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_shipped_file),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_errors_name_file_line),
		cmocka_unit_test(test_long_values),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_peer_allowed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
