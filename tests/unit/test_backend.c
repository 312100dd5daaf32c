/* Backend selection: cpu on request, and a reasoned fallback to cpu when
 * the cuda plugin is missing, not a plugin, or finds no device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "gpu/backend.h"

static const char *bdir(void)
{
	const char *b = getenv("B");

	return b && b[0] ? b : "build";
}

static void test_cpu(void **state)
{
	char why[256] = "x";
	const struct dtc_backend *be = dtc_backend_load("cpu", NULL, why, sizeof(why));

	assert_string_equal(dtc_backend_name(be), "cpu");
	assert_string_equal(why, "");
	assert_ptr_equal(be, dtc_backend_cpu());
	assert_non_null(dtc_backend_device(be));
}

static void test_missing_plugin(void **state)
{
	char why[256];
	const struct dtc_backend *be = dtc_backend_load("cuda", "/nonexistent/dte-cuda.so", why,
							sizeof(why));

	assert_string_equal(dtc_backend_name(be), "cpu");
	assert_non_null(strstr(why, "cannot load cuda plugin"));
	assert_non_null(strstr(why, "/nonexistent/dte-cuda.so"));
}

static void test_not_a_plugin(void **state)
{
	char path[512], why[512];
	const struct dtc_backend *be;

	/* a real shared object without the entry point */
	snprintf(path, sizeof(path), "%s/lib/libdtecompute.so", bdir());
	if (access(path, R_OK) != 0)
		snprintf(path, sizeof(path), "libz.so.1");
	be = dtc_backend_load("cuda", path, why, sizeof(why));
	assert_string_equal(dtc_backend_name(be), "cpu");
	assert_non_null(strstr(why, "not a dted cuda plugin"));
}

static void test_env_override(void **state)
{
	char why[256];
	const struct dtc_backend *be;

	setenv("DTE_CUDA_PLUGIN", "/nonexistent/elsewhere.so", 1);
	be = dtc_backend_load("auto", NULL, why, sizeof(why));
	unsetenv("DTE_CUDA_PLUGIN");
	assert_string_equal(dtc_backend_name(be), "cpu");
	assert_non_null(strstr(why, "elsewhere.so"));
}

/* The real plugin, when built: here (no driver) it must decline with a
 * reason and leave us on cpu; on a GPU machine it must give cuda. */
static void test_real_plugin(void **state)
{
	char path[512], why[512];
	const struct dtc_backend *be;

	snprintf(path, sizeof(path), "%s/lib/dte-cuda.so", bdir());
	if (access(path, R_OK) != 0) {
		print_message("no %s (nvcc absent): skipping\n", path);
		skip();
	}
	be = dtc_backend_load("cuda", path, why, sizeof(why));
	print_message("cuda plugin: backend %s (%s)\n", dtc_backend_name(be), why[0] ? why : dtc_backend_device(be));
	if (strcmp(dtc_backend_name(be), "cpu") == 0)
		assert_non_null(strstr(why, "cuda unavailable"));
	else
		assert_string_equal(dtc_backend_name(be), "cuda");
}

static void test_unknown_and_cached(void **state)
{
	char why[256];
	const struct dtc_backend *a, *b;

	a = dtc_backend_load("tpu", NULL, why, sizeof(why));
	assert_string_equal(dtc_backend_name(a), "cpu");
	assert_non_null(strstr(why, "unknown backend"));
	a = dtc_backend_get(NULL, why, sizeof(why));
	b = dtc_backend_get("cpu", NULL, 0);
	assert_non_null(a);
	assert_ptr_equal(a, b);	/* the first call decides */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cpu),
		cmocka_unit_test(test_missing_plugin),
		cmocka_unit_test(test_not_a_plugin),
		cmocka_unit_test(test_env_override),
		cmocka_unit_test(test_real_plugin),
		cmocka_unit_test(test_unknown_and_cached),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
