/* tests/unit/slurp.h — a small text file (a model's config.json) read
 * whole, NUL-terminated, for the engine's unit tests; fails the test when
 * the file is missing.  Include after <cmocka.h>. */
#ifndef DTE_TEST_SLURP_H
#define DTE_TEST_SLURP_H

#include <stdio.h>
#include <stdlib.h>

static inline char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *s = calloc(1, 65536);
	size_t n;

	assert_non_null(f);
	n = fread(s, 1, 65535, f);
	s[n] = 0;
	fclose(f);
	return s;
}

#endif
