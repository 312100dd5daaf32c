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
#include "gpu/compute.h"

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

/* The real plugin, when built.  Without a usable CUDA device it must
 * decline with a "cuda unavailable" reason and leave us on cpu (asserted),
 * and then the test reports SKIPPED: the cuda backend was not exercised.
 * On a GPU machine it must give cuda with a device name.  The skip reason
 * is the last line printed before skip() (tests/run-unit.sh shows it). */
static void test_real_plugin(void **state)
{
	char path[512], why[512];
	const struct dtc_backend *be;

	snprintf(path, sizeof(path), "%s/lib/dte-cuda.so", bdir());
	if (access(path, R_OK) != 0) {
		print_message("no %s (nvcc absent when built)\n", path);
		skip();
	}
	be = dtc_backend_load("cuda", path, why, sizeof(why));
	if (strcmp(dtc_backend_name(be), "cpu") == 0) {
		assert_non_null(strstr(why, "cuda unavailable"));
		assert_ptr_equal(be, dtc_backend_cpu());
		print_message("%s\n", why);
		skip();
	}
	print_message("cuda plugin: backend %s (%s)\n", dtc_backend_name(be), dtc_backend_device(be));
	assert_string_equal(dtc_backend_name(be), "cuda");
	assert_non_null(dtc_backend_device(be));
	assert_true(dtc_dev_has(be));
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

/* The host side of the GPU path's helpers: the destination checksum walks
 * any box (transposed, negative strides) like a brute-force sum, refuses a
 * box outside the buffer, and the device calls decline on cpu. */
static void test_checksum_box_and_dev_on_cpu(void **state)
{
	const struct dtc_backend *cpu = dtc_backend_cpu();
	struct dte_box_map t = { 2, { 3, 5 }, 0, { 0, 0 }, 14, { -1, -3 } };	/* transposed, reversed */
	uint16_t dst[32];
	uint64_t sum = 0, want = 0, bytes = 0;
	uint8_t h[64] = { 0 };
	void *base = NULL, *ev = NULL;

	for (int i = 0; i < 32; i++)
		dst[i] = (uint16_t)(0x3f80 + 7 * i);
	for (int64_t a = 0; a < 3; a++)
		for (int64_t b = 0; b < 5; b++) {
			int64_t at = 14 - a - 3 * b;

			want += dtc_csum_term((uint64_t)at, dst[at]);
		}
	assert_int_equal(dtc_checksum_box(cpu, &t, dst, 32, &sum), DTC_OK);
	assert_true(sum == want);
	dst[14] ^= 1;	/* one bit in the box changes the sum */
	assert_int_equal(dtc_checksum_box(cpu, &t, dst, 32, &sum), DTC_OK);
	assert_true(sum != want);
	assert_int_equal(dtc_checksum_box(cpu, &t, dst, 14, &sum), DTC_EBOX);
	assert_int_equal(dtc_checksum_box(cpu, &t, NULL, 32, &sum), DTC_EINVAL);

	assert_false(dtc_dev_has(cpu));
	assert_null(dtc_dev_alloc(cpu, 64));
	assert_int_equal(dtc_dev_ipc_open(cpu, h, sizeof(h), &base, &bytes), DTC_EINVAL);
	assert_int_equal(dtc_dev_event_open(cpu, h, sizeof(h), &ev), DTC_EINVAL);
	assert_int_equal(dtc_dev_copy(cpu, dst, dst, 2, 0), DTC_EINVAL);
	assert_null(base);
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
		cmocka_unit_test(test_checksum_box_and_dev_on_cpu),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
