/* daemon/layout/layout.c — piece/buffer containers, box arithmetic, flat
 * range decomposition and the per-layout consistency checks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "daemon/layout/gen.h"
#include "daemon/layout/layout.h"

/* A bitmap check of overlapping strided pieces is bounded: beyond this the
 * layout is refused rather than risk a huge allocation. */
#define LAYOUT_BITMAP_MAX (INT64_C(1) << 28)

int dte_layout_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -1;
}

const char *dte_layout_box_str(char *buf, size_t len, uint32_t ndim,
			       const int64_t *lo, const int64_t *hi)
{
	size_t o = 0;
	uint32_t d;

	o += (size_t)snprintf(buf + o, len - o, "[");
	for (d = 0; d < ndim && o < len; d++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld:%lld", d ? ", " : "",
				      (long long)lo[d], (long long)hi[d]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	return buf;
}

/* Names: an open-addressing set of strings over an arena of blocks. */
#define NAMES_BLOCK ((size_t)1 << 16)

struct names_block {
	struct names_block *next;
	size_t              used, size;
	char                data[];
};

struct dte_layout_names {
	struct names_block *blocks;
	const char        **slot;
	uint64_t           *hash;
	size_t              cap, n;     /* cap: a power of two */
};

static uint64_t names_hash(const char *s, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
	return h | 1;	/* 0: an empty slot */
}

static void names_free(struct dte_layout_names *nm)
{
	if (!nm)
		return;
	while (nm->blocks) {
		struct names_block *b = nm->blocks;
		nm->blocks = b->next;
		free(b);
	}
	free(nm->slot);
	free(nm->hash);
	free(nm);
}

static int names_grow(struct dte_layout_names *nm)
{
	size_t ncap = nm->cap ? nm->cap * 2 : 1024, i;
	const char **slot = calloc(ncap, sizeof(*slot));
	uint64_t *hash = calloc(ncap, sizeof(*hash));

	if (!slot || !hash) {
		free(slot);
		free(hash);
		return -1;
	}
	for (i = 0; i < nm->cap; i++)
		if (nm->hash[i]) {
			size_t j = nm->hash[i] & (ncap - 1);
			while (hash[j])
				j = (j + 1) & (ncap - 1);
			hash[j] = nm->hash[i];
			slot[j] = nm->slot[i];
		}
	free(nm->slot);
	free(nm->hash);
	nm->slot = slot;
	nm->hash = hash;
	nm->cap = ncap;
	return 0;
}

/* The layout's copy of s (cut at DTE_LAYOUT_NAME_MAX - 1 characters). */
static const char *layout_intern(struct dte_layout *l, const char *s)
{
	struct dte_layout_names *nm = l->names;
	size_t len = strnlen(s, DTE_LAYOUT_NAME_MAX - 1), j;
	uint64_t h = names_hash(s, len);
	struct names_block *b;
	char *c;

	if (!nm && !(nm = l->names = calloc(1, sizeof(*nm))))
		return NULL;
	if (2 * (nm->n + 1) > nm->cap && names_grow(nm))
		return NULL;
	for (j = h & (nm->cap - 1); nm->hash[j]; j = (j + 1) & (nm->cap - 1))
		if (nm->hash[j] == h && !strncmp(nm->slot[j], s, len) && !nm->slot[j][len])
			return nm->slot[j];
	b = nm->blocks;
	if (!b || b->size - b->used < len + 1) {
		size_t size = len + 1 > NAMES_BLOCK ? len + 1 : NAMES_BLOCK;
		if (!(b = malloc(sizeof(*b) + size)))
			return NULL;
		b->next = nm->blocks;
		b->used = 0;
		b->size = size;
		nm->blocks = b;
	}
	c = b->data + b->used;
	memcpy(c, s, len);
	c[len] = 0;
	b->used += len + 1;
	nm->hash[j] = h;
	nm->slot[j] = c;
	nm->n++;
	return c;
}

void dte_layout_init(struct dte_layout *l, int role, uint64_t spec_hash)
{
	memset(l, 0, sizeof(*l));
	l->role = role;
	l->spec_hash = spec_hash;
}

void dte_layout_fini(struct dte_layout *l)
{
	free(l->pieces);
	free(l->bufs);
	free(l->tensors);
	free(l->fp8);
	names_free(l->names);
	if (l->rule)
		l->rule_ops->free(l->rule);
	memset(l, 0, sizeof(*l));
}

static int layout_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	size_t ncap;
	void *p;

	if (n < *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 64;
	p = realloc(*arr, ncap * elem);
	if (!p)
		return -1;
	*arr = p;
	*cap = ncap;
	return 0;
}

void dte_layout_prefault(void *mem, size_t len)
{
	char *p = mem;

#ifdef MADV_POPULATE_WRITE
	uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, b = ((uintptr_t)p + len) & ~(uintptr_t)4095;

	if (len >= ((size_t)1 << 22) && b > a)
		(void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
	(void)p;
	(void)len;
#endif
}

static int layout_room(void **arr, size_t *cap, size_t n, size_t more, size_t elem)
{
	void *p;

	if (!more || n + more <= *cap)
		return 0;
	p = realloc(*arr, (n + more) * elem);
	if (!p)
		return -1;
	*arr = p;
	*cap = n + more;
	dte_layout_prefault((char *)p + n * elem, more * elem);
	return 0;
}

int dte_layout_reserve(struct dte_layout *l, size_t pieces, size_t bufs, size_t tensors)
{
	return layout_room((void **)&l->pieces, &l->cap_pieces, l->npieces, pieces, sizeof(*l->pieces)) ||
	       layout_room((void **)&l->bufs, &l->cap_bufs, l->nbufs, bufs, sizeof(*l->bufs)) ||
	       layout_room((void **)&l->tensors, &l->cap_tensors, l->ntensors, tensors, sizeof(*l->tensors))
		       ? -1 : 0;
}

int dte_layout_add_piece(struct dte_layout *l, const struct dte_piece *p)
{
	if (layout_grow((void **)&l->pieces, &l->cap_pieces, l->npieces, sizeof(*p)))
		return -1;
	l->pieces[l->npieces++] = *p;
	if (p->rank >= l->nranks)
		l->nranks = p->rank + 1;
	return 0;
}

const char *dte_layout_name(struct dte_layout *l, const char *fmt, ...)
{
	char name[DTE_LAYOUT_NAME_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	return layout_intern(l, name);
}

int dte_layout_add_tensor_named(struct dte_layout *l, uint32_t rank, uint32_t buf, int64_t offset,
				uint32_t ndim, const int64_t *shape, const char *name)
{
	struct dte_layout_tensor *t;

	if (ndim < 1 || ndim > DTE_MAX_DIMS || !name)
		return -1;
	if (l->no_tensors)
		return 0;
	if (layout_grow((void **)&l->tensors, &l->cap_tensors, l->ntensors, sizeof(*t)))
		return -1;
	t = &l->tensors[l->ntensors++];
	memset(t, 0, sizeof(*t));
	t->rank = rank;
	t->buf = buf;
	t->ndim = ndim;
	t->offset = offset;
	memcpy(t->shape, shape, ndim * sizeof(*shape));
	t->name = name;
	return 0;
}

int dte_layout_add_tensor(struct dte_layout *l, uint32_t rank, uint32_t buf, int64_t offset,
			  uint32_t ndim, const int64_t *shape, const char *name)
{
	if (ndim < 1 || ndim > DTE_MAX_DIMS)
		return -1;
	if (l->no_tensors)
		return 0;
	return dte_layout_add_tensor_named(l, rank, buf, offset, ndim, shape, layout_intern(l, name));
}

int64_t dte_layout_add_buffer_named(struct dte_layout *l, uint32_t rank, int64_t id, int64_t length,
				    const char *name)
{
	struct dte_layout_buffer *b;
	size_t i;

	if (!name || layout_grow((void **)&l->bufs, &l->cap_bufs, l->nbufs, sizeof(*b)))
		return -1;
	/* Generators add a rank's buffers together, so scanning back is short. */
	for (i = l->nbufs; id < 0 && i > 0; i--)
		if (l->bufs[i - 1].rank == rank)
			id = l->bufs[i - 1].id + 1;
	if (id < 0)
		id = 0;
	b = &l->bufs[l->nbufs++];
	b->rank = rank;
	b->id = (uint32_t)id;
	b->length = length;
	b->name = name;
	if (rank >= l->nranks)
		l->nranks = rank + 1;
	return id;
}

int64_t dte_layout_add_buffer(struct dte_layout *l, uint32_t rank, int64_t id, int64_t length,
			      const char *fmt, ...)
{
	char name[DTE_LAYOUT_NAME_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	return dte_layout_add_buffer_named(l, rank, id, length, layout_intern(l, name));
}

static int buf_cmp(const void *a, const void *b);

void dte_layout_sort_buffers(struct dte_layout *l)
{
	size_t i;

	/* Generators mostly add them in order already. */
	for (i = 1; i < l->nbufs && buf_cmp(&l->bufs[i - 1], &l->bufs[i]) < 0; i++)
		;
	/* A source rank without shards leaves a layout with no buffers. */
	if (i < l->nbufs)
		qsort(l->bufs, l->nbufs, sizeof(*l->bufs), buf_cmp);
}

static int buf_cmp(const void *a, const void *b)
{
	const struct dte_layout_buffer *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

const struct dte_layout_buffer *dte_layout_buffer_find(const struct dte_layout *l,
						       uint32_t rank, uint32_t id)
{
	struct dte_layout_buffer key;

	if (l->rule)
		return NULL;
	key.rank = rank;
	key.id = id;
	/* Buffers are kept sorted by (rank, id): generators add them in that
	 * order and the JSON loader sorts. */
	return bsearch(&key, l->bufs, l->nbufs, sizeof(key), buf_cmp);
}

/* Index of buffer (rank, id) in the layout's order; SIZE_MAX: none. */
static size_t layout_buffer_index(const struct dte_layout *l, uint32_t rank, uint32_t id)
{
	const struct dte_layout_buffer *b;

	if (l->rule)
		return l->rule_ops->buffer_index(l, rank, id);
	b = dte_layout_buffer_find(l, rank, id);
	return b ? (size_t)(b - l->bufs) : SIZE_MAX;
}

const struct dte_layout_buffer *dte_layout_buffer_get(const struct dte_layout *l, uint32_t rank,
						      uint32_t id, struct dte_layout_buffer *tmp)
{
	size_t i = layout_buffer_index(l, rank, id);

	return i == SIZE_MAX ? NULL : dte_layout_buffer(l, i, tmp);
}

int64_t dte_piece_volume(const struct dte_piece *p)
{
	int64_t v = 1;
	uint32_t d;

	for (d = 0; d < p->ndim; d++)
		v *= p->hi[d] - p->lo[d];
	return v;
}

int64_t dte_box_intersect(uint32_t ndim, const int64_t *alo, const int64_t *ahi,
			  const int64_t *blo, const int64_t *bhi,
			  int64_t *olo, int64_t *ohi)
{
	int64_t v = 1;
	uint32_t d;

	for (d = 0; d < ndim; d++) {
		int64_t lo = alo[d] > blo[d] ? alo[d] : blo[d];
		int64_t hi = ahi[d] < bhi[d] ? ahi[d] : bhi[d];
		if (hi <= lo)
			return 0;
		if (olo) {
			olo[d] = lo;
			ohi[d] = hi;
		}
		v *= hi - lo;
	}
	return v;
}

/* Recursive step: range [a, b) of the sub-tensor shape[0..ndim), with the
 * outer coordinates fixed in prefix_lo/prefix_hi (depth dims). */
static int flat_rec(uint32_t ndim, const int64_t *shape, uint32_t depth,
		    const int64_t *prefix, int64_t a, int64_t b,
		    int64_t lo[][DTE_MAX_DIMS], int64_t hi[][DTE_MAX_DIMS], int n)
{
	int64_t inner = 1, r0, r1, ra, rb;
	int64_t pre[DTE_MAX_DIMS];
	uint32_t d;

	if (a >= b)
		return n;
	for (d = depth + 1; d < ndim; d++)
		inner *= shape[d];
	if (depth)
		memcpy(pre, prefix, depth * sizeof(int64_t));
	if (depth + 1 == ndim || (a % inner == 0 && b % inner == 0)) {
		/* Whole rows of this dim (or the last dim): one box. */
		for (d = 0; d < depth; d++) {
			lo[n][d] = pre[d];
			hi[n][d] = pre[d] + 1;
		}
		lo[n][depth] = a / inner;
		hi[n][depth] = b / inner;
		for (d = depth + 1; d < ndim; d++) {
			lo[n][d] = 0;
			hi[n][d] = shape[d];
		}
		return n + 1;
	}
	r0 = a / inner;
	r1 = b / inner;
	ra = a % inner;
	rb = b % inner;
	if (r0 == r1) {
		pre[depth] = r0;
		return flat_rec(ndim, shape, depth + 1, pre, ra, rb, lo, hi, n);
	}
	if (ra) {
		pre[depth] = r0;
		n = flat_rec(ndim, shape, depth + 1, pre, ra, inner, lo, hi, n);
		r0++;
	}
	if (r0 < r1)
		n = flat_rec(ndim, shape, depth, pre, r0 * inner, r1 * inner, lo, hi, n);
	if (rb) {
		pre[depth] = r1;
		n = flat_rec(ndim, shape, depth + 1, pre, 0, rb, lo, hi, n);
	}
	return n;
}

int dte_layout_flat_boxes(uint32_t ndim, const int64_t *shape, int64_t a, int64_t b,
			  int64_t lo[][DTE_MAX_DIMS], int64_t hi[][DTE_MAX_DIMS])
{
	int64_t numel = 1;
	uint32_t d;

	if (ndim == 0 || ndim > DTE_MAX_DIMS)
		return -1;
	for (d = 0; d < ndim; d++) {
		if (shape[d] <= 0)
			return -1;
		numel *= shape[d];
	}
	if (a < 0 || b < a || b > numel)
		return -1;
	return flat_rec(ndim, shape, 0, NULL, a, b, lo, hi, 0);
}

/* Lowest and highest buffer index a piece touches. */
static void piece_extent(const struct dte_piece *p, int64_t *min, int64_t *max)
{
	__int128 lo = p->offset, hi = p->offset;
	uint32_t d;

	for (d = 0; d < p->ndim; d++) {
		__int128 span = (__int128)(p->hi[d] - p->lo[d] - 1) * p->stride[d];
		if (span < 0)
			lo += span;
		else
			hi += span;
	}
	*min = lo < INT64_MIN ? INT64_MIN : (int64_t)lo;
	*max = hi > INT64_MAX ? INT64_MAX : (int64_t)hi;
}

struct extent {
	uint32_t rank, buf;
	int64_t  min, max;
	size_t   piece;
};

static int extent_cmp(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->buf != y->buf)
		return x->buf < y->buf ? -1 : 1;
	if (x->min != y->min)
		return x->min < y->min ? -1 : 1;
	return x->piece < y->piece ? -1 : x->piece > y->piece;
}

static const char *piece_str(char *buf, size_t len, const struct dte_layout *l,
			     const struct dte_spec *spec, size_t i)
{
	struct dte_piece tmp;
	const struct dte_piece *p = dte_layout_piece(l, i, &tmp);
	char box[160];
	const char *name = p->tensor < spec->n ? spec->t[p->tensor].name : "?";

	snprintf(buf, len, "%s %s", name, dte_layout_box_str(box, sizeof(box), p->ndim, p->lo, p->hi));
	return buf;
}

/* Marks every element of a piece in a bitmap over [base, base+nbits);
 * returns 1 when an element was already marked. */
static int piece_mark(const struct dte_piece *p, int units, uint8_t *bits, int64_t base,
		      int64_t nbits)
{
	int64_t idx[DTE_MAX_DIMS] = { 0 };
	int64_t pos;
	uint32_t d;

	for (;;) {
		pos = p->offset;
		for (d = 0; d < p->ndim; d++)
			pos += idx[d] * p->stride[d];
		/* Halves (units 2): each FP32 element once, at its low half. */
		pos = pos / units - base;
		if ((units == 1 || idx[p->ndim - 1] == 0) && pos >= 0 && pos < nbits) {
			if (bits[pos >> 3] & (1u << (pos & 7)))
				return 1;
			bits[pos >> 3] |= (uint8_t)(1u << (pos & 7));
		}
		for (d = p->ndim; d > 0; d--) {
			if (++idx[d - 1] < p->hi[d - 1] - p->lo[d - 1])
				break;
			idx[d - 1] = 0;
		}
		if (d == 0)
			return 0;
	}
}

/* Pieces ext[a..b) share a buffer and their extents chain-overlap. */
static int layout_check_cluster(const struct dte_layout *l, const struct dte_spec *spec,
				const struct extent *ext, size_t a, size_t b,
				char *err, size_t errlen)
{
	int64_t min = ext[a].min, max = ext[a].max, vol = 0, nbits;
	char s1[256], s2[256];
	uint8_t *bits;
	size_t i, j;
	int all_dense = 1;

	for (i = a; i < b; i++) {
		struct dte_piece tmp;
		const struct dte_piece *p = dte_layout_piece(l, ext[i].piece, &tmp);
		int64_t v = dte_piece_volume(p) / dte_piece_units(l, spec, p);
		if (ext[i].max - ext[i].min + 1 != v)
			all_dense = 0;
		if (ext[i].max > max)
			max = ext[i].max;
		vol += v;
	}
	if (all_dense) {
		/* Dense extents that overlap share elements: name the pair. */
		for (i = a + 1; i < b; i++)
			for (j = a; j < i; j++)
				if (ext[j].max >= ext[i].min)
					goto overlap;
		return 0;
overlap:
		return dte_layout_err(err, errlen, "overlapping pieces in rank %u buffer %u: %s and %s map to the same elements",
				      ext[i].rank, ext[i].buf,
				      piece_str(s1, sizeof(s1), l, spec, ext[j].piece),
				      piece_str(s2, sizeof(s2), l, spec, ext[i].piece));
	}
	nbits = max - min + 1;
	if (nbits > LAYOUT_BITMAP_MAX || vol > LAYOUT_BITMAP_MAX)
		return dte_layout_err(err, errlen, "rank %u buffer %u: strided pieces interleave over %lld elements, too many to prove disjoint",
				      ext[a].rank, ext[a].buf, (long long)nbits);
	bits = calloc((size_t)(nbits + 7) / 8, 1);
	if (!bits)
		return dte_layout_err(err, errlen, "out of memory");
	for (i = a; i < b; i++) {
		struct dte_piece tmp;
		const struct dte_piece *p = dte_layout_piece(l, ext[i].piece, &tmp);
		if (piece_mark(p, dte_piece_units(l, spec, p), bits, min, nbits)) {
			free(bits);
			return dte_layout_err(err, errlen, "overlapping pieces in rank %u buffer %u: %s maps onto elements another piece already maps",
					      ext[i].rank, ext[i].buf,
					      piece_str(s1, sizeof(s1), l, spec, ext[i].piece));
		}
	}
	free(bits);
	return 0;
}

/* dte_layout_buffer_find, first trying where the last one ended: pieces
 * mostly come in the order of their buffers. */
static const struct dte_layout_buffer *buf_find_near(const struct dte_layout *l, uint32_t rank,
						     uint32_t id, size_t *hint,
						     struct dte_layout_buffer *tmp)
{
	const struct dte_layout_buffer *b;
	size_t i = *hint;

	if (i >= l->nbufs || (b = dte_layout_buffer(l, i, tmp))->rank != rank || b->id != id) {
		if ((i = layout_buffer_index(l, rank, id)) == SIZE_MAX)
			return NULL;
		b = dte_layout_buffer(l, i, tmp);
	}
	*hint = i + 1;
	return b;
}

static int layout_check_piece(const struct dte_layout *l, const struct dte_spec *spec,
			      size_t i, size_t *hint, struct extent *x, char *err, size_t errlen)
{
	struct dte_piece tmp;
	const struct dte_piece *p = dte_layout_piece(l, i, &tmp);
	const struct dte_spec_tensor *t;
	struct dte_layout_buffer btmp;
	const struct dte_layout_buffer *b;
	uint32_t bufs[3], nb = l->role == DTE_LAYOUT_SOURCE ? 3 : 1, k, d;
	int64_t min, max;
	char s[256];

	if (p->tensor >= spec->n)
		return dte_layout_err(err, errlen, "piece %zu: tensor id %u not in the model spec", i, p->tensor);
	t = &spec->t[p->tensor];
	if (p->ndim != t->ndim)
		return dte_layout_err(err, errlen, "piece %zu (%s): %u dims, tensor has %u", i, t->name, p->ndim, t->ndim);
	for (d = 0; d < p->ndim; d++)
		if (p->lo[d] < 0 || p->hi[d] <= p->lo[d] || p->hi[d] > t->shape[d])
			return dte_layout_err(err, errlen, "piece %zu: box %s outside tensor %s", i,
					      dte_layout_box_str(s, sizeof(s), p->ndim, p->lo, p->hi), t->name);
	piece_extent(p, &min, &max);
	if (dte_piece_units(l, spec, p) == 2) {
		/* A source's FP32 tensor: 16-bit units of an FP32 buffer. */
		if (p->offset % 2 || p->ndim < 1 || p->stride[p->ndim - 1] != 1 ||
		    p->hi[p->ndim - 1] - p->lo[p->ndim - 1] != 2)
			return dte_layout_err(err, errlen, "piece %zu (%s): an FP32 tensor's piece must hold "
					      "both halves of its elements", i, piece_str(s, sizeof(s), l, spec, i));
		min = min < 0 ? -1 : min / 2;
		max /= 2;
	}
	x->rank = p->rank;
	x->buf = p->buf;
	x->piece = i;
	x->min = min;
	x->max = max;
	bufs[0] = p->buf;
	bufs[1] = p->buf_m;
	bufs[2] = p->buf_v;
	for (k = 0; k < nb; k++) {
		b = buf_find_near(l, p->rank, bufs[k], hint, &btmp);
		if (!b)
			return dte_layout_err(err, errlen, "piece %zu (%s): rank %u has no buffer %u",
					      i, piece_str(s, sizeof(s), l, spec, i), p->rank, bufs[k]);
		if (min < 0 || max >= b->length)
			return dte_layout_err(err, errlen, "piece %zu (%s) maps to [%lld, %lld] outside rank %u buffer %u (%s, %lld elements)",
					      i, piece_str(s, sizeof(s), l, spec, i), (long long)min, (long long)max,
					      p->rank, b->id, b->name, (long long)b->length);
	}
	return 0;
}

int dte_layout_validate(const struct dte_layout *l, const struct dte_spec *spec,
			char *err, size_t errlen)
{
	struct extent *ext;
	size_t i, a, hint = 0;
	int rc = 0;

	if (l->spec_hash != spec->hash)
		return dte_layout_err(err, errlen, "%s layout %s: model spec hash %016llx does not match the model's %016llx",
				      l->role == DTE_LAYOUT_SOURCE ? "source" : "sink", l->desc,
				      (unsigned long long)l->spec_hash, (unsigned long long)spec->hash);
	/* A rule gives its buffers in (rank, id) order. */
	for (i = 1; !l->rule && i < l->nbufs; i++)
		if (buf_cmp(&l->bufs[i - 1], &l->bufs[i]) >= 0)
			return dte_layout_err(err, errlen, "layout %s: buffer rank %u id %u listed twice or out of order",
					      l->desc, l->bufs[i].rank, l->bufs[i].id);
	ext = malloc((l->npieces + 1) * sizeof(*ext));
	if (!ext)
		return dte_layout_err(err, errlen, "out of memory");
	dte_layout_prefault(ext, l->npieces * sizeof(*ext));
	for (i = 0; i < l->npieces; i++)
		if (layout_check_piece(l, spec, i, &hint, &ext[i], err, errlen)) {
			free(ext);
			return -1;
		}
	for (i = 1; i < l->npieces && extent_cmp(&ext[i - 1], &ext[i]) < 0; i++)
		;
	if (i < l->npieces)
		qsort(ext, l->npieces, sizeof(*ext), extent_cmp);
	for (a = 0; a < l->npieces && !rc; a = i) {
		int64_t max = ext[a].max;
		for (i = a + 1; i < l->npieces && ext[i].rank == ext[a].rank &&
			     ext[i].buf == ext[a].buf && ext[i].min <= max; i++)
			if (ext[i].max > max)
				max = ext[i].max;
		if (i - a > 1)
			rc = layout_check_cluster(l, spec, ext, a, i, err, errlen);
	}
	free(ext);
	return rc;
}

static int halves_piece(struct dte_piece *p)
{
	uint32_t d;

	if (p->ndim + 1 > DTE_MAX_DIMS || __builtin_mul_overflow(p->offset, 2, &p->offset))
		return -1;
	for (d = 0; d < p->ndim; d++)
		if (__builtin_mul_overflow(p->stride[d], 2, &p->stride[d]))
			return -1;
	p->lo[p->ndim] = 0;
	p->hi[p->ndim] = 2;
	p->stride[p->ndim] = 1;
	p->ndim++;
	return 0;
}

int dte_layout_halves(struct dte_layout *l, const struct dte_spec *spec, char *err, size_t errlen)
{
	int sink = l->role == DTE_LAYOUT_SINK;
	uint8_t *mark = NULL;     /* sink, per buffer: 1 an FP32 tensor's, 2 a 16-bit one's */
	size_t i, k;
	int rc = 0;

	if (!spec->halves)
		return 0;
	if (l->rule)
		return dte_layout_err(err, errlen, "layout %s: kept as a rule, cannot carry FP32 tensors", l->desc);
	if (sink && !(mark = calloc(l->nbufs ? l->nbufs : 1, 1)))
		return dte_layout_err(err, errlen, "out of memory");
	for (i = 0; i < l->npieces && !rc; i++) {
		struct dte_piece *p = &l->pieces[i];
		int h = p->tensor < spec->n && dte_spec_is_halves(spec, p->tensor);
		if (sink && (k = layout_buffer_index(l, p->rank, p->buf)) != SIZE_MAX)
			mark[k] |= h ? 1 : 2;
		if (h && halves_piece(p))
			rc = dte_layout_err(err, errlen, "layout %s: piece of %s cannot carry halves",
					    l->desc, spec->t[p->tensor].name);
	}
	for (k = 0; sink && k < l->nbufs && !rc; k++) {
		struct dte_layout_buffer *b = &l->bufs[k];
		if (!(mark[k] & 1))
			continue;
		if (mark[k] != 1)
			rc = dte_layout_err(err, errlen, "sink rank %u buffer %u (%s) holds an FP32 tensor and "
					    "16-bit ones; FP32 tensors need buffers of their own",
					    b->rank, b->id, b->name);
		else if (dte_layout_fp8_find(l, b->rank, b->id))
			rc = dte_layout_err(err, errlen, "sink rank %u buffer %u (%s): an FP32 tensor in an "
					    "FP8 buffer", b->rank, b->id, b->name);
		else if (__builtin_mul_overflow(b->length, 2, &b->length))
			rc = dte_layout_err(err, errlen, "sink rank %u buffer %u (%s) too long", b->rank,
					    b->id, b->name);
	}
	for (i = 0; sink && i < l->ntensors && !rc; i++) {
		struct dte_layout_tensor *t = &l->tensors[i];
		if ((k = layout_buffer_index(l, t->rank, t->buf)) != SIZE_MAX && mark[k] == 1)
			t->offset *= 2;
	}
	free(mark);
	return rc;
}

int dte_layout_add_fp8(struct dte_layout *l, const struct dte_layout_fp8 *f)
{
	if (layout_grow((void **)&l->fp8, &l->cap_fp8, l->nfp8, sizeof(*l->fp8)))
		return -1;
	l->fp8[l->nfp8++] = *f;
	return 0;
}

const struct dte_layout_fp8 *dte_layout_fp8_find(const struct dte_layout *l, uint32_t rank,
						 uint32_t buf)
{
	for (size_t i = 0; i < l->nfp8; i++)
		if (l->fp8[i].rank == rank && l->fp8[i].buf == buf)
			return &l->fp8[i];
	return NULL;
}

int64_t dte_layout_units(const struct dte_layout *l, uint32_t rank, uint32_t id, int64_t length)
{
	for (size_t i = 0; i < l->nfp8; i++) {
		if (l->fp8[i].rank != rank)
			continue;
		if (l->fp8[i].buf == id)
			return length % 2 ? -1 : length / 2;
		if (l->fp8[i].scale_buf == id)
			return 2 * length;
	}
	return length;
}

/* One dim of a piece on both grids: canonical [lo, hi) of a dim of size
 * n, at row/column `at` of the rank's matrix. */
static int fp8_dim_ok(int64_t lo, int64_t hi, int64_t n, int64_t at)
{
	const int64_t B = DTE_FP8_BLOCK;

	return lo % B == 0 && at % B == 0 && ((hi - lo) % B == 0 || hi == n);
}

int dte_layout_fp8_check(const struct dte_layout *l, const struct dte_spec *spec, char *err,
			 size_t errlen)
{
	for (size_t i = 0; i < l->npieces; i++) {
		struct dte_piece tmp;
		const struct dte_piece *p = dte_layout_piece(l, i, &tmp);
		const struct dte_layout_fp8 *f = dte_layout_fp8_find(l, p->rank, p->buf);
		const struct dte_spec_tensor *t;
		int64_t mat, in, row, col;

		if (!f)
			continue;
		t = &spec->t[p->tensor];
		mat = p->offset / (f->rows * f->cols);
		in = p->offset % (f->rows * f->cols);
		row = in / f->cols;
		col = in % f->cols;
		if (t->ndim != 2 || p->stride[0] != f->cols || p->stride[1] != 1 ||
		    !fp8_dim_ok(p->lo[0], p->hi[0], t->shape[0], row) ||
		    !fp8_dim_ok(p->lo[1], p->hi[1], t->shape[1], col)) {
			const struct dte_layout_buffer *b = dte_layout_buffer_find(l, p->rank, p->buf);

			return dte_layout_err(err, errlen,
				"fp8: %s rank %u: %s rows [%lld, %lld) cols [%lld, %lld) at row %lld col %lld%s of the rank's matrix are not on the %d x %d block grid, so a block of the engine's scales would not be one block of one tensor (SGLang refuses such splits, validate_block_quant_shapes; docs/INTEGRATION.md)",
				b ? b->name : "?", p->rank, t->name, (long long)p->lo[0],
				(long long)p->hi[0], (long long)p->lo[1], (long long)p->hi[1],
				(long long)row, (long long)col, mat ? " (an expert's matrix)" : "",
				DTE_FP8_BLOCK, DTE_FP8_BLOCK);
		}
	}
	return 0;
}

static int64_t fp8_blocks(int64_t n)
{
	return (n + DTE_FP8_BLOCK - 1) / DTE_FP8_BLOCK;
}

int dte_layout_fp8_use(const struct dte_layout *src, const struct dte_layout *sink,
		       const struct dte_spec *spec, struct dte_layout_fp8_use *out)
{
	uint64_t *first = calloc(spec->n + 1, sizeof(*first)), nbits = 0, *bits = NULL;
	struct dte_layout_fp8_use u = { 0 };
	int rc = -1;

	if (!first)
		return -1;
	for (size_t i = 0; i < sink->nfp8; i++) {
		u.weights++;
		u.codes += (uint64_t)(sink->fp8[i].mats * sink->fp8[i].rows * sink->fp8[i].cols);
		u.scales += (uint64_t)(sink->fp8[i].mats * fp8_blocks(sink->fp8[i].rows) *
				       fp8_blocks(sink->fp8[i].cols));
	}
	/* first[t]: 1 + the tensor's first block bit, 0 when not held FP8 */
	for (size_t i = 0; i < sink->npieces; i++) {
		struct dte_piece tmp;
		const struct dte_piece *p = dte_layout_piece(sink, i, &tmp);
		const struct dte_spec_tensor *t = &spec->t[p->tensor];

		if (first[p->tensor] || t->ndim != 2 || !dte_layout_fp8_find(sink, p->rank, p->buf))
			continue;
		first[p->tensor] = 1 + nbits;
		nbits += (uint64_t)(fp8_blocks(t->shape[0]) * fp8_blocks(t->shape[1]));
		u.tensors++;
	}
	u.blocks = nbits;
	bits = calloc(nbits / 64 + 1, sizeof(*bits));
	if (!bits)
		goto out;
	for (size_t i = 0; i < src->npieces; i++) {
		struct dte_piece tmp;
		const struct dte_piece *p = dte_layout_piece(src, i, &tmp);
		const struct dte_spec_tensor *t = &spec->t[p->tensor];
		int64_t r0, r1, c0, c1, bc;

		if (!first[p->tensor])
			continue;
		/* blocks [r0, r1) x [c0, c1) lie whole inside the piece */
		r0 = fp8_blocks(p->lo[0]);
		c0 = fp8_blocks(p->lo[1]);
		r1 = p->hi[0] == t->shape[0] ? fp8_blocks(t->shape[0]) : p->hi[0] / DTE_FP8_BLOCK;
		c1 = p->hi[1] == t->shape[1] ? fp8_blocks(t->shape[1]) : p->hi[1] / DTE_FP8_BLOCK;
		bc = fp8_blocks(t->shape[1]);
		for (int64_t r = r0; r < r1; r++)
			for (int64_t c = c0; c < c1; c++) {
				uint64_t b = first[p->tensor] - 1 + (uint64_t)(r * bc + c);

				bits[b / 64] |= UINT64_C(1) << (b % 64);
			}
	}
	u.split = nbits;
	for (uint64_t b = 0; b < nbits; b++)
		u.split -= (bits[b / 64] >> (b % 64)) & 1u;
	*out = u;
	rc = 0;
out:
	free(first);
	free(bits);
	return rc;
}
