/* daemon/side_table.c — the published values of elements first marked
 * since a publish (side_table.h says why each step is safe). */
#include <stdlib.h>
#include <string.h>
#include "daemon/side_table.h"
#include "gpu/codec.h"
#include "gpu/elem.h"

/* Per kept element: its u32 position and u16 value. */
#define SIDE_ELEM_BYTES (sizeof(uint32_t) + sizeof(uint16_t))

static uint64_t side_cap_bytes = SIDE_CAP_DEFAULT;
static uint64_t side_held_bytes, side_peak_bytes;

void side_set_cap(uint64_t bytes)
{
	__atomic_store_n(&side_cap_bytes, bytes, __ATOMIC_RELAXED);
}

uint64_t side_cap(void)
{
	return __atomic_load_n(&side_cap_bytes, __ATOMIC_RELAXED);
}

uint64_t side_held(void)
{
	return __atomic_load_n(&side_held_bytes, __ATOMIC_RELAXED);
}

uint64_t side_peak(void)
{
	return __atomic_load_n(&side_peak_bytes, __ATOMIC_RELAXED);
}

/* Charge n bytes if the cap allows it. */
static int charge(uint64_t n)
{
	uint64_t cur = __atomic_load_n(&side_held_bytes, __ATOMIC_RELAXED), cap = side_cap(), pk;

	do {
		if (cur > cap || n > cap - cur)
			return 0;
	} while (!__atomic_compare_exchange_n(&side_held_bytes, &cur, cur + n, 1, __ATOMIC_RELAXED,
					      __ATOMIC_RELAXED));
	pk = __atomic_load_n(&side_peak_bytes, __ATOMIC_RELAXED);
	while (cur + n > pk && !__atomic_compare_exchange_n(&side_peak_bytes, &pk, cur + n, 1,
							     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	return 1;
}

static void uncharge(uint64_t n)
{
	__atomic_sub_fetch(&side_held_bytes, n, __ATOMIC_RELAXED);
}

/* How many of n more elements of `per` bytes the budget can take now. */
static size_t room(size_t n, uint64_t per)
{
	uint64_t cur = side_held(), cap = side_cap(), fit;

	if (cur >= cap)
		return 0;
	fit = (cap - cur) / per;
	return fit < n ? (size_t)fit : n;
}

struct side_tab *side_new(size_t n)
{
	uint64_t b = sizeof(struct side_tab) + (uint64_t)(n ? n : 1) * sizeof(struct side_run);
	struct side_tab *t;

	if (!charge(b))
		return NULL;
	if (!(t = calloc(1, sizeof(*t))) || !(t->r = calloc(n ? n : 1, sizeof(*t->r)))) {
		free(t);
		uncharge(b);
		return NULL;
	}
	t->n = n;
	t->bytes = b;
	return t;
}

void side_free(struct side_tab *t)
{
	if (!t)
		return;
	for (size_t q = 0; q < t->n; q++) {
		free(t->r[q].pos);
		free(t->r[q].bm);
		free(t->r[q].val);
	}
	free(t->r);
	uncharge(t->bytes);
	free(t);
}

size_t side_count(const struct side_tab *t)
{
	size_t n = 0;

	for (size_t q = 0; t && q < t->n; q++)
		n += t->r[q].n;
	return n;
}

void side_cand_free(struct side_cand *c)
{
	free(c->pos);
	free(c->val);
	memset(c, 0, sizeof(*c));
}

/* The previous BF16 of one flagged element, when the guard interval
 * decides it (the same bound dtc_adamw_changed_u() trusts for
 * "unchanged"): every value of [θ̂−e, θ̂+e] rounds to one BF16, which the
 * true θ_{t-1} then has too (RNE is monotone). */
static int prev_certain(const struct dtc_consts *k, float theta, float m, float v, uint16_t *out)
{
	float u = dtc_adamw_u(k, m, v), th, e;
	uint16_t lo, hi;

	if (!dtc_f32_finite(theta) || !dtc_f32_finite(u))
		return 0;
	th = dtc_adamw_prev(k, theta, u);
	e = dtc_guard_bound(th, theta, u);
	if (!dtc_f32_finite(th) || !dtc_f32_finite(e) || !dtc_f32_finite(th - e) ||
	    !dtc_f32_finite(th + e))
		return 0;
	lo = dtc_bf16_rne(th - e);
	hi = dtc_bf16_rne(th + e);
	if (lo != hi)
		return 0;
	*out = lo;
	return 1;
}

/* Source index of box positions visited in ascending order: a division
 * only when the row changes. */
struct src_rows {
	const struct dte_box_map *e;
	uint64_t ext, lo, hi;     /* the current row's positions [lo, hi) */
	int64_t src_row;
};

#define SIDE_PREFETCH 8

static int64_t src_of(struct src_rows *r, uint64_t pos, int64_t stride)
{
	if (pos < r->lo || pos >= r->hi) {
		const struct dte_box_map *e = r->e;
		uint64_t x = pos / r->ext;

		r->lo = x * r->ext;
		r->hi = r->lo + r->ext;
		r->src_row = e->src_offset;
		for (uint32_t d = e->ndim - 1; d-- > 0;) {
			r->src_row += (int64_t)(x % (uint64_t)e->extent[d]) * e->src_stride[d];
			x /= (uint64_t)e->extent[d];
		}
	}
	return r->src_row + (int64_t)(pos - r->lo) * stride;
}

int side_prev_scan(const struct dte_box_map *e, const struct dtc_consts *k,
		   const struct dtc_src *s, const uint64_t *flags, const uint64_t *skip,
		   uint64_t words, struct side_cand *c)
{
	uint64_t size = dtc_box_size(e), ext, bw, want = 0;
	uint32_t last;
	int64_t stride;
	int rc;

	if (!e || !k || !s || !flags || !c || !s->param || !s->exp_avg || !s->exp_avg_sq)
		return DTC_EINVAL;
	if ((rc = dtc_entry_check(e, s->len, UINT64_MAX)) != DTC_OK)
		return rc;
	/* Positions are kept as u32: a larger entry keeps the union. */
	if (size > UINT32_MAX)
		return DTC_OK;
	bw = dtc_bitmap_words(e);
	if (words < bw)
		return DTC_EINVAL;
	/* One allocation of the exact size: the bits to look at. */
	for (uint64_t w = 0; w < bw; w++)
		want += (uint64_t)__builtin_popcountll(flags[w] & (skip ? ~skip[w] : ~(uint64_t)0));
	if (c->n + want > c->cap) {
		size_t nc = c->n + want;
		uint32_t *np = realloc(c->pos, (nc ? nc : 1) * sizeof(*np));
		uint16_t *nv;

		if (!np)
			return DTC_ENOMEM;
		c->pos = np;
		if (!(nv = realloc(c->val, (nc ? nc : 1) * sizeof(*nv))))
			return DTC_ENOMEM;
		c->val = nv;
		c->cap = nc;
	}
	last = e->ndim - 1;
	ext = (uint64_t)e->extent[last];
	stride = e->src_stride[last];
	/* The positions first (from the bitmap alone), then θ, m, v at each:
	 * scattered reads the scan's stream no longer has in cache, so each
	 * is prefetched a few positions ahead. */
	{
		size_t first = c->n, np = 0;
		struct src_rows ahead = { e, ext, 1, 0, 0 }, here = { e, ext, 1, 0, 0 };

		for (uint64_t w = 0; w < bw; w++) {
			uint64_t bits = flags[w] & (skip ? ~skip[w] : ~(uint64_t)0);

			while (bits) {
				uint64_t pos = w * 64 + (uint64_t)__builtin_ctzll(bits);

				bits &= bits - 1;
				if (pos >= size)
					break;
				c->pos[first + np++] = (uint32_t)pos;
			}
		}
		for (size_t i = 0; i < np; i++) {
			uint64_t pos = c->pos[first + i];
			int64_t si = src_of(&here, pos, stride);
			uint16_t pv;

			if (i + SIDE_PREFETCH < np) {
				int64_t sa = src_of(&ahead, c->pos[first + i + SIDE_PREFETCH], stride);

				__builtin_prefetch(&s->param[sa]);
				__builtin_prefetch(&s->exp_avg[sa]);
				__builtin_prefetch(&s->exp_avg_sq[sa]);
			}
			if (!prev_certain(k, s->param[si], s->exp_avg[si], s->exp_avg_sq[si], &pv)) {
				c->uncertain++;
				continue;
			}
			c->pos[c->n] = (uint32_t)pos;	/* c->n <= first + i: behind the reads */
			c->val[c->n++] = pv;
		}
	}
	return DTC_OK;
}

static int bit(const uint64_t *bm, uint64_t pos)
{
	return (int)((bm[pos / 64] >> (pos % 64)) & 1);
}

static int run_has(const struct side_run *r, uint32_t p, size_t *hint)
{
	if (r->bm)
		return p / 64 < r->words && bit(r->bm, p);
	while (*hint < r->n && r->pos[*hint] < p)
		++*hint;
	return *hint < r->n && r->pos[*hint] == p;
}

/* Bytes of a run of n kept elements in either form. */
static uint64_t sparse_bytes(size_t n)
{
	return (uint64_t)n * SIDE_ELEM_BYTES;
}

static uint64_t dense_bytes(uint64_t words, size_t n)
{
	return words * sizeof(uint64_t) + (uint64_t)n * sizeof(uint16_t);
}

/* Sparse -> dense (the bitmap charged by the caller). */
static int run_densify(struct side_run *r, uint64_t words)
{
	uint64_t *bm = calloc(words ? words : 1, sizeof(*bm));

	if (!bm)
		return 0;
	for (size_t i = 0; i < r->n; i++)
		bm[r->pos[i] / 64] |= (uint64_t)1 << (r->pos[i] % 64);
	free(r->pos);
	r->pos = NULL;
	r->bm = bm;
	r->words = words;
	return 1;
}

/* Merge fit additions (ascending, none kept yet) into r, from the back,
 * r->val already grown to n + fit. */
static void run_merge(struct side_run *r, const uint32_t *ap, const uint16_t *av, size_t fit)
{
	size_t j = fit, w = r->n + fit;

	if (!r->bm) {
		size_t i = r->n;

		while (j > 0) {
			if (i > 0 && r->pos[i - 1] > ap[j - 1]) {
				i--;
				w--;
				r->pos[w] = r->pos[i];
				r->val[w] = r->val[i];
			} else {
				j--;
				w--;
				r->pos[w] = ap[j];
				r->val[w] = av[j];
			}
		}
	} else {
		/* old positions from the bitmap, descending; values move up */
		size_t i = r->n;
		uint64_t x = r->words;
		uint64_t bits = 0;
		int64_t cur = -1;	/* current old position, -1: none left */

		while (j > 0) {
			while (cur < 0 && i > 0) {
				if (!bits) {
					if (!x)
						break;
					bits = r->bm[--x];
					continue;
				}
				cur = (int64_t)(x * 64 + 63 - (uint64_t)__builtin_clzll(bits));
				bits &= ~((uint64_t)1 << (cur % 64));
			}
			if (cur >= 0 && (uint64_t)cur > ap[j - 1]) {
				i--;
				w--;
				r->val[w] = r->val[i];
				cur = -1;
			} else {
				j--;
				w--;
				r->val[w] = av[j];
			}
		}
		for (size_t k = 0; k < fit; k++)
			r->bm[ap[k] / 64] |= (uint64_t)1 << (ap[k] % 64);
	}
	r->n += fit;
}

void side_add(struct side_tab *t, size_t q, uint64_t box_size, const struct side_cand *c,
	      const uint64_t *dirty_before, uint64_t *kept, uint64_t *left_out)
{
	struct side_run *r;
	size_t add = 0, fit, j, hint = 0;
	uint64_t words = (box_size + 63) / 64, conv = 0, per;
	uint32_t *ap, *np = NULL;
	uint16_t *av, *nv;
	int densify;

	*kept = 0;
	if (!c || !c->n)
		return;
	if (!t || q >= t->n) {
		/* no table (cap reached when it was to be made): the first
		 * flags among them are what the cap left out */
		for (j = 0; j < c->n; j++)
			*left_out += c->pos[j] < box_size &&
				     !(dirty_before && bit(dirty_before, c->pos[j]));
		return;
	}
	r = &t->r[q];
	ap = malloc(c->n * sizeof(*ap));
	av = malloc(c->n * sizeof(*av));
	if (!ap || !av) {
		free(ap);
		free(av);
		*left_out += c->n;
		return;
	}
	/* First flags (dirty bit clear) not kept yet, ascending. */
	for (j = 0; j < c->n; j++) {
		if (c->pos[j] >= box_size || (dirty_before && bit(dirty_before, c->pos[j])))
			continue;
		if (run_has(r, c->pos[j], &hint))
			continue;
		ap[add] = c->pos[j];
		av[add++] = c->val[j];
	}
	if (!add)
		goto out;
	/* The cheaper form for what the run would hold. */
	densify = !r->bm && dense_bytes(words, r->n + add) < sparse_bytes(r->n + add);
	if (densify) {
		uint64_t db = dense_bytes(words, r->n), sb = sparse_bytes(r->n);

		conv = db > sb ? db - sb : 0;
		if (conv && !charge(conv))
			densify = 0, conv = 0;	/* no room for the bitmap: stay sparse */
		else if (!run_densify(r, words)) {
			uncharge(conv);
			densify = 0, conv = 0;
		} else {
			/* a bitmap smaller than the positions it replaces */
			if (sb > db)
				uncharge(sb - db);
			t->bytes = t->bytes + db - sb;
		}
	}
	per = r->bm ? sizeof(uint16_t) : SIDE_ELEM_BYTES;
	fit = room(add, per);
	*left_out += add - fit;
	if (!fit)
		goto out;
	if (!charge((uint64_t)fit * per)) {
		*left_out += fit;
		goto out;
	}
	if (!r->bm) {
		np = realloc(r->pos, (r->n + fit) * sizeof(*np));
		if (np)
			r->pos = np;
	}
	nv = (r->bm || np) ? realloc(r->val, (r->n + fit) * sizeof(*nv)) : NULL;
	if (nv)
		r->val = nv;
	if (!nv) {
		uncharge((uint64_t)fit * per);
		*left_out += fit;
		goto out;
	}
	t->bytes += (uint64_t)fit * per;
	run_merge(r, ap, av, fit);
	*kept = fit;
out:
	free(ap);
	free(av);
}

/* Rank of position p in a dense run: kept positions below it. */
static size_t dense_rank(const struct side_run *r, uint64_t p)
{
	size_t k = 0;

	for (uint64_t x = 0; x < p / 64; x++)
		k += (size_t)__builtin_popcountll(r->bm[x]);
	if (p % 64)
		k += (size_t)__builtin_popcountll(r->bm[p / 64] & (((uint64_t)1 << (p % 64)) - 1));
	return k;
}

int side_lookup(const struct side_tab *t, size_t q, uint64_t pos, uint16_t *val)
{
	const struct side_run *r;
	size_t lo = 0, hi;

	if (!t || q >= t->n || pos > UINT32_MAX)
		return 0;
	r = &t->r[q];
	if (r->bm) {
		if (pos / 64 >= r->words || !bit(r->bm, pos))
			return 0;
		*val = r->val[dense_rank(r, pos)];
		return 1;
	}
	hi = r->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (r->pos[mid] < pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < r->n && r->pos[lo] == pos) {
		*val = r->val[lo];
		return 1;
	}
	return 0;
}

/* The sparse payload's gap codes (gpu/codec.h): gap = pos - prev - 1,
 * 0xxxxxxx (< 128), 10xxxxxx yyyyyyyy (128 + x·256 + y, < 16512), or
 * 0xC0 and a LEB128 varint (larger).  Read with every bound checked. */
#define GAP1_MAX 128u
#define GAP2_MAX (128u + 16384u)
#define GAP_ESCAPE 0xC0u

static int gap_get(const uint8_t **q, const uint8_t *end, uint64_t *gap)
{
	uint8_t b;

	if (*q >= end)
		return DTC_ETRUNC;
	b = *(*q)++;
	if (b < 0x80) {
		*gap = b;
		return DTC_OK;
	}
	if (b < GAP_ESCAPE) {
		if (*q >= end)
			return DTC_ETRUNC;
		*gap = GAP1_MAX + ((uint64_t)(b & 0x3f) << 8) + *(*q)++;
		return DTC_OK;
	}
	if (b == GAP_ESCAPE)
		return dtc_varint_get(q, end, gap);
	return DTC_ECORRUPT;
}

/* Writes gap's code at o (NULL: only its length). */
static size_t gap_put(uint8_t *o, uint64_t gap)
{
	uint8_t tmp[DTC_VARINT_MAX];

	if (gap < GAP1_MAX) {
		if (o)
			o[0] = (uint8_t)gap;
		return 1;
	}
	if (gap < GAP2_MAX) {
		if (o) {
			o[0] = (uint8_t)(0x80 | ((gap - GAP1_MAX) >> 8));
			o[1] = (uint8_t)(gap - GAP1_MAX);
		}
		return 2;
	}
	if (o) {
		o[0] = GAP_ESCAPE;
		return 1 + dtc_varint_put(o + 1, gap);
	}
	return 1 + dtc_varint_put(tmp, gap);
}

/* Walks a run alongside ascending positions: is pos kept, with which value. */
struct run_cursor {
	const struct side_run *r;
	size_t i;                 /* sparse: index; dense: rank of word wx */
	uint64_t wx;
};

static int cursor_at(struct run_cursor *c, uint64_t pos, uint16_t *val)
{
	const struct side_run *r = c->r;

	if (r->bm) {
		uint64_t w = pos / 64;

		if (w >= r->words)
			return 0;
		for (; c->wx < w; c->wx++)
			c->i += (size_t)__builtin_popcountll(r->bm[c->wx]);
		if (!bit(r->bm, pos))
			return 0;
		*val = r->val[c->i + (size_t)__builtin_popcountll(r->bm[w] &
								   (((uint64_t)1 << (pos % 64)) - 1))];
		return 1;
	}
	while (c->i < r->n && r->pos[c->i] < pos)
		c->i++;
	if (c->i < r->n && r->pos[c->i] == pos) {
		*val = r->val[c->i];
		return 1;
	}
	return 0;
}

/* Two passes over the payload, in place.  The first only reads: which
 * positions go, and the size of what is left (never more than what was
 * there: each dropped element frees its 2 value bytes and its own code,
 * and merging its gap into the next code adds at most one byte; checked
 * anyway, the payload is left as it was otherwise).  The second writes
 * the kept values down inside the values (never ahead of what it reads)
 * and the new gap codes to a scratch of their exact size, then puts the
 * count, the codes and the values in place. */
int side_filter(const struct side_tab *t, size_t q, uint64_t box_size, uint8_t *p,
		size_t *len, uint64_t *count, uint64_t *dropped, int *wrong)
{
	const uint8_t *end = p + *len, *g;
	uint8_t *vin, *codes = NULL, hdr[DTC_VARINT_MAX];
	uint64_t n = 0, kept = 0, next, last, gap;
	size_t codes_len = 0, hlen = 0, olen = 0;
	int rc, pass, wr = 0;

	if (!t || q >= t->n || !t->r[q].n || !*len)
		return DTC_OK;
	if ((rc = dtc_sparse_count(p, *len, box_size, &n)) != DTC_OK)
		return rc;
	if (!n)
		return DTC_OK;
	g = p;
	if ((rc = dtc_varint_get(&g, end, &n)) != DTC_OK)
		return rc;
	if ((size_t)(end - g) / 2 < n)
		return DTC_ETRUNC;
	vin = p + *len - 2 * n;
	for (pass = 0; pass < 2; pass++) {
		struct run_cursor cur = { &t->r[q], 0, 0 };
		const uint8_t *r = g;
		size_t o = 0;

		wr = wrong ? *wrong : 0;
		kept = 0;
		next = last = 0;
		for (uint64_t j = 0; j < n; j++) {
			uint16_t v, kv;
			uint64_t pos;

			if ((rc = gap_get(&r, vin, &gap)) != DTC_OK)
				goto fail;
			pos = next + gap;
			if (pos < next || pos >= box_size) {
				rc = DTC_ECORRUPT;
				goto fail;
			}
			next = pos + 1;
			v = (uint16_t)(vin[2 * j] | vin[2 * j + 1] << 8);
			if (cursor_at(&cur, pos, &kv)) {
				if (kv == v)
					continue;	/* the sink holds it already */
				if (wr > 0) {
					wr--;	/* a test build's fault: a change withheld */
					continue;
				}
			}
			if (pass) {
				o += gap_put(codes + o, pos - last);
				vin[2 * kept] = (uint8_t)v;
				vin[2 * kept + 1] = (uint8_t)(v >> 8);
			} else {
				o += gap_put(NULL, pos - last);
			}
			last = pos + 1;
			kept++;
		}
		if (r != vin) {
			rc = DTC_ECORRUPT;	/* codes and values do not meet */
			goto fail;
		}
		if (kept == n)
			return DTC_OK;		/* (first pass: nothing written) */
		if (!pass) {
			codes_len = o;
			hlen = dtc_varint_put(hdr, kept);
			olen = hlen + codes_len + 2 * kept;
			if (olen > *len)
				return DTC_OK;	/* see above: cannot happen; all is sent */
			if (!(codes = malloc(codes_len ? codes_len : 1)))
				return DTC_ENOMEM;
		}
	}
	memmove(p + hlen + codes_len, vin, 2 * kept);
	memcpy(p + hlen, codes, codes_len);
	memcpy(p, hdr, hlen);
	free(codes);
	*len = olen;
	*dropped += n - kept;
	*count = kept;
	if (wrong)
		*wrong = wr;
	return DTC_OK;
fail:
	/* only ever in the first pass (the second reads what it read) */
	free(codes);
	return rc;
}
