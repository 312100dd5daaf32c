/* tests/unit/adamw_ref.h — ground truth for the element math that does not
 * come from gpu/elem.h.
 *
 *  - fx_load(): real optimizer steps recorded by tests/data/adamw/
 *    gen_fixtures.py (torch.optim.AdamW single-tensor, foreach and CPU
 *    fused in torch 2.13, single-tensor in torch 1.13, Transformer Engine's
 *    FusedAdam kernel order with and without FMA); the file format is
 *    described there.
 *  - ref_torch_adamw(): torch's θ update written here from torch's source
 *    (torch/optim/adam.py _single_tensor_adam: param.mul_(1 - lr*wd), then
 *    param.addcdiv_(exp_avg, exp_avg_sq.sqrt() / bc2**0.5 + eps,
 *    value=-lr/bc1); aten/src/ATen/native/cpu/PointwiseOpsKernel.cpp
 *    addcdiv evaluates self + value * t1 / t2 left to right in FP32, the
 *    Python scalars rounded to FP32 as the kernels take them).
 *    test_elem.c holds it bit-exact to the torch fixtures; test_job.c
 *    trains with it, so neither trusts dtc_adamw_forward().
 */
#ifndef DTE_TEST_ADAMW_REF_H
#define DTE_TEST_ADAMW_REF_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fx_step {
	int64_t step;                    /* optimizer count after this step */
	const float *grad, *theta, *m, *v;
	const float *sqrt_v;             /* the runtime's own sqrt (see the script) */
	const uint16_t *bf16;            /* torch's theta.to(torch.bfloat16) */
};

struct fx_case {
	char name[49];
	int32_t variant;                 /* 0 torch, 1 fused (TE) */
	double lr, beta1, beta2, eps, wd;
	uint32_t n, steps;
	int64_t step0;
	const float *theta0;
	const uint16_t *bf16_0;
	struct fx_step *s;
};

struct fx_file {
	uint8_t *raw;
	size_t len;
	uint32_t ncases;
	struct fx_case *c;
};

static inline void fx_free(struct fx_file *f)
{
	for (uint32_t i = 0; f->c && i < f->ncases; i++)
		free(f->c[i].s);
	free(f->c);
	free(f->raw);
	memset(f, 0, sizeof(*f));
}

/* Arrays point into the file image (little-endian host assumed, like the
 * rest of dted).  Returns 0, or -1 for a missing or malformed file. */
static inline int fx_load(struct fx_file *f, const char *path)
{
	FILE *fp = fopen(path, "rb");
	size_t off = 12;
	long sz;

	memset(f, 0, sizeof(*f));
	if (!fp)
		return -1;
	if (fseek(fp, 0, SEEK_END) || (sz = ftell(fp)) < 12 || fseek(fp, 0, SEEK_SET))
		goto bad;
	f->len = (size_t)sz;
	f->raw = malloc(f->len);
	if (!f->raw || fread(f->raw, 1, f->len, fp) != f->len || memcmp(f->raw, "DTEADW2", 8))
		goto bad;
	memcpy(&f->ncases, f->raw + 8, 4);
	if (f->ncases == 0 || f->ncases > 64 || !(f->c = calloc(f->ncases, sizeof(*f->c))))
		goto bad;
#define TAKE(dst, bytes)                                              \
	do {                                                          \
		if (f->len - off < (size_t)(bytes))                   \
			goto bad;                                     \
		dst = (const void *)(f->raw + off);                   \
		off += (size_t)(bytes);                               \
	} while (0)
	for (uint32_t i = 0; i < f->ncases; i++) {
		struct fx_case *c = &f->c[i];
		const uint8_t *h;

		TAKE(h, 48 + 4 + 5 * 8 + 4 + 4 + 8);
		memcpy(c->name, h, 48);
		memcpy(&c->variant, h + 48, 4);
		memcpy(&c->lr, h + 52, 8);
		memcpy(&c->beta1, h + 60, 8);
		memcpy(&c->beta2, h + 68, 8);
		memcpy(&c->eps, h + 76, 8);
		memcpy(&c->wd, h + 84, 8);
		memcpy(&c->n, h + 92, 4);
		memcpy(&c->steps, h + 96, 4);
		memcpy(&c->step0, h + 100, 8);
		if (!c->n || c->n > (1u << 20) || !c->steps || c->steps > 64 ||
		    !(c->s = calloc(c->steps, sizeof(*c->s))))
			goto bad;
		TAKE(c->theta0, 4 * (size_t)c->n);
		TAKE(c->bf16_0, 2 * (size_t)c->n);
		for (uint32_t k = 0; k < c->steps; k++) {
			const uint8_t *st;

			TAKE(st, 8);
			memcpy(&c->s[k].step, st, 8);
			TAKE(c->s[k].grad, 4 * (size_t)c->n);
			TAKE(c->s[k].theta, 4 * (size_t)c->n);
			TAKE(c->s[k].m, 4 * (size_t)c->n);
			TAKE(c->s[k].v, 4 * (size_t)c->n);
			TAKE(c->s[k].sqrt_v, 4 * (size_t)c->n);
			TAKE(c->s[k].bf16, 2 * (size_t)c->n);
		}
	}
#undef TAKE
	if (off != f->len)
		goto bad;
	fclose(fp);
	return 0;
bad:
	fclose(fp);
	fx_free(f);
	return -1;
}

/* The θ of one step (step = the count after it) from torch's source, see
 * the head of this file.  The scalars: torch does them in Python doubles
 * (bias_correction2**0.5 is a correctly rounded sqrt, as is glibc's pow
 * at 0.5) and the FP32 kernels round them on entry.  sqrt_v is sqrt(v) as
 * the trainer's torch computed it: IEEE sqrtf(v) for Debian's torch 1.13,
 * but the torch 2.13 CPU wheel (AVX512 kernels) is an ulp off IEEE in
 * about one element in five, so the fixtures record torch's own. */
static inline float ref_torch_adamw(float theta_prev, float m, float sqrt_v, double lr,
				    double beta1, double beta2, double eps, double wd, int64_t step)
{
	double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
	volatile float p = theta_prev, num, denom;

	if (wd != 0)
		p = p * (float)(1.0 - lr * wd);
	denom = sqrt_v / (float)sqrt(bc2);
	denom = denom + (float)eps;
	num = (float)(-(lr / bc1)) * m;
	return p + num / denom;
}

#endif
