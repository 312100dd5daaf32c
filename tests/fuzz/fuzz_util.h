/* tests/fuzz/fuzz_util.h — what every libFuzzer target shares.
 *
 * A target turns the fuzzer's bytes into calls on the product's parsers and
 * checks properties the parser promises (not just "did not crash"): a
 * broken promise aborts, which libFuzzer reports as a crash with the input
 * saved, exactly like a sanitizer finding.
 */
#ifndef DTE_FUZZ_UTIL_H
#define DTE_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FUZZ_CHECK(cond, ...)                                               \
	do {                                                                \
		if (!(cond)) {                                              \
			fprintf(stderr, "%s:%d: property broken: %s: ",     \
				__FILE__, __LINE__, #cond);                 \
			fprintf(stderr, __VA_ARGS__);                       \
			fputc('\n', stderr);                                \
			abort();                                            \
		}                                                           \
	} while (0)

/* Consumes the input from the front; reads past the end give zeros, so a
 * short input still drives a whole call. */
struct fuzz_in {
	const uint8_t *p;
	size_t n;
};

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
	uint8_t v = 0;

	if (in->n) {
		v = *in->p++;
		in->n--;
	}
	return v;
}

static inline uint64_t fuzz_uint(struct fuzz_in *in, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)fuzz_u8(in) << (8 * i);
	return v;
}

/* A small deterministic PRNG (splitmix64) for choices that should not eat
 * the input itself, e.g. where to split a stream. */
static inline uint64_t fuzz_mix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* NUL-terminated malloc()ed copy of the rest of the input. */
static inline char *fuzz_cstr(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1);

	if (!s)
		abort();
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

#endif
