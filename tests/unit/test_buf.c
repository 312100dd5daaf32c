/* tests/unit/test_buf.c — registered buffers: size/offset/seal checks,
 * ownership, references, release with the connection. */
#include <errno.h>
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
#include "daemon/buf.h"
#include "daemon/log.h"

static int sealed_memfd(size_t size)
{
	int fd = memfd_create("test-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	return fd;
}

static void test_register_maps_the_right_bytes(void **state)
{
	int fd = sealed_memfd(8192);
	uint16_t *mine = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	char err[256];
	uint64_t id;
	struct dbuf *b;

	assert_true(mine != MAP_FAILED);
	mine[4096 / 2 + 3] = 0xbeef;
	/* The daemon closes the fd it is given: hand it a dup. */
	assert_int_equal(dbuf_register_fd(7, dup(fd), 4096, 100, DBUF_BF16, "w", &id, err,
					  sizeof(err)), 0);
	b = dbuf_get(7, id);
	assert_non_null(b);
	assert_int_equal(b->length, 100);
	assert_int_equal(((uint16_t *)b->ptr)[3], 0xbeef);
	((uint16_t *)b->ptr)[5] = 0x1234;	/* MAP_SHARED: the client sees it */
	assert_int_equal(mine[4096 / 2 + 5], 0x1234);
	assert_null(dbuf_get(8, id));		/* another connection cannot name it */
	assert_int_equal(dbuf_unregister(8, id, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "not registered on this connection"));
	assert_int_equal(dbuf_unregister(7, id, err, sizeof(err)), 0);
	assert_null(dbuf_get(7, id));
	munmap(mine, 8192);
	close(fd);
	assert_int_equal(dbuf_count(NULL), 0);
}

static void test_bad_registrations(void **state)
{
	int fd = sealed_memfd(4096), p[2];
	char err[256];
	uint64_t id = 99;

	assert_int_equal(dbuf_register_fd(1, dup(fd), 4096, 1, DBUF_FP32, "", &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "outside"));
	assert_int_equal(dbuf_register_fd(1, dup(fd), 0, 1025, DBUF_FP32, "", &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "outside"));
	assert_int_equal(dbuf_register_fd(1, dup(fd), 2, 4, DBUF_FP32, "", &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "multiple"));
	assert_int_equal(dbuf_register_fd(1, dup(fd), 0, 0, DBUF_BF16, "", &id, err, sizeof(err)), -EINVAL);
	assert_int_equal(dbuf_register_fd(1, dup(fd), 0, UINT64_MAX / 2, DBUF_BF16, "", &id, err,
					  sizeof(err)), -EINVAL);
	assert_int_equal(dbuf_register_fd(1, dup(fd), UINT64_MAX - 1, 1, DBUF_BF16, "", &id, err,
					  sizeof(err)), -EINVAL);
	assert_int_equal(dbuf_register_fd(1, dup(fd), 0, 1, 7, "", &id, err, sizeof(err)), -EINVAL);
	assert_int_equal(dbuf_register_fd(1, -1, 0, 1, DBUF_BF16, "", &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "SCM_RIGHTS"));
	assert_int_equal(pipe(p), 0);
	assert_int_equal(dbuf_register_fd(1, p[0], 0, 1, DBUF_BF16, "", &id, err, sizeof(err)), -EINVAL);
	close(p[1]);
	{
		int u = memfd_create("unsealed", MFD_CLOEXEC);

		assert_int_equal(ftruncate(u, 4096), 0);
		assert_int_equal(dbuf_register_fd(1, u, 0, 8, DBUF_BF16, "", &id, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "F_SEAL_SHRINK"));
	}
	assert_int_equal(id, 99);	/* outputs only on success */
	assert_int_equal(dbuf_count(NULL), 0);
	close(fd);
}

static void test_refs_and_release(void **state)
{
	int fd = sealed_memfd(4096);
	char err[256];
	uint64_t a, b, bytes;
	struct dbuf *ba;

	assert_int_equal(dbuf_register_fd(3, dup(fd), 0, 512, DBUF_FP32, "a", &a, err, sizeof(err)), 0);
	assert_int_equal(dbuf_register_fd(3, dup(fd), 0, 1024, DBUF_BF16, "b", &b, err, sizeof(err)), 0);
	assert_int_not_equal(a, b);
	assert_int_equal(dbuf_count(&bytes), 2);
	assert_int_equal(bytes, 512 * 4 + 1024 * 2);
	ba = dbuf_get(3, a);
	dbuf_ref(ba);
	assert_int_equal(dbuf_unregister(3, a, err, sizeof(err)), -EBUSY);
	assert_non_null(strstr(err, "in use"));
	/* The connection goes: b goes now, a once its participant lets go. */
	dbuf_release_owner(3);
	assert_null(dbuf_get(3, a));
	assert_int_equal(dbuf_count(NULL), 0);
	assert_int_equal(((float *)ba->ptr)[0], 0.0f);	/* still mapped while referenced */
	dbuf_unref(ba);
	close(fd);
}

static void test_cuda_needs_a_device(void **state)
{
	uint8_t h[64] = { 1 };
	char err[256];
	uint64_t id;

	assert_int_equal(dbuf_register_cuda(1, "cpu", h, sizeof(h), NULL, 0, 0, 16, DBUF_BF16, 0, "g",
					    &id, err, sizeof(err)), -EOPNOTSUPP);
	assert_non_null(strstr(err, "no CUDA device"));
	assert_int_equal(dbuf_register_cuda(1, "cuda", h, 65, NULL, 0, 0, 16, DBUF_BF16, 0, "g", &id,
					    err, sizeof(err)), -EINVAL);
	/* The handle is opened at registration (daemon/job_cuda.c), so a
	 * daemon whose engine has no device refuses it there, leaving nothing. */
	assert_int_equal(dbuf_register_cuda(1, "cuda", h, sizeof(h), h, 64, 256, 16, DBUF_BF16, 0, "g",
					    &id, err, sizeof(err)), -EOPNOTSUPP);
	assert_non_null(strstr(err, "no CUDA device"));
	dbuf_release_owner(1);
	assert_int_equal(dbuf_count(NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_register_maps_the_right_bytes),
		cmocka_unit_test(test_bad_registrations),
		cmocka_unit_test(test_refs_and_release),
		cmocka_unit_test(test_cuda_needs_a_device),
	};

	dlog_init(DLOG_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
