/* Per-step FP32 constants from a group's hyper-parameters, derived the way
 * each forward derives them: torch does its scalar math in Python doubles
 * and rounds to FP32 when the tensor op consumes the scalar; Apex/TE
 * FusedAdam hands FP32 bias corrections, lr and decay to its kernel. */
#include <math.h>
#include <stdio.h>
#include "gpu/compute.h"

static int bad(char *why, unsigned whylen, const char *msg)
{
	if (why && whylen)
		snprintf(why, whylen, "%s", msg);
	return DTC_EINVAL;
}

int dtc_hparams_derive(const struct dtc_hparams *hp, struct dtc_consts *k,
		       char *why, unsigned whylen)
{
	struct dtc_consts c = { 0 };
	double bc1, bc2;

	if (!hp || !k)
		return bad(why, whylen, "NULL argument");
	if (hp->variant != DTC_VARIANT_TORCH && hp->variant != DTC_VARIANT_FUSED)
		return bad(why, whylen, "unknown optimizer variant");
	if (hp->step < 1)
		return bad(why, whylen, "step must be >= 1 (the count after the step)");
	if (!(hp->lr >= 0 && isfinite(hp->lr)))
		return bad(why, whylen, "lr must be finite and >= 0");
	if (!(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
		return bad(why, whylen, "betas must be in [0, 1)");
	if (!(hp->eps >= 0 && isfinite(hp->eps)))
		return bad(why, whylen, "eps must be finite and >= 0");
	if (!(hp->weight_decay >= 0 && isfinite(hp->weight_decay)))
		return bad(why, whylen, "weight_decay must be finite and >= 0");
	/* The error bound assumes the decay multiplier is at least 1/2. */
	if (hp->lr * hp->weight_decay > 0.5)
		return bad(why, whylen, "lr * weight_decay > 0.5: not invertible within the bound");

	bc1 = 1.0 - pow(hp->beta1, (double)hp->step);
	bc2 = 1.0 - pow(hp->beta2, (double)hp->step);
	if (!(bc1 > 0) || !(bc2 > 0))
		return bad(why, whylen, "bias correction underflows to 0");

	c.variant = hp->variant;
	c.eps = (float)hp->eps;
	if (hp->variant == DTC_VARIANT_TORCH) {
		c.decay = (float)(1.0 - hp->lr * hp->weight_decay);
		c.neg_step = (float)(-(hp->lr / bc1));
		c.bc2_sqrt = (float)sqrt(bc2);
	} else {
		c.bc1 = (float)bc1;
		c.bc2 = (float)bc2;
		c.lr = (float)hp->lr;
		c.wd = (float)hp->weight_decay;
		c.decay = (float)(1.0 - (double)c.lr * (double)c.wd);
	}
	c.inv_decay = (float)(1.0 / (double)c.decay);
	/* dtc_adamw_still() (elem.h): when θ_t = +0 with u = −0 proves
	 * θ_{t-1} = +0, and when a zero step leaves θ exactly as it was */
	c.still_pos0 = hp->variant == DTC_VARIANT_TORCH ||
		       ((double)c.lr * ((double)c.wd + 1.0) < 0.5 && (double)c.wd <= 0x1p24);
	c.still_nodecay = hp->weight_decay == 0;
	{
		/* dtc_adamw_quiet(): see elem.h for where k1, k2 come from. */
		double inv_c = 1.0 / (double)c.decay;
		double k1 = inv_c * (1.0 + 0x1p-20), k2 = inv_c - 1.0 + 0x1p-21;
		double s = hp->variant == DTC_VARIANT_TORCH ? fabs((double)c.neg_step)
							    : (double)c.lr / (double)c.bc1;
		double q2 = 1.0 / (hp->variant == DTC_VARIANT_TORCH ? (double)c.bc2_sqrt * c.bc2_sqrt
								    : (double)c.bc2);

		c.q_s = (float)(s * k1 * (1.0 + 0x1p-10));
		c.q_q2 = (float)(q2 * (1.0 - 0x1p-10));
		c.q_eps = (double)c.eps >= 0x1p-60 ? (float)((double)c.eps * (1.0 - 0x1p-10)) : 0.0f;
		c.q_k2 = (float)(k2 * (1.0 + 0x1p-10));
	}
	*k = c;
	return DTC_OK;
}

const char *dtc_strerror(int status)
{
	switch (status) {
	case DTC_OK: return "ok";
	case DTC_EINVAL: return "invalid argument";
	case DTC_EBOX: return "entry maps outside its buffers or has a bad shape";
	case DTC_ERANGE: return "position outside the entry's box";
	case DTC_ETRUNC: return "payload truncated";
	case DTC_ECORRUPT: return "payload corrupt";
	case DTC_ENOSPC: return "output buffer too small";
	case DTC_ENOMEM: return "out of memory";
	case DTC_ECHECKSUM: return "chunk checksum mismatch";
	case DTC_EDEVICE: return "compute device error";
	}
	return "unknown error";
}
