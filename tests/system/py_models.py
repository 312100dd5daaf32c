#!/usr/bin/python3
"""Layouts against the HF reference: Megatron TP forward and converters,
SGLang converters (incl. KV-head replication), the stand-in's BF16 logits,
and the stand-in served from its own process."""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

from dte import megatron, qwen3, sglang  # noqa: E402
from dte.checks import Checks  # noqa: E402

# A second, smaller shape: tied embeddings, 2 KV heads (so tp=4 replicates KV
# heads in SGLang), a vocab that needs padding in both layouts.
SMALL = qwen3.make_config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          vocab_size=200, tie_word_embeddings=True, rms_norm_eps=1e-5,
                          rope_theta=10000.0)
DEFAULT = qwen3.make_config()


def bit_equal(a, b):
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and
        torch.equal(a[n].view(torch.int16) if a[n].dtype == torch.bfloat16 else a[n],
                    b[n].view(torch.int16) if b[n].dtype == torch.bfloat16 else b[n])
        for n in a)


def tokens_for(cfg, seed=0, B=2, T=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"], (B, T), generator=g)


def check_megatron(c, cfg, tps, tag):
    hf = qwen3.init_hf_weights(cfg, seed=11, norm_jitter=0.1)
    tok = tokens_for(cfg)
    # The very last token id exercises the last real row of the last vocab shard.
    tok[0, 0] = cfg["vocab_size"] - 1
    ref = qwen3.forward(hf, cfg, tok)
    for tp in tps:
        shards = megatron.hf_to_megatron(hf, cfg, tp)
        shapes = megatron.shard_shapes(cfg, tp)
        c.check(all(tuple(s[n].shape) == shapes[n] for s in shards for n in shapes),
                "%s tp=%d: shard shapes" % (tag, tp))
        c.check(bit_equal(megatron.megatron_to_hf(shards, cfg, tp), hf),
                "%s tp=%d: megatron_to_hf(hf_to_megatron(W)) == W bit for bit" % (tag, tp))
        back = megatron.hf_to_megatron(megatron.megatron_to_hf(shards, cfg, tp), cfg, tp)
        c.check(all(bit_equal(a, b) for a, b in zip(back, shards)),
                "%s tp=%d: hf_to_megatron(megatron_to_hf(S)) == S bit for bit" % (tag, tp))
        Vp = megatron.padded_vocab(cfg["vocab_size"], tp)
        c.check(Vp % (128 * tp) == 0 and Vp >= cfg["vocab_size"], "%s tp=%d: vocab padding" % (tag, tp))
        pad = torch.cat([s["embedding.word_embeddings.weight"] for s in shards])[cfg["vocab_size"]:]
        c.check(pad.shape[0] == Vp - cfg["vocab_size"] and not pad.any(),
                "%s tp=%d: %d padded rows, all zero" % (tag, tp, Vp - cfg["vocab_size"]))

        model = megatron.MegatronModel(cfg, tp, hf=hf, label="t-%s-%d" % (tag, tp))
        with torch.no_grad():
            out = model(tok)
        err = (out - ref).abs().max().item()
        c.check(out.shape == ref.shape and torch.allclose(out, ref, rtol=1e-5, atol=1e-5),
                "%s tp=%d: Megatron forward == HF forward (max err %.2e)" % (tag, tp, err))
        c.check(all(model.arenas[r]["param"].contains(p)
                    for r, ps in enumerate(model.params) for p in ps.values()),
                "%s tp=%d: every param lives in its rank's arena" % (tag, tp))
        c.check(bit_equal(model.to_hf(), hf), "%s tp=%d: model.to_hf() == W" % (tag, tp))
        model.close()


def check_megatron_layout_details(c):
    """The qkv interleave, by hand, for one rank: group g = [q heads; k; v]."""
    cfg, tp = DEFAULT, 2
    hf = qwen3.init_hf_weights(cfg, seed=3)
    s = megatron.hf_to_megatron(hf, cfg, tp)[1]
    hd, qpg = cfg["head_dim"], 2
    qkv = s["decoder.layers.2.self_attention.linear_qkv.weight"]
    # rank 1 holds groups 2 and 3; local group 1 is global group 3
    g0 = (qpg + 2) * hd
    c.check(torch.equal(qkv[g0:g0 + qpg * hd],
                        hf["model.layers.2.self_attn.q_proj.weight"][3 * qpg * hd:4 * qpg * hd]),
            "megatron qkv: rank 1 group 1 q rows are q heads 6,7")
    c.check(torch.equal(qkv[g0 + qpg * hd:g0 + (qpg + 1) * hd],
                        hf["model.layers.2.self_attn.k_proj.weight"][3 * hd:4 * hd]),
            "megatron qkv: then k head 3")
    c.check(torch.equal(qkv[g0 + (qpg + 1) * hd:],
                        hf["model.layers.2.self_attn.v_proj.weight"][3 * hd:4 * hd]),
            "megatron qkv: then v head 3")
    fc1 = s["decoder.layers.0.mlp.linear_fc1.weight"]
    half = cfg["intermediate_size"] // 2
    c.check(torch.equal(fc1[:half], hf["model.layers.0.mlp.gate_proj.weight"][half:]) and
            torch.equal(fc1[half:], hf["model.layers.0.mlp.up_proj.weight"][half:]),
            "megatron fc1: rank 1 = [gate second half; up second half]")
    c.raises(ValueError, lambda: megatron.shard_shapes(cfg, 3), "megatron: tp=3 refused")
    c.raises(ValueError, lambda: megatron.shard_shapes(cfg, 8), "megatron: tp > kv heads refused")
    bad = dict(hf)
    bad["model.norm.weight"] = torch.ones(5)
    c.raises(ValueError, lambda: megatron.hf_to_megatron(bad, cfg, 2), "megatron: wrong shape refused")
    shards = megatron.hf_to_megatron(hf, cfg, 2)
    c.raises(ValueError, lambda: megatron.megatron_to_hf(shards[:1], cfg, 2),
             "megatron: missing rank refused")


def check_sglang(c, cfg, tps, tag, standin_tp=None):
    hf = qwen3.init_hf_weights(cfg, seed=5, norm_jitter=0.1)
    hb = qwen3.round_bf16(hf)
    tok = tokens_for(cfg, seed=1)
    tok[1, 3] = cfg["vocab_size"] - 1
    ref = qwen3.forward(hb, cfg, tok)
    results = {}
    for tp in tps:
        ranks = sglang.hf_to_sglang(hb, cfg, tp)
        shapes = sglang.shard_shapes(cfg, tp)
        c.check(all(tuple(s[n].shape) == shapes[n] for s in ranks for n in shapes),
                "%s tp=%d: sglang shard shapes" % (tag, tp))
        c.check(bit_equal(sglang.sglang_to_hf(ranks, cfg, tp), hb),
                "%s tp=%d: sglang_to_hf(hf_to_sglang(W)) == W bit for bit" % (tag, tp))
        back = sglang.hf_to_sglang(sglang.sglang_to_hf(ranks, cfg, tp), cfg, tp)
        c.check(all(bit_equal(a, b) for a, b in zip(back, ranks)),
                "%s tp=%d: hf_to_sglang(sglang_to_hf(S)) == S bit for bit" % (tag, tp))
        m = sglang.SGLangModel(cfg, tp, label="t-%s-%d" % (tag, tp))
        m.load_hf(hf)  # FP32 in: the model rounds to BF16 itself (RNE)
        c.check(bit_equal(m.to_hf(), hb), "%s tp=%d: load_hf stores RNE_bf16(W)" % (tag, tp))
        out1, out2 = m.logits(tok), m.logits(tok)
        err = (out1 - ref).abs().max().item()
        c.check(torch.allclose(out1, ref, rtol=1e-5, atol=1e-5),
                "%s tp=%d: stand-in logits == HF forward on BF16 W (max err %.2e)" % (tag, tp, err))
        c.check(torch.equal(out1, out2), "%s tp=%d: two runs bit-identical" % (tag, tp))
        results[tp] = out1
        m.close()
    if standin_tp is not None:
        with sglang.Standin(cfg, standin_tp, label="t-standin") as st:
            c.check(st.call("ping") == st.proc.pid, "stand-in process answers ping")
            locs = st.call("locs")
            c.check(len(locs) == standin_tp and all(l[1] >= 0 for rank in locs for l in rank),
                    "stand-in reports per-rank tensor locations")
            st.load_hf(hf)
            remote = st.logits(tok)
            c.check(torch.equal(remote, results[standin_tp]),
                    "stand-in process logits bit-identical to in-process model")
            c.check(torch.equal(remote, sglang.reference_logits(hf, cfg, standin_tp, tok)),
                    "reference_logits() reproduces the stand-in bit for bit")
            c.check(bit_equal(st.to_hf(), hb), "stand-in weights read back == RNE_bf16(W)")
            # A different weight set really changes the answer (the check can fail).
            st.load_hf(qwen3.init_hf_weights(cfg, seed=6))
            c.check(not torch.equal(st.logits(tok), remote), "new weights, new logits")
            bad = tok.clone()
            bad[0, 0] = cfg["vocab_size"]
            c.raises(sglang.StandinError, lambda: st.logits(bad),
                     "stand-in refuses an out-of-range token and keeps serving")
            c.raises(sglang.StandinError, lambda: st.call("no-such-command"),
                     "stand-in refuses an unknown command")
            c.check(st.call("ping") == st.proc.pid, "stand-in still alive after errors")
        c.check(st.proc is None, "stand-in stopped")


def check_sglang_layout_details(c):
    cfg, tp = SMALL, 4  # 2 KV heads over 4 ranks: ranks 0,1 hold head 0; 2,3 head 1
    hf = qwen3.init_hf_weights(cfg, seed=8)
    ranks = sglang.hf_to_sglang(hf, cfg, tp)
    hd = cfg["head_dim"]
    k = hf["model.layers.1.self_attn.k_proj.weight"]
    for r in range(tp):
        qkv = ranks[r]["model.layers.1.self_attn.qkv_proj.weight"]
        c.check(torch.equal(qkv[hd:2 * hd], k[(r // 2) * hd:(r // 2 + 1) * hd]),
                "sglang tp=4: rank %d holds KV head %d" % (r, r // 2))
    Vp = sglang.padded_vocab(cfg["vocab_size"])
    c.check(Vp == 256 and tuple(ranks[0]["model.embed_tokens.weight"].shape) == (64, 64),
            "sglang: vocab 200 padded to 256 (multiple of 64), 64 rows per rank")
    c.check("lm_head.weight" not in ranks[0], "sglang tied: no lm_head tensor")
    c.raises(ValueError, lambda: sglang.shard_shapes(cfg, 3), "sglang: tp=3 refused")
    c.raises(ValueError, lambda: qwen3.forward(hf, cfg, torch.tensor([[0, 200]])),
             "reference forward refuses out-of-range token")
    c.raises(ValueError, lambda: qwen3.make_config(num_key_value_heads=3), "bad config refused")


def main():
    torch.manual_seed(0)
    c = Checks("py-models")
    check_megatron(c, DEFAULT, (1, 2, 4), "default")
    check_megatron(c, SMALL, (1, 2), "small-tied")
    check_megatron_layout_details(c)
    check_sglang(c, DEFAULT, (1, 2, 4), "default", standin_tp=2)
    check_sglang(c, SMALL, (1, 2, 4), "small-tied")
    check_sglang_layout_details(c)
    c.finish()


if __name__ == "__main__":
    main()
