/* tests/unit/test_job_persist.c — jobs kept across a daemon's restart
 * (daemon/job_persist.c): a created job is written whole, mode 0600; a
 * second engine (the restarted daemon) creates it again from the file
 * under a new boot; a file that does not decode, or that job_create
 * refuses, is set aside as *.bad and the others are still restored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include "tests/unit/slurp.h"
#include "daemon/job.h"
#include "daemon/job_state.h"
#include "daemon/job_persist.h"
#include "daemon/log.h"
#include "daemon/route.h"
#include "gpu/backend.h"

/* The engine under test: the test's own instance (job.h). */
static struct dte_engine *eng;

static uv_loop_t loop;
static char *config;

static void engine_up(void)
{
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(route_init(&loop, "unit", ""), 0);
	eng = dte_engine_new(&loop, dtc_backend_cpu(), "cpu");
	assert_non_null(eng);
	job_set_created_hook(eng, jpersist_save);	/* as main.c does */
}

static void engine_down(void)
{
	dte_engine_free(eng);
	eng = NULL;
	route_fini();
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static void create(const char *name, const char *token)
{
	struct jcreate_args jc = { 0 };
	struct jcreate_res jr = { 0 };
	char err[256];

	jc.name = name;
	jc.token = token;
	jc.coordinator = "local";
	jc.model_config = config;
	jc.publish_interval = 2;
	assert_int_equal(job_create(eng, &jc, &jr, err, sizeof(err)), 0);
	assert_int_equal(jr.created, 1);
}

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	fclose(f);
}

static void test_restart_restores(void **state)
{
	char dir[64] = "/tmp/dte-jobstate-XXXXXX", path[256], err[256];
	struct stat st;
	uint64_t boot;

	(void)state;
	assert_non_null(mkdtemp(dir));
	strcat(dir, "/jobs");	/* created by jpersist_init */

	/* first life: two jobs created by clients */
	engine_up();
	assert_int_equal(jpersist_init(eng, dir, err, sizeof(err)), 0);
	assert_int_equal(jpersist_restore(eng), 0);
	create("alpha", "tok-a");
	create("beta", "tok-b");
	boot = job_find(eng, "alpha")->boot;
	snprintf(path, sizeof(path), "%s/alpha.job", dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);	/* it holds the token */
	assert_int_equal(stat(dir, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	engine_down();

	/* a garbage file and one job_create refuses beside them */
	snprintf(path, sizeof(path), "%s/garbage.job", dir);
	write_file(path, "\xff\xff\xff\xff\x0f", 5);
	{
		Dte__JobCreateRequest bad = DTE__JOB_CREATE_REQUEST__INIT;
		uint8_t buf[256];
		size_t n;

		bad.name = "gamma";
		bad.token = "tok";
		bad.model_config = "{\"model_type\": \"nonsense\"}";
		n = dte__job_create_request__pack(&bad, buf);
		snprintf(path, sizeof(path), "%s/gamma.job", dir);
		write_file(path, buf, n);
	}

	/* second life: nobody creates anything; the kept jobs come back */
	engine_up();
	assert_int_equal(jpersist_init(eng, dir, err, sizeof(err)), 0);
	assert_int_equal(jpersist_restore(eng), 4);
	assert_non_null(job_find(eng, "alpha"));
	assert_non_null(job_find(eng, "beta"));
	assert_null(job_find(eng, "gamma"));
	assert_string_equal(job_find(eng, "alpha")->token, "tok-a");
	assert_int_equal(job_find(eng, "beta")->interval, 2);
	assert_int_not_equal(job_find(eng, "alpha")->boot, boot);	/* new terms */
	snprintf(path, sizeof(path), "%s/garbage.bad", dir);
	assert_int_equal(stat(path, &st), 0);
	snprintf(path, sizeof(path), "%s/gamma.bad", dir);
	assert_int_equal(stat(path, &st), 0);
	snprintf(path, sizeof(path), "%s/gamma.job", dir);
	assert_int_not_equal(stat(path, &st), 0);
	engine_down();

	/* off: nothing written, nothing read */
	engine_up();
	assert_int_equal(jpersist_init(eng, "", err, sizeof(err)), 0);
	assert_int_equal(jpersist_restore(eng), 0);
	assert_null(job_find(eng, "alpha"));
	create("delta", "tok-d");
	snprintf(path, sizeof(path), "%s/delta.job", dir);
	assert_int_not_equal(stat(path, &st), 0);
	engine_down();

	/* a directory that cannot be made is an error with its reason */
	engine_up();
	assert_true(jpersist_init(eng, "/proc/no/such/dir", err, sizeof(err)) < 0);
	assert_non_null(strstr(err, "/proc/no/such/dir"));
	engine_down();

	*strrchr(dir, '/') = '\0';
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	assert_int_equal(system(path), 0);
}

/* Two engines in one process (issue 31): each holds its own jobs, kept
 * jobs and participant ids; freeing one leaves the other working. */
static void test_two_engines(void **state)
{
	char dir[64] = "/tmp/dte-jobstate-XXXXXX", d1[128], d2[128], path[256], err[256];
	struct dte_engine *first, *second;
	struct stat st;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(d1, sizeof(d1), "%s/one", dir);
	snprintf(d2, sizeof(d2), "%s/two", dir);
	engine_up();
	first = eng;
	second = dte_engine_new(NULL, dtc_backend_cpu(), "cpu");
	assert_non_null(second);
	job_set_created_hook(second, jpersist_save);
	assert_int_equal(jpersist_init(first, d1, err, sizeof(err)), 0);
	assert_int_equal(jpersist_init(second, d2, err, sizeof(err)), 0);
	create("alpha", "tok-a");
	eng = second;
	create("beta", "tok-b");
	eng = first;
	assert_non_null(job_find(first, "alpha"));
	assert_null(job_find(first, "beta"));
	assert_non_null(job_find(second, "beta"));
	assert_null(job_find(second, "alpha"));
	assert_ptr_equal(job_find(second, "beta")->eng, second);
	snprintf(path, sizeof(path), "%s/alpha.job", d1);
	assert_int_equal(stat(path, &st), 0);
	snprintf(path, sizeof(path), "%s/beta.job", d1);
	assert_int_not_equal(stat(path, &st), 0);
	snprintf(path, sizeof(path), "%s/beta.job", d2);
	assert_int_equal(stat(path, &st), 0);
	/* Each counts its own participants (same node: same hash). */
	assert_int_equal(job_participant_id_new(first), job_participant_id_new(second));
	dte_engine_free(second);
	create("gamma", "tok-g");
	assert_non_null(job_find(first, "gamma"));
	engine_down();
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	assert_int_equal(system(path), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_restores),
		cmocka_unit_test(test_two_engines),
	};
	int rc;

	dlog_init(DLOG_ERROR);
	config = slurp("tests/data/layout/tiny-llama-gqa.json");
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	free(config);
	return rc;
}
