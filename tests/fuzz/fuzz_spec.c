/* tests/fuzz/fuzz_spec.c — the HF config.json model spec parser
 * (daemon/layout/spec.c).
 *
 * The input is the config.json text.  Properties: 0 or -1 with a message;
 * on failure the spec is left zeroed (spec.h promises nothing to free); on
 * success every tensor has 1..DTE_MAX_DIMS positive dims whose product is
 * its numel, names are terminated and unique (dte_spec_find gives each
 * tensor's own id), total_elems is the sum, and a second parse of the same
 * text gives the same hash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/layout/spec.h"
#include "tests/fuzz/fuzz_util.h"

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = fuzz_cstr(data, size);
	struct dte_spec s, again, zero;
	char err[512] = "";
	int64_t total = 0;
	const char **names;

	memset(&zero, 0, sizeof(zero));
	if (dte_spec_load_string(&s, text, err, sizeof(err))) {
		FUZZ_CHECK(err[0], "failed without a message");
		FUZZ_CHECK(memcmp(&s, &zero, sizeof(s)) == 0, "failed spec not zeroed");
		free(text);
		return 0;
	}
	FUZZ_CHECK(s.n > 0 && s.t, "empty spec");
	names = malloc(s.n * sizeof(*names));
	if (!names)
		abort();
	for (uint32_t i = 0; i < s.n; i++) {
		const struct dte_spec_tensor *t = &s.t[i];
		int64_t numel = 1;

		FUZZ_CHECK(memchr(t->name, 0, sizeof(t->name)) && t->name[0], "tensor %u name", i);
		FUZZ_CHECK(t->ndim >= 1 && t->ndim <= DTE_MAX_DIMS, "%s: ndim %u", t->name, t->ndim);
		for (uint32_t d = 0; d < t->ndim; d++) {
			FUZZ_CHECK(t->shape[d] > 0, "%s: dim %u is %lld", t->name, d,
				   (long long)t->shape[d]);
			FUZZ_CHECK(!__builtin_mul_overflow(numel, t->shape[d], &numel),
				   "%s: numel overflows", t->name);
		}
		FUZZ_CHECK(numel == t->numel, "%s: numel %lld, shape says %lld", t->name,
			   (long long)t->numel, (long long)numel);
		FUZZ_CHECK(!__builtin_add_overflow(total, numel, &total), "total overflows");
		/* dte_spec_find is a linear scan: sample it, check uniqueness below. */
		if (i % (s.n / 64 + 1) == 0 || i == s.n - 1)
			FUZZ_CHECK(dte_spec_find(&s, t->name) == (int32_t)i, "%s: found as %d, id %u",
				   t->name, dte_spec_find(&s, t->name), i);
		names[i] = t->name;
	}
	qsort(names, s.n, sizeof(*names), cmp_name);
	for (uint32_t i = 1; i < s.n; i++)
		FUZZ_CHECK(strcmp(names[i - 1], names[i]) != 0, "two tensors named %s", names[i]);
	free(names);
	FUZZ_CHECK(total == s.total_elems, "total_elems %lld, tensors sum to %lld",
		   (long long)s.total_elems, (long long)total);
	FUZZ_CHECK(dte_spec_load_string(&again, text, err, sizeof(err)) == 0 &&
		   again.hash == s.hash && again.n == s.n, "second parse differs");
	dte_spec_fini(&again);
	dte_spec_fini(&s);
	free(text);
	return 0;
}
