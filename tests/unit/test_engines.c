/* tests/unit/test_engines.c — two sync engines in one process share what is
 * the process's (issue 31): the buffer registry (daemon/buf.h) and the
 * device path (daemon/job_cuda.c) are set up by the first engine and ended
 * by the last, so freeing one engine leaves the other's buffers in place.
 * Each engine runs on the fixture's stub I/O (tests/unit/fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>
#include "tests/unit/fixture.h"
#include "daemon/buf.h"
#include "daemon/job.h"
#include "daemon/log.h"
#include "gpu/backend.h"

/* A buffer of 1024 BF16 elements in a memfd, registered for owner. */
static uint64_t reg(uint64_t owner)
{
	char err[256];
	uint64_t id = 0;
	int fd = memfd_create("test-engines", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 2048), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	if (dbuf_register_fd(owner, fd, 0, 1024, DBUF_BF16, "w", &id, err, sizeof(err)))
		fail_msg("register: %s", err);
	close(fd);
	return id;
}

static void test_two_engines_share_the_registry(void **state)
{
	struct fx *fx = fix_new(2, 1, NULL);
	struct dte_engine *a, *b;
	struct dte_engine_io io;
	uint64_t ida, idb, bytes;

	(void)state;
	assert_non_null(fx);
	fix_io(fx, 0, &io);
	assert_non_null(a = dte_engine_new_io(&io, dtc_backend_cpu(), "cpu"));
	fix_io(fx, 1, &io);
	assert_non_null(b = dte_engine_new_io(&io, dtc_backend_cpu(), "cpu"));
	ida = reg(101);
	idb = reg(201);
	assert_int_equal(dbuf_count(&bytes), 2);
	/* The first engine goes: the second one's buffers (and the
	 * first's, which their connections still own) stay. */
	dte_engine_free(a);
	assert_non_null(dbuf_get(201, idb));
	assert_non_null(dbuf_get(101, ida));
	assert_int_equal(dbuf_count(&bytes), 2);
	/* The last one ends the registry. */
	dte_engine_free(b);
	assert_int_equal(dbuf_count(&bytes), 0);
	fix_free(fx);
	print_message("engines: two in one process, registry kept by the survivor, ended by the last\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_engines_share_the_registry),
	};

	dlog_init(DLOG_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
