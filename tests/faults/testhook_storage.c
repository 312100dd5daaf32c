/* tests/faults/testhook_storage.c — the storage writer's test hook
 * (env DTE_STORAGE_HOOK), installed as storage_int.h's dts_fs_hook before
 * main() runs.
 *
 * Linked only into the test builds ($(B)/tests/dted-faults,
 * $(B)/tests/dte-storage-faults, tests/faults/faults.mk); the production
 * dted and dte-storage have neither this code nor the variable's name,
 * which tests/faults/prod_hooks.py checks.
 *
 * "chunk-pause", "manifest-pause": the writer stops half way through that
 * file until it is killed; "chunk-slow": the first chunk written is held
 * half way for 2 s (once per process), then finished; "read-miss-stop":
 * a reader stops itself (SIGSTOP) at its first manifest miss, between
 * that miss and its look for newer versions, until the test continues it
 * (once per process). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/storage/storage_int.h"

static void testhook_storage_reached(enum dts_hook hook, const char *path)
{
	const char *h = getenv("DTE_STORAGE_HOOK");

	if (hook == DTS_HOOK_READ_MISS) {
		static int stopped;

		if (__atomic_exchange_n(&stopped, 1, __ATOMIC_RELAXED))
			return;
		fprintf(stderr, "dte-storage hook: stopped after a miss in %s\n", path);
		fflush(stderr);
		raise(SIGSTOP);
		return;
	}
	if (h && !strcmp(h, "chunk-slow")) {
		static int done;

		if (__atomic_exchange_n(&done, 1, __ATOMIC_RELAXED))
			return;
		fprintf(stderr, "dte-storage hook: slowed in chunk %s\n", path);
		fflush(stderr);
		sleep(2);
		return;
	}
	fprintf(stderr, "dte-storage hook: paused in %s %s\n",
		hook == DTS_HOOK_CHUNK ? "chunk" : "manifest", path);
	fflush(stderr);
	for (;;)
		pause();
}

static enum dts_hook testhook_storage_armed(void)
{
	const char *h = getenv("DTE_STORAGE_HOOK");

	if (!h)
		return DTS_HOOK_NONE;
	if (!strcmp(h, "chunk-pause") || !strcmp(h, "chunk-slow"))
		return DTS_HOOK_CHUNK;
	if (!strcmp(h, "manifest-pause"))
		return DTS_HOOK_MANIFEST;
	if (!strcmp(h, "read-miss-stop"))
		return DTS_HOOK_READ_MISS;
	return DTS_HOOK_NONE;
}

static const struct dts_fs_hook testhook_storage = {
	.armed = testhook_storage_armed,
	.reached = testhook_storage_reached,
};

__attribute__((constructor)) static void testhook_storage_install(void)
{
	dts_fs_hook = &testhook_storage;
}
