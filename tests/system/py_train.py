#!/usr/bin/python3
"""Megatron-layout trainer: the toy loss falls under real AdamW, params and
moments stay in the shm arenas (foreach False and True), replicated norms stay
identical across TP ranks, and the recorded (lr, betas, eps, wd, step) really
are the ones the step used: inverting AdamW with them recovers the previous
weights."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

from dte import megatron, qwen3, shm, toy  # noqa: E402
from dte.checks import Checks  # noqa: E402

STEPS = 20
LR, WARMUP = 1e-3, 3


def invert_adamw(theta, m, v, h):
    """torch AdamW inverse (DESIGN.md §1), FP32, forward order of operations."""
    bc1 = 1 - h.beta1 ** h.step
    bc2 = 1 - h.beta2 ** h.step
    denom = v.sqrt() / (bc2 ** 0.5) + h.eps
    return (theta + (h.lr / bc1) * m / denom) / (1 - h.lr * h.weight_decay)


def bf16_bits(t):
    return t.to(torch.bfloat16).view(torch.int16)


def run(c, foreach):
    tag = "foreach=%s" % foreach
    cfg = qwen3.make_config()
    model = megatron.MegatronModel(cfg, tp=2, seed=0, label="train-%d" % foreach)
    trainer = megatron.Trainer(model, lr=LR, foreach=foreach, warmup=WARMUP)
    task = toy.ToyTask(cfg["vocab_size"])
    c.check(trainer.state_in_shm(), "%s: state in shm before training" % tag)
    changed = []
    inv_ok = True
    worst = 0.0
    for s in range(STEPS):
        before = [{n: p.detach().clone() for n, p in ps.items()} for ps in model.params]
        rec = trainer.step(*task.batch_at(s))
        hyper = {g.name: g for g in rec["groups"]}
        n_changed = n_total = 0
        worst_flip = 0.0
        for r, ps in enumerate(model.params):
            for n, p in ps.items():
                st = trainer.opt.state[p]
                h = hyper[trainer.group_of(r, n)]
                prev = invert_adamw(p.detach(), st["exp_avg"], st["exp_avg_sq"], h)
                # BF16 of the reconstruction must match BF16 of the true previous
                # weight except within rounding distance (DESIGN.md §2.1).
                flips = (bf16_bits(prev) != bf16_bits(before[r][n])).float().mean().item()
                worst_flip = max(worst_flip, flips)
                n_changed += int((bf16_bits(p.detach()) != bf16_bits(before[r][n])).sum())
                n_total += p.numel()
        inv_ok &= worst_flip < 1e-3
        worst = max(worst, worst_flip)
        changed.append(n_changed / n_total)
        if s == 0 and not c.check(worst_flip < 1e-3, "%s: inversion with recorded hypers "
                                  "(bf16 mismatch %.2e)" % (tag, worst_flip)):
            break
    c.check(inv_ok, "%s: AdamW inversion with the recorded hypers holds every step" % tag)
    hist = trainer.history
    first, last = hist[0]["loss"], hist[-1]["loss"]
    print("%s: loss %s" % (tag, " ".join("%.2f" % h["loss"] for h in hist)))
    c.check(last < 0.7 * first, "%s: loss falls %.3f -> %.3f (< 0.7x)" % (tag, first, last))
    c.check([h["step"] for h in hist] == list(range(1, STEPS + 1)), "%s: step counts 1..N" % tag)
    want_lr = [LR * min(1.0, (s + 1) / WARMUP) for s in range(STEPS)]
    got_lr = [{g.name: g.lr for g in h["groups"]} for h in hist]
    c.check(all(abs(g["decay"] - w) < 1e-15 and abs(g["no_decay"] - w) < 1e-15
                for g, w in zip(got_lr, want_lr)), "%s: recorded lr follows warmup" % tag)
    g0 = {g.name: g for g in hist[0]["groups"]}
    c.check(g0["decay"].weight_decay == 0.01 and g0["no_decay"].weight_decay == 0.0 and
            g0["decay"].beta1 == 0.9 and g0["decay"].beta2 == 0.95 and g0["decay"].eps == 1e-8,
            "%s: group hyper-parameters recorded" % tag)
    c.check(trainer.state_in_shm(), "%s: params and moments still in shm after %d steps"
            % (tag, STEPS))
    # The arena, read through its fd, holds what the optimizer wrote.
    name = "decoder.layers.1.mlp.linear_fc2.weight"
    st = trainer.opt.state[model.params[1][name]]
    loc = model.arenas[1]["exp_avg_sq"].loc(name)
    raw = shm.map_readonly(loc.fd, loc.offset, loc.nbytes)
    c.check(raw == st["exp_avg_sq"].contiguous().view(torch.uint8).numpy().tobytes() and
            st["exp_avg_sq"].abs().sum() > 0, "%s: exp_avg_sq bytes via fd == optimizer's" % tag)
    c.check(model.replicas_identical(), "%s: replicated norms identical on both ranks" % tag)
    norm = model.params[0]["decoder.final_layernorm.weight"]
    c.check(not torch.equal(norm, torch.ones_like(norm)), "%s: norms did train" % tag)
    final = model.to_hf()
    del st, norm, p, ps  # our own references to arena tensors
    trainer.close()
    model.close()
    c.check(model.arenas == [], "%s: arenas released" % tag)
    return final, changed, worst


def main():
    c = Checks("py-train")
    torch.manual_seed(0)
    w_single, changed, worst1 = run(c, foreach=False)
    w_foreach, _, worst2 = run(c, foreach=True)
    diff = max((w_single[n] - w_foreach[n]).abs().max().item() for n in w_single)
    c.check(diff < 1e-5, "foreach and single-tensor AdamW agree (max diff %.2e)" % diff)
    tail = changed[WARMUP:] or changed or [0.0]  # short if a step failed early
    mean_changed = sum(tail) / len(tail)
    c.finish(steps=STEPS, lr=LR, bf16_changed_pct="%.1f" % (100 * mean_changed),
             inverse_bf16_mismatch="%.1e" % max(worst1, worst2))


if __name__ == "__main__":
    main()
