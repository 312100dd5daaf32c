/* daemon/job_snapshot.c — snapshot-diff detection, the honest baseline.
 *
 * What PULSE- and slime-style systems do: keep the BF16 version the sink
 * holds and compare the new one against it.  It needs no optimizer state
 * (any optimizer, post-step weight edits, AMSGrad all work) and flags
 * exactly the elements whose rounding changed, at the price of 2 bytes per
 * element of daemon memory, held for the job's life (DESIGN §8 compares
 * it with AdamW inversion, which keeps nothing).
 *
 * Correct only while the kept values are what the sink holds: the caller
 * scans every version it sends sparse and calls jsnap_keep() after a dense
 * one; anything that may break that (re-plan, refusal) must jsnap_fini(),
 * after which the next scan flags every element.
 */
#include <stdlib.h>
#include <string.h>
#include "daemon/job_snapshot.h"

int jsnap_scan(struct jsnap *s, const struct dtc_backend *be, const struct dte_box_map *e,
	       const float *param, uint64_t param_len, uint64_t *bitmap, uint64_t words,
	       uint64_t *count)
{
	uint64_t n = dtc_box_size(e), pop = 0;
	uint16_t *cur;
	int rc;

	if (!s || !bitmap || !n || words < dtc_bitmap_words(e))
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, param_len, UINT64_MAX)) != DTC_OK)
		return rc;
	if (!(cur = malloc(n * sizeof(*cur))))
		return DTC_ENOMEM;
	if ((rc = dtc_dense_extract(be, e, param, param_len, cur)) != DTC_OK) {
		free(cur);
		return rc;
	}
	if (s->vals && s->n == n) {
		for (uint64_t i = 0; i < n; i++)
			if (cur[i] != s->vals[i])
				bitmap[i >> 6] |= 1ull << (i & 63);
	} else {
		/* Nothing to compare with: everything may have changed. */
		for (uint64_t i = 0; i < n / 64; i++)
			bitmap[i] = ~0ull;
		if (n % 64)
			bitmap[n / 64] |= (1ull << (n % 64)) - 1;
	}
	for (uint64_t i = 0; i < dtc_bitmap_words(e); i++)
		pop += (uint64_t)__builtin_popcountll(bitmap[i]);
	free(s->vals);
	s->vals = cur;
	s->n = n;
	if (count)
		*count = pop;
	return DTC_OK;
}

int jsnap_keep(struct jsnap *s, const uint16_t *vals, uint64_t n)
{
	uint16_t *p;

	if (!s || !vals || !n)
		return DTC_EINVAL;
	if (s->vals && s->n == n) {
		memcpy(s->vals, vals, n * sizeof(*vals));
		return DTC_OK;
	}
	if (!(p = malloc(n * sizeof(*p))))
		return DTC_ENOMEM;
	memcpy(p, vals, n * sizeof(*p));
	free(s->vals);
	s->vals = p;
	s->n = n;
	return DTC_OK;
}

void jsnap_fini(struct jsnap *s)
{
	if (!s)
		return;
	free(s->vals);
	s->vals = NULL;
	s->n = 0;
}

void jsnap_free_all(struct jsnap *s, size_t n)
{
	for (size_t i = 0; s && i < n; i++)
		jsnap_fini(&s[i]);
	free(s);
}
