/* tests/unit/test_client.c — libdte against the real control server
 * (daemon/ctl.c on a libuv loop in a thread): connect, status with an old
 * (smaller) struct, typed errors, and one handle shared by threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "proto/cmdtab.h"
#include <uv.h>
#include "client/dte.h"
#include "daemon/conf.h"
#include "daemon/ctl.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "daemon/registry.h"
#include "gpu/backend.h"

static struct dconf conf;
static struct dsrv srv;
static uv_loop_t loop;
static uv_async_t stop_async;
static pthread_t loop_thread;
static char dir[64];

static void on_stop(uv_async_t *a)
{
	dctl_fini();
	uv_close((uv_handle_t *)a, NULL);
}

static void *run_loop(void *arg)
{
	uv_run(&loop, UV_RUN_DEFAULT);
	return NULL;
}

static int setup(void **state)
{
	char err[128];

	dlog_init(DLOG_ERROR);
	/* As dted's main.c: a client that hung up with replies still owed
	 * (test_async_close_pending) must not kill the server. */
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/dte-client-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	dconf_defaults(&conf);
	snprintf(conf.socket, sizeof(conf.socket), "%s/d.sock", dir);
	if (dconf_finish(&conf, err, sizeof(err)) < 0)
		return -1;
	srv.conf = &conf;
	srv.backend = "cpu";
	srv.start_ns = uv_hrtime();
	/* Job commands reach an engine, as in dted; without a loop (this
	 * one runs on its own thread), so it holds no handle there. */
	if (!(srv.eng = dte_engine_new(NULL, dtc_backend_cpu(), "cpu")))
		return -1;
	dreg_init();
	uv_loop_init(&loop);
	uv_async_init(&loop, &stop_async, on_stop);
	if (dctl_init(&loop, &srv) < 0)
		return -1;
	return pthread_create(&loop_thread, NULL, run_loop, NULL) ? -1 : 0;
}

static int teardown(void **state)
{
	uv_async_send(&stop_async);
	pthread_join(loop_thread, NULL);
	dte_engine_free(srv.eng);
	srv.eng = NULL;
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
	assert_int_equal(access(conf.socket, F_OK), -1);
	rmdir(dir);
	return 0;
}

static void test_status_full_and_old_struct(void **state)
{
	struct dte_status st = { .size = sizeof(st) };
	dte_t *h = NULL;

	assert_int_equal(dte_connect(conf.socket, &h), DTE_OK);
	assert_int_equal(dte_status(h, &st), DTE_OK);
	assert_string_equal(st.version, DTE_VERSION);
	assert_int_equal(st.protocol, DTE_PROTO_VERSION);
	assert_int_equal(st.pid, getpid());
	assert_string_equal(st.backend, "cpu");
	assert_true(st.clients >= 1);
	assert_true(st.field_mask & DTE_STATUS_BAD_FRAMES);

	/* A caller built when the struct ended at `protocol`: nothing past it
	 * is written, and the mask says so. */
	union {
		struct dte_status st;
		unsigned char raw[sizeof(struct dte_status)];
	} old;
	size_t cut = offsetof(struct dte_status, protocol) + sizeof(old.st.protocol);

	memset(&old, 0xAB, sizeof(old));
	old.st.size = cut;
	assert_int_equal(dte_status(h, &old.st), DTE_OK);
	assert_int_equal(old.st.field_mask, DTE_STATUS_VERSION | DTE_STATUS_PROTOCOL);
	for (size_t i = cut; i < sizeof(old); i++)
		assert_int_equal(old.raw[i], 0xAB);

	struct dte_status tiny = { .size = 4 };

	assert_int_equal(dte_status(h, &tiny), DTE_ERR_INVAL);
	dte_close(h);
}

static void test_errors(void **state)
{
	dte_t *h = (dte_t *)0x1;

	assert_int_equal(dte_connect("/nonexistent/dted.sock", &h), DTE_ERR_UNREACHABLE);
	assert_ptr_equal(h, (dte_t *)0x1); /* output untouched on failure */
	assert_non_null(strstr(dte_errmsg(NULL), "/nonexistent/dted.sock"));
	assert_string_equal(dte_strerror(DTE_ERR_DENIED), "permission denied");
	assert_string_equal(dte_strerror(-999), "unknown error");
	assert_int_equal(dte_connect(NULL, NULL), DTE_ERR_INVAL);
}

/* Protocol 2's wait_captured through the real dispatch: refused with the
 * engine's reason for a job or participant that is not there, and the
 * libdte argument checks. */
static void test_wait_captured_refusals(void **state)
{
	struct dte_publish_info small = { .size = 8 };
	dte_t *h = NULL;

	assert_int_equal(dte_connect(conf.socket, &h), DTE_OK);
	assert_int_equal(dte_wait_captured(h, "no-such-job", 1, 0, 0, NULL), DTE_ERR_NOT_FOUND);
	assert_non_null(strstr(dte_errmsg(h), "unknown job"));
	assert_int_equal(dte_wait_captured(h, NULL, 1, 0, 0, NULL), DTE_ERR_INVAL);
	assert_int_equal(dte_wait_captured(h, "j", 1, 0, 0, &small), DTE_ERR_INVAL);
	dte_close(h);
}

/* A pipelined async publish the daemon refuses: dte_publish_ex returns at
 * once (its reply is not read), the refusal comes from wait_captured with
 * the daemon's reason, and the handle stays usable. */
static void test_async_refusal_from_wait(void **state)
{
	struct dte_publish_info info = { .size = sizeof(info) };
	struct dte_status st = { .size = sizeof(st) };
	uint64_t rtt;
	dte_t *h = NULL;

	assert_int_equal(dte_connect(conf.socket, &h), DTE_OK);
	memset(info.cuda_event, 0xAB, sizeof(info.cuda_event));
	info.captured = 7;
	assert_int_equal(dte_publish_ex(h, "no-such-job", 1, 5, 1, NULL, NULL, 0,
					DTE_PUBLISH_ASYNC, &info), DTE_OK);
	assert_int_equal(info.field_mask, DTE_PUBLISH_CAPTURED);
	assert_int_equal(info.captured, 0);
	assert_int_equal(info.cuda_event_len, 0);
	assert_int_equal(dte_wait_captured(h, "no-such-job", 1, 5, 1000, NULL), DTE_ERR_NOT_FOUND);
	assert_non_null(strstr(dte_errmsg(h), "unknown job"));
	/* Taken: a second wait asks the daemon (which knows no such job). */
	assert_int_equal(dte_wait_captured(h, "no-such-job", 1, 5, 0, NULL), DTE_ERR_NOT_FOUND);
	assert_int_equal(dte_ping(h, &rtt), DTE_OK);
	assert_int_equal(dte_status(h, &st), DTE_OK);
	assert_string_equal(st.version, DTE_VERSION);
	dte_close(h);
}

/* Calls between an async publish and its wait get their own replies: each
 * drains the pending accept first; the refusals stay for wait_captured,
 * matched by job, participant and version. */
static void test_async_then_other_calls(void **state)
{
	struct dte_status st = { .size = sizeof(st) };
	uint64_t rtt = 0;
	dte_t *h = NULL;

	assert_int_equal(dte_connect(conf.socket, &h), DTE_OK);
	assert_int_equal(dte_publish_ex(h, "job-a", 3, 1, 1, NULL, NULL, 0, DTE_PUBLISH_ASYNC,
					NULL), DTE_OK);
	assert_int_equal(dte_publish_ex(h, "job-b", 4, 2, 1, NULL, NULL, 0, DTE_PUBLISH_ASYNC,
					NULL), DTE_OK);
	assert_int_equal(dte_status(h, &st), DTE_OK);
	assert_string_equal(st.version, DTE_VERSION);
	assert_true(st.field_mask & DTE_STATUS_REQUESTS);
	assert_int_equal(dte_ping(h, &rtt), DTE_OK);
	assert_true(rtt > 0);
	/* A call libdte itself refuses leaves the stream alone. */
	assert_int_equal(dte_wait_captured(h, NULL, 4, 2, 0, NULL), DTE_ERR_INVAL);
	assert_int_equal(dte_wait_captured(h, "job-b", 4, 0, 1000, NULL), DTE_ERR_NOT_FOUND);
	assert_non_null(strstr(dte_errmsg(h), "\"job-b\""));
	assert_int_equal(dte_wait_captured(h, "job-a", 3, 1, 1000, NULL), DTE_ERR_NOT_FOUND);
	assert_non_null(strstr(dte_errmsg(h), "\"job-a\""));
	assert_int_equal(dte_status(h, &st), DTE_OK);
	dte_close(h);
}

/* Closing with replies still pending frees their entries (ASan). */
static void test_async_close_pending(void **state)
{
	dte_t *h = NULL;

	assert_int_equal(dte_connect(conf.socket, &h), DTE_OK);
	for (int i = 0; i < 3; i++)
		assert_int_equal(dte_publish_ex(h, "j", 1, (uint64_t)i + 1, 1, NULL, NULL, 0,
						DTE_PUBLISH_ASYNC, NULL), DTE_OK);
	dte_close(h);
}

static void *hammer(void *arg)
{
	dte_t *h = arg;
	long bad = 0;

	for (int i = 0; i < 200; i++) {
		struct dte_status st = { .size = sizeof(st) };
		uint64_t rtt;

		if (dte_ping(h, &rtt) != DTE_OK || dte_status(h, &st) != DTE_OK ||
		    strcmp(st.version, DTE_VERSION))
			bad++;
	}
	return (void *)bad;
}

static void test_shared_handle_threads(void **state)
{
	pthread_t t[4];
	dte_t *h;
	void *bad;

	assert_int_equal(dte_connect(conf.socket, &h), DTE_OK);
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, hammer, h), 0);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(t[i], &bad), 0);
		assert_int_equal((long)bad, 0);
	}
	dte_close(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_status_full_and_old_struct),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_wait_captured_refusals),
		cmocka_unit_test(test_async_refusal_from_wait),
		cmocka_unit_test(test_async_then_other_calls),
		cmocka_unit_test(test_async_close_pending),
		cmocka_unit_test(test_shared_handle_threads),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
