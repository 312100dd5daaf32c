/* tests/unit/test_derr.c — the daemon's one error convention
 * (daemon/derr.h): every errno of the table maps to its wire status, an
 * errno outside it is ERR_INTERNAL, success is OK, and derr_fail() writes
 * the reason and hands the errno back.  Then through the edge: requests
 * run through the dispatch ladder get the status the engine's errno
 * means, with the engine's reason (the old -1 from buf.c was ERR_INVALID
 * whatever went wrong). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <uv.h>
#include "daemon/conf.h"
#include "daemon/derr.h"
#include "daemon/dispatch.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "gpu/backend.h"
#include "proto/cmdtab.h"

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

static struct dconf conf;
static struct dsrv srv;

/* One request through ddispatch (as ctl.c runs it); the decoded reply. */
static Dte__Response *ask(Dte__Request *req)
{
	struct dsess s = { .version = DTE_PROTO_VERSION };
	uint8_t buf[512], *out;
	size_t len = dte__request__get_packed_size(req), olen;
	Dte__Response *resp;

	assert_true(len <= sizeof(buf));
	dte__request__pack(req, buf);
	assert_int_equal(ddispatch(&srv, &s, buf, len, &out, &olen), 0);
	assert_true(olen > 4);
	resp = dte__response__unpack(NULL, olen - 4, out + 4);
	free(out);
	assert_non_null(resp);
	return resp;
}

static void expect(Dte__Request *req, Dte__Status want, const char *reason)
{
	Dte__Response *r = ask(req);

	if (r->code != want || !r->message || !strstr(r->message, reason))
		fail_msg("status %d \"%s\", want %d with \"%s\"", r->code,
			 r->message ? r->message : "", want, reason);
	dte__response__free_unpacked(r, NULL);
}

static void test_handlers_map_at_the_edge(void **state)
{
	Dte__Request req = DTE__REQUEST__INIT;
	Dte__UnregisterBufferRequest ur = DTE__UNREGISTER_BUFFER_REQUEST__INIT;
	Dte__RegisterBufferRequest rr = DTE__REGISTER_BUFFER_REQUEST__INIT;
	Dte__JobRequest jr = DTE__JOB_REQUEST__INIT;
	uint8_t handle[64] = { 1 };
	char err[128];

	(void)state;
	dlog_init(DLOG_ERROR);
	dconf_defaults(&conf);
	snprintf(conf.node_name, sizeof(conf.node_name), "unit");
	assert_int_equal(dconf_finish(&conf, err, sizeof(err)), 0);
	srv.conf = &conf;
	srv.backend = "cpu";
	srv.start_ns = uv_hrtime();
	/* Job commands reach an engine of the test's own (no loop). */
	srv.eng = dte_engine_new(NULL, dtc_backend_cpu(), "cpu");
	assert_non_null(srv.eng);

	/* buf.c -ENOENT: not found (was ERR_INVALID). */
	req.id = 1;
	req.cmd_case = DTE__REQUEST__CMD_UNREGISTER_BUFFER;
	req.unregister_buffer = &ur;
	ur.buffer = 12345;
	expect(&req, DTE__STATUS__STATUS_ERR_NOT_FOUND, "not registered on this connection");

	/* buf.c -EOPNOTSUPP: a CUDA buffer on a daemon without CUDA is not
	 * served by it (was ERR_INVALID). */
	req.cmd_case = DTE__REQUEST__CMD_REGISTER_BUFFER;
	req.register_buffer = &rr;
	rr.cuda = 1;
	rr.cuda_ipc_handle.data = handle;
	rr.cuda_ipc_handle.len = sizeof(handle);
	rr.length = 16;
	rr.dtype = "bf16";
	rr.name = "g";
	expect(&req, DTE__STATUS__STATUS_ERR_UNIMPLEMENTED, "no CUDA device");

	/* buf.c -EINVAL: still invalid. */
	rr.cuda = 0;
	expect(&req, DTE__STATUS__STATUS_ERR_INVALID, "no file descriptor came with the request");

	/* job.c -ENOENT through cmd_job.c's done(). */
	req.cmd_case = DTE__REQUEST__CMD_JOB;
	req.job = &jr;
	jr.name = "nope";
	expect(&req, DTE__STATUS__STATUS_ERR_NOT_FOUND, "unknown job \"nope\"");
	dte_engine_free(srv.eng);
	srv.eng = NULL;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_success_and_unknown),
		cmocka_unit_test(test_fail_writes_reason),
		cmocka_unit_test(test_handlers_map_at_the_edge),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
