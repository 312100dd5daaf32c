"""docs/BENCHMARKS.md and docs/bench-*.png from one run's results.

The plots' own numbers are kept beside them in docs/bench-plots.json, so
`python3 tests/bench/report.py --plots [docs/bench-plots.json]` draws them
again (a new look, no new measurements) without the run's full results.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

PLOT_DATA = "bench-plots.json"


def _plot(script, data, out, size=(800, 500)):
    with tempfile.TemporaryDirectory(prefix="dte-bench-plot-") as tmp:
        paths = []
        for i, rows in enumerate(data):
            p = os.path.join(tmp, "d%d.dat" % i)
            with open(p, "w") as f:
                for r in rows:
                    f.write(" ".join("NaN" if x is None else str(x) for x in r) + "\n")
            paths.append(p)
        text = ("set terminal pngcairo enhanced size %d,%d font ',10'\nset output '%s'\n"
                % (size + (out,)) + script % tuple(paths))
        r = subprocess.run(["gnuplot"], input=text, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError("gnuplot: %s" % r.stderr)


def fmt_count(n):
    """276836608 -> '276.8 M' (k, M, G: powers of ten)."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return "%.1f %s" % (n / div, unit)
    return "%d" % n


def plot_data(res):
    """What the plots draw, taken from a run's results (kept as
    docs/bench-plots.json)."""
    d = {"codec": [{k: r[k] for k in ("lr", "bpc_wire", "bpc_wire_zstd", "bpc_storage",
                                       "changed_pct", "bpc_dte")}
                   for r in res["codec"]["rows"]]}
    e2e = res.get("e2e")
    if e2e:
        d["e2e"] = {"elements": e2e["elements"], "links": [
            {"gbit": r["gbit"], "tcp_gbit": r.get("tcp_gbit"), "dense_bytes": r["dense"]["bytes"],
             "dense_s": r["dense_s"], "sparse_s": r["sparse_s"], "floor_s": r["floor_s"],
             "line_s": r["line_s"]} for r in e2e["links"]]}
    return d


def plots(res, docs):
    data = plot_data(res)
    with open(os.path.join(docs, PLOT_DATA), "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    return draw(data, docs)


def draw(data, docs):
    """docs/bench-codec.png and docs/bench-e2e.png from plot_data()'s numbers.
    Each gnuplot script is %-formatted once, with the data files' paths."""
    made = []
    codec = data["codec"]
    _plot("set logscale x\nset format x '10^{%%L}'\n" +
          "set xrange [%g:%g]\n" % (min(r["lr"] for r in codec) / 1.5,
                                    max(r["lr"] for r in codec) * 1.5) +
          "set xlabel 'learning rate (one real torch AdamW step)'\n"
          "set ylabel 'bytes per changed element'\nset yrange [0:*]\n"
          "set y2label 'changed %% of BF16 elements'\nset y2tics\nset logscale y2\n"
          "set format y2 '%%g'\nset ytics nomirror\n"
          "set key outside below center horizontal maxrows 3 Left reverse\n"
          "set title 'Real torch AdamW step: bytes per truly changed BF16 element'\n"
          "plot '%s' u 1:2 w lp pt 7 t 'wire, default (raw, guard band incl.)', "
          "'' u 1:3 w lp pt 5 t 'wire, zstd 1', '' u 1:4 w lp pt 9 t 'storage (zstd)', "
          "'' u 1:6 w lp pt 13 t 'AReaL-DTE rule (int32+BF16)', "
          "'' u 1:5 axes x1y2 w lp dt 2 pt 6 lc rgb '#777777' t 'changed %% (right axis)', "
          "2 w l dt 3 lc rgb 'black' t 'dense: 2 B per element'\n",
          [[(r["lr"], r["bpc_wire"], r["bpc_wire_zstd"], r["bpc_storage"], r["changed_pct"],
             r["bpc_dte"]) for r in codec]], os.path.join(docs, "bench-codec.png"),
          size=(800, 560))
    made.append("bench-codec.png")
    e2e = data.get("e2e")
    if e2e:
        links = e2e["links"]

        def reached(r):
            return min(r["gbit"], r["tcp_gbit"]) if r.get("tcp_gbit") else None

        def g(x):
            return "%.3g" % x
        tics = ", ".join('"%s%s" %s' % (r["gbit"], "\\n(TCP %s)" % g(r["tcp_gbit"])
                                         if r.get("tcp_gbit") else "", r["gbit"])
                         for r in links)
        short = [r for r in links if r.get("tcp_gbit") and r["tcp_gbit"] < 0.8 * r["gbit"]]
        sub = ["measured on a veth shaped by tc to %s Gbit/s" % ", ".join(
            str(r["gbit"]) for r in links)]
        if any(r.get("tcp_gbit") for r in links):
            sub[0] += "; a plain TCP stream reached %s Gbit/s on it" % ", ".join(
                g(r["tcp_gbit"]) if r.get("tcp_gbit") else "-" for r in links)
            sub += ["the points at %s Gbit/s ran on a link that carried at most %s Gbit/s "
                    "(this VM's TCP ceiling)" % (r["gbit"], g(r["tcp_gbit"])) for r in short]
        sub.append("solid lines, filled points: measured; dashed lines, open points: "
                   "modelled from bytes and rates")
        head = ("set xrange [%g:%g]\nset xtics (%s)\n" % (
                    min(r["gbit"] for r in links) / 1.4, max(r["gbit"] for r in links) * 1.4,
                    tics) +
                "set title \"One version end to end: %s elements (%.1f MB as dense BF16)%s\"\n"
                % (fmt_count(e2e["elements"]), links[0]["dense_bytes"] / 1e6,
                   "".join("\\n{/*0.85 %s}" % x for x in sub)))
        _plot(head.replace("%", "%%") +
              "set logscale xy\nset format y '%%g'\n"
              "set xlabel 'link rate set with tc, Gbit/s (below: what a plain TCP stream "
              "reached)' offset 0,-0.8\nset ylabel 'seconds, publish to applied'\n"
              "set key outside below center vertical Left reverse\n"
              "plot '%s' u 1:2 w lp lw 2 pt 7 ps 1.3 t 'dted dense, fresh sink (measured)', "
              "'' u 1:3 w lp lw 2 pt 5 ps 1.3 t 'dted sparse, AdamW inversion (measured)', "
              "'' u 1:5 w lp dt 2 pt 6 lc rgb '#1f77b4' t 'dense bytes at the set rate (modelled: the broadcast "
              "floor)', "
              "'' u 1:6 w lp dt 3 pt 8 lc rgb '#d62728' t 'dense bytes at the rate plain TCP reached (modelled "
              "from the measured rate)', "
              "'' u 1:4 w lp dt 4 pt 4 lc rgb '#555555' t 'floor: min(sparse floor, dense floor), stages "
              "measured alone, wire at the set rate (modelled)'\n",
              [[(r["gbit"], r["dense_s"], r["sparse_s"], r["floor_s"], r["line_s"],
                 r["dense_bytes"] * 8 / (reached(r) * 1e9) if reached(r) else None)
                for r in links]], os.path.join(docs, "bench-e2e.png"), size=(900, 640))
        made.append("bench-e2e.png")
    return made


def fmt_mb(b):
    return "%.0f" % (b / 2**20)


def memfd_note(res, stall_s):
    """What the same scan costs over memfd pages (the daemon's input on the
    CPU path), when the bench measured it, and what is left of the stall."""
    rest = (" The rest is the daemon's share of the 2 cores: the parts' sends, and the sink "
            "daemon receiving and staging them, run on the cores the detect uses.")
    mf = res.get("scan_memfd")
    if not mf:
        return rest
    d = mf["scan-detail"]
    anon = res["scan"].get("floor_csum_s")
    mem = float(d["detect_csum_s"])
    if anon:
        r = mem / anon
        how = ("%.2fx slower than" % r if r > 1.05 else "%.2fx faster than" % (1 / r)
               if r < 1 / 1.05 else "about as fast as")
    else:
        how = "measured next to"
    return (" The daemon reads the trainer's memfds; over memfd pages, mapped where the daemon "
            "maps them (apart: three mappings of one size left to the kernel land exactly their "
            "size apart, which earlier versions of this bench measured, 1.5x slower), the same "
            "scan ran %s over the anonymous memory above in this run (`%s`: detect %s s, "
            "detect + checksum %s s, best of its rounds, against a stream of %s s over the same "
            "pages), and against that detect + checksum the stall ratio is %.2f.%s" % (
                how, mf["cmd"], d["detect_s"], d["detect_csum_s"], d["stream_s"],
                stall_s / mem, rest))


def bounds(res):
    """What the run's own numbers say the stall and e2e ratios cannot go
    below on this machine, whatever the pipelining: the capture must read
    θ, m, v and mix every element's BF16 into the expected checksum before
    the trainer may step, and the sink's apply follows the last part."""
    sc, e2e = res["scan"], res["e2e"]
    fl, flc = sc.get("floor_s", sc["detect_s"]), sc.get("floor_csum_s")
    tails = [m["transfer_ms"] for r in e2e["links"] for m in r["sparse"]
             if m.get("mode") == "sparse" and m.get("transfer_ms") is not None]
    if not flc or not tails:
        return None
    tail = statistics.median(tails) / 1e3
    return ("What bounds the stall and end-to-end ratios here, from this run's own numbers: "
            "the trainer may step only once the capture has read θ, m and v and mixed every "
            "element's BF16 into the expected checksum (DESIGN §2.3: per version, over the "
            "whole expected content, computed by the sender from the source memory), so the "
            "stall cannot go below detect + checksum = %.3f s, %.2f of the detect floor (the "
            "stall goal is 1.1). The sink engine is parked at its safe point, so its daemon "
            "swaps each part into the weights as it arrives, the payload getting the old "
            "values so a failed version is rolled back exactly; a part carries its entries' "
            "counts, so this starts before COUNTS, which the source can send only after the "
            "capture (docs/SYNC.md, Apply on arrival). What is left after the capture is the "
            "last part's transfer and swap, the sums and STAGED: median %.0f ms over the "
            "sparse versions here, %.2f of the floor on top of the capture. The engine still "
            "sees a version only whole (§2.4). The checksum is compute "
            "(one 32-bit multiply per element by a key drawn from its index, gpu/elem.h "
            "dtc_csum_term, summed inside the detect's cheap-test pass, about %.0f%% of the "
            "detect's time on these 2 cores, with the detect at %.2f of the stream); on a GPU "
            "the same kernels are bound by HBM reads "
            "(`make bench-gpu`)." % (
                flc, flc / fl, tail * 1e3, tail / fl,
                100.0 * (flc - fl) / fl, sc["ratio"]))


def _summary_kv(res, prefix):
    """key=value pairs of the summary line that starts with prefix, or {}."""
    for line in res.get("summary", []):
        if line.startswith(prefix + " ") and "skipped" not in line:
            return dict(x.split("=", 1) for x in line.split() if "=" in x)
    return {}


def issue18_rows(res):
    """Summary-table rows of issue #18's figures (checksum, stall, K = 4),
    from the lines this run printed."""
    rows = []
    ck = _summary_kv(res, "bench checksum")
    if ck:
        r = float(ck["ratio"])
        rows.append("| detect with checksum / without (bench checksum ratio) | %.3f | ≤ 1.10 | %s |"
                    % (r, "yes" if r <= 1.10 else "no"))
    st = res.get("stall_async")
    if st:
        rows.append("| async publish: trainer time blocked per version / detect floor "
                    "(blocked_ratio) | %.4f | ≤ 0.05 | %s |"
                    % (st["blocked_ratio"], "yes" if st["blocked_ratio"] <= 0.05 else "no"))
        rows.append("| async publish: step time with publish / without (step_overhead) | %.3f | "
                    "≤ 1.05 | %s |" % (st["step_overhead"],
                                      "yes" if st["step_overhead"] <= 1.05 else "no"))
    k4 = _summary_kv(res, "bench k4")
    if k4:
        r = float(k4["fp_rate"])
        rows.append("| K = 4 false-positive rate (worst configuration; side table %s B/element) | "
                    "%.2e | ≤ 1e-3 | %s |" % (k4["table_bytes_per_element"], r,
                                              "yes" if r <= 1e-3 else "no"))
    return rows


def write(res, root):
    docs = os.path.join(root, "docs")
    made = plots(res, docs)
    m, sc, cd, e2e, snap = res["machine"], res["scan"], res["codec"], res["e2e"], res["snapshot"]
    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    w("Generated by `make bench` (tests/bench/run.py); every number below comes from the same "
      "run. Do not edit by hand: rerun.")
    w("")
    w("Machine: %s, %d cores, %.1f GiB memory, Linux %s, %s; CPU compute backend%s. "
      "A VM on a shared host, so wall-clock figures are noisy; ratios are taken within "
      "the run." % (m["cpu"], m["cores"], m["mem_gib"], m["kernel"], m["date"],
                                 " (AVX-512)" if m["flags_avx512"] else ""))
    w("Whole run: %.0f s.%s" % (res["elapsed_s"], (
        " Load average (1 min) %.1f at the start, %.1f at the end, on 2 cores: the machine "
        "was shared with other jobs, so every wall-clock figure includes waiting for a core; "
        "the per-version CPU seconds of the daemons below do not." % (
            m["load"], m.get("load_end", float("nan")))) if "load" in m else ""))
    w("")
    w("## Summary")
    w("")
    w("```")
    L.extend(res["summary"])
    w("```")
    w("")
    w("| figure | measured | goal | met |")
    w("|---|---|---|---|")
    w("| scan ratio (detect GB/s over 12 B/element vs streaming read) | %.2f | ≥ 0.7 | %s |" % (
        sc["ratio"], "yes" if sc["ratio"] >= 0.7 else "no"))
    row = next(r for r in cd["rows"] if abs(r["lr"] - 1e-6) < 1e-12)
    w("| wire bytes per truly changed element, default configuration, lr 1e-6 | %.2f | "
      "(storage goal ≤ 2.5) | - |" % row["bpc_wire"])
    w("| storage bytes per changed element, lr 1e-6 | %.2f | ≤ 2.5 | %s |" % (
        row["bpc_storage"], "yes" if row["bpc_storage"] <= 2.5 else "no"))
    if e2e:
        for r in e2e["links"]:
            w("| e2e floor ratio at %d Gbit/s | %.2f | ≤ 1.25 | %s |" % (
                r["gbit"], r["floor_ratio"], "yes" if r["floor_ratio"] <= 1.25 else "no"))
            if "floor_ratio_reached" in r and r.get("tcp_gbit") and r["tcp_gbit"] < r["gbit"]:
                w("| the same, floors at the %.1f Gbit/s a plain TCP stream reached on it "
                  "here | %.2f | (context) | - |" % (r["tcp_gbit"], r["floor_ratio_reached"]))
        st = e2e["stall_s"] / sc.get("floor_s", sc["detect_s"])
        w("| synchronous publish (`wait=True`): trainer stall / scan floor | %.2f | (≤ 1.1, "
          "replaced by the blocked ratio below) | - |" % st)
        red = 100 * (1 - e2e["peak_mb"] / e2e["snapshot_mb"])
        w("| daemon memory reduction vs 2 B/element snapshot, sparse versions | %.1f %% | "
          "≥ 87 %% | %s |" % (red, "yes" if red >= 87 else "no"))
        red = 100 * (1 - e2e["all_peak_mb"] / e2e["snapshot_mb"])
        w("| the same, every version (dense ones included) | %.1f %% | ≥ 87 %% | %s |" % (
            red, "yes" if red >= 87 else "no"))
        ten = next(r for r in e2e["links"] if r["gbit"] == e2e["line_link"])
        w("| dense sync / line rate at %d Gbit/s (dense_line_rate_ratio) | %.2f | ≥ 0.9 | %s |"
          % (ten["gbit"], ten["dense_line_ratio"], "yes" if ten["dense_line_ratio"] >= 0.9
             else "no"))
    for row in issue18_rows(res):
        w(row)
    sb = res["snapdet"]["baseline"]
    w("| snapshot_detect_ratio (dted detect s / snapshot compare s, same step) | %s | "
      "(none: a cost, see below) | - |" % sb["snapshot_detect_ratio"])
    w("| dte_margin_bytes_ratio (AReaL-DTE bytes / dted bytes, same step) | %s | > 1 | %s |" % (
        sb["dte_margin_bytes_ratio"], "yes" if float(sb["dte_margin_bytes_ratio"]) > 1 else "no"))
    w("")
    write_baselines(w, res)
    w("")
    w("## Detection scan")
    w("")
    w("`%s` — θ, m, v in FP32 (12 B/element) of one simulated AdamW step at lr 1e-6, "
      "detect (dtc_detect: one pass, encoded payload included; scan-csum adds the entry "
      "checksum) against a multi-threaded streaming read of the same bytes (plain and with "
      "the scan's software prefetch, the faster of the two), both cores. The phases run in "
      "turn for a warm-up round and 9 rounds; each round gives one ratio, stream time over "
      "detect time seconds apart, and a run's ratio is the median round's (the machine's "
      "speeds drift with its neighbours within a minute, and the best of each phase alone "
      "can pair a quiet moment with a busy one; `best_ratio` is that pairing, shown for "
      "comparison). It ran three times across the bench; the figure is the median run's "
      "ratio, and the floor the end-to-end and stall figures divide by is the fastest "
      "detect of all rounds (%.3f s; with the checksum %.3f s). The median run:" % (
          sc["cmd"], sc.get("floor_s", sc["detect_s"]),
          sc.get("floor_csum_s", float("nan"))))
    w("")
    w("```")
    L.extend(sc["lines"])
    w("```")
    w("")
    w("All three (when, detect s, detect+checksum s, stream s, ratio):")
    w("")
    w("```")
    for r in res.get("scans", [sc]):
        d = r["scan-detail"]
        L.append("%-28s detect_s=%s detect_csum_s=%s stream_s=%s ratio=%.2f" % (
            r.get("when", "-"), d["detect_s"], d.get("detect_csum_s", "-"), d["stream_s"],
            r["ratio"]))
    w("```")
    w("")
    w("## Codec: bytes per changed element")
    w("")
    w("A %d-element MLP (%d tensors) trained with `torch.optim.AdamW` (weight decay 0.01) on a "
      "regression task; for each learning rate, %d steps at that rate from the same start, then "
      "the next step is measured. **Wire** = what the source daemon really sends for that "
      "step: `bench_codec --detect` runs dtc_detect over the step's FP32 θ, m, v with the "
      "optimizer's own hyper-parameters (so every element the inverse cannot prove unchanged, "
      "the guard band, is in the bytes), each tensor one entry, framed as one part the way "
      "the default configuration frames it (zstd_level 0: raw; zstd 1 shown beside it). The "
      "divisor is the number of elements whose BF16 truly changed (torch's before/after "
      "rounding). **Storage** = `dte-storage write` of exactly the changed elements "
      "(daemon/storage chunk codec), size from `dte-storage ls`. **AReaL-DTE** = the seed "
      "paper's rule on the same state: AdamW inverse, an element sent when RNE(θ̂ ± 1e-4·|θ|) "
      "differs from RNE(θ) at either end, 6 B each (int32 index + BF16 value, uncompressed). "
      "Values included everywhere; dense = 2 B/element." % (cd["elements"], cd["tensors"],
                                                          cd["warm"]))
    w("")
    w("| lr | changed % | flagged % (dted) | wire B/chg (default, raw) | wire zstd 1 B/chg "
      "| storage B/chg | AReaL-DTE flagged % | AReaL-DTE B/chg | wire / dense | zstd pack+unpack ms "
      "| zstd break-even Gbit/s |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in cd["rows"]:
        w("| %g | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.5f | %.1f | %.2f |" % (
            r["lr"], r["changed_pct"], 100.0 * r["flagged"] / r["elements"], r["bpc_wire"],
            r["bpc_wire_zstd"], r["bpc_storage"], 100.0 * r["dte_flagged"] / r["elements"],
            r["bpc_dte"], r["wire_raw"] / r["dense"], r["zstd_ms"] + r["unzstd_ms"],
            r["zstd_breakeven_gbit"]))
    w("")
    row = next(r for r in cd["rows"] if abs(r["lr"] - 1e-6) < 1e-12)
    w("The headline (`bench codec bytes_per_change`) is the default wire at lr 1e-6: %.2f B per "
      "truly changed element, of which the guard band adds %.2f %% more elements than changed; "
      "the storage codec's %.2f B is what `dte-storage` writes, not what a same-cluster sync "
      "sends. zstd level 1 would cut the wire to %.2f B, but packing and unpacking cost %.1f ms "
      "on one core for %.1f MB here: it saves time only on links slower than the break-even "
      "column (the bits it saves per second of zstd), %.2f Gbit/s at lr 1e-6, so remote pairs "
      "keep zstd_level = 0 by default and conf/dted.conf says when to raise it." % (
          row["bpc_wire"], 100.0 * (row["flagged"] - row["changed"]) / max(row["changed"], 1),
          row["bpc_storage"], row["bpc_wire_zstd"], row["zstd_ms"] + row["unzstd_ms"],
          row["wire_raw"] / 1e6, row["zstd_breakeven_gbit"]))
    w("")
    w("![codec](bench-codec.png)")
    w("")
    if not e2e:
        w("## End to end, stall, memory")
        w("")
        w("Not measured in this run: the end-to-end figures need root for network namespaces.")
        w("The detect baselines above ran without it.")
    else:
        write_e2e(w, res, e2e, snap, sc)
    write_stall_async(w, res.get("stall_async"))
    if res.get("apply_verify"):
        write_apply_verify(w, res["apply_verify"])
    w("")
    w("## Exact commands")
    if res.get("k4"):
        import bench_k4  # the K = 4 section (its own module)
        bench_k4.write_section(w, res["k4"])
    w("")
    w("```")
    w("make bench            # builds, then B=build /usr/bin/python3 tests/bench/run.py")
    w(sc["cmd"])
    w("# codec: tests/bench/bench_codec.py -> build/tests/bench_codec DELTA SIZES;")
    w("#        dte-storage write ROOT codec --spec S --version 1 --delta D --dense F; "
      "dte-storage ls ROOT codec --json")
    if e2e:
        w("# e2e:   ip netns add A; ip netns add B; ip link add VA netns A type veth peer name "
          "VB netns B")
        for gbit in res["links"]:
            w("#        " + e2e["shape_cmd"].replace("rate 1gbit", "rate %dgbit" % gbit)
              .replace("burst %d" % max(256 * 1024, int(1e9 / 8 * 0.002)),
                       "burst %d" % max(256 * 1024, int(gbit * 1e9 / 8 * 0.002))))
        w("#        dted --foreground --peer-listen ADDR:0 in each namespace, UCX_TLS=tcp, "
          "UCX_NET_DEVICES=veth")
    w("```")
    w("")
    w("Plots: %s (their numbers: docs/%s; `python3 tests/bench/report.py --plots` draws "
      "them again from it)." % (", ".join("docs/" + p for p in made), PLOT_DATA))
    check_met(L)
    L = keep_apart(L, os.path.join(docs, "BENCHMARKS.md"))
    with open(os.path.join(docs, "BENCHMARKS.md"), "w") as f:
        f.write("\n".join(L) + "\n")


APART_MARKS = ("(measured apart", "(measured by `make test`)")


def keep_apart(L, path):
    """The sections of the existing file measured by other commands (a
    heading with "(measured apart" or "(measured by `make test`)": make
    bench-plan, bench-replan, bench-ab, ...) are not this run's to drop:
    carried over as they are, before "## Exact commands", unless this run
    wrote a section of the same heading."""
    try:
        with open(path) as f:
            old = f.read().splitlines()
    except OSError:
        return L
    have = {x for x in L if x.startswith("## ")}
    keep, cur = [], None
    for line in old:
        if line.startswith("## "):
            cur = [] if any(m in line for m in APART_MARKS) and line not in have else None
            if cur is not None:
                keep.append(cur)
        if cur is not None:
            cur.append(line)
    if not keep:
        return L
    at = L.index("## Exact commands") if "## Exact commands" in L else len(L)
    out = L[:at]
    for sec in keep:
        while sec and not sec[-1].strip():
            sec.pop()
        out += sec + [""]
    return out + L[at:]


def write_apply_verify(w, av):
    """The sink's apply with the verify that reads back what it wrote
    (docs/SYNC.md step 5) against the write and its own delta, same run."""
    w("")
    w("## Apply: the verify that reads memory")
    w("")
    w("A sparse apply swaps the new values in (the staged payload keeps the old ones:")
    w("the undo log of a failed check) and then sums what memory holds at the written")
    w("positions (`dtc_sparse_readback_payload`); before, the sum came from the write's")
    w("own delta and never looked at memory.  `%s`, alternating rounds, medians:" % av["cmd"])
    w("")
    w("| changed | before ms | now ms | now / before |")
    w("|---|---|---|---|")
    for line in av["lines"]:
        if line.startswith("apply-verify:"):
            d = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
            w("| %s of %s | %s | %s | %s |" % (d.get("changed"), d.get("elements"),
                                              d.get("before_ms"), d.get("now_ms", d.get("after_ms")),
                                              d.get("ratio")))
    for line in av["lines"]:
        if line.startswith("apply-dense:"):
            d = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
            w("")
            w("Dense: the swap %s ms against a plain copy %s ms (%sx) over %s elements."
              % (d.get("swap_ms"), d.get("copy_ms"), d.get("ratio"), d.get("elements")))


def check_met(lines):
    """Only a goal row says met: in every "| ... | goal | met |" table a row
    whose goal is a parenthesised note ("(context)", "(storage goal ...)")
    says "-", and a row with a goal says yes or no."""
    bad = []
    cols = None
    for ln in lines:
        if not ln.startswith("|"):
            cols = None
            continue
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if cols is None:
            cols = cells
            continue
        if "goal" not in cols or "met" not in cols or set(ln) <= set("|-: "):
            continue
        goal, met = cells[cols.index("goal")], cells[cols.index("met")]
        if goal.startswith("(") or goal in ("", "-"):
            if met != "-":
                bad.append(ln)
        elif met not in ("yes", "no"):
            bad.append(ln)
    if bad:
        raise SystemExit("report: met column wrong (only goal rows say yes/no):\n" +
                         "\n".join(bad))


def write_e2e(w, res, e2e, snap, sc):
    n = e2e["elements"]
    w("## End to end over shaped links")
    w("")
    w("Source daemon and sink daemon in two network namespaces joined by one veth pair, tbf "
      "at the link rate on both ends; UCX over TCP; both daemons configured as dted ships "
      "(conf/dted.conf defaults). The source holds a Qwen3-shaped model of %d elements (%s; "
      "FP32 θ, m, v = %.1f GiB in memfds) updated by torch AdamW (lr 1e-6, Gaussian "
      "gradients) in place; the sink is one SGLang tp=1 BF16 copy (%.2f GiB, its memory "
      "populated before the first sync, as a serving engine's loaded weights are). Per link: "
      "a plain TCP stream measures the link (its sender on the source's core, its receiver on "
      "the sink's), then a fresh sink attaches, so the next version "
      "goes dense through dted's own dense path, then five versions at lr 1e-6 whose mode "
      "dted chooses (`sync_mode = auto`; sync time = their median, sparse = the median of "
      "those that went sparse), then the crossover sweep above. The source daemon and the "
      "trainer are pinned to one core, the sink daemon to the other. Time = publish call "
      "until `wait` returns (sink applied, checksum verified). Floor = min(sparse floor, "
      "dense floor): sparse floor = max(detect alone, sparse bytes at the link rate, the "
      "sink's sparse apply alone), dense floor = max(reading θ and rounding alone, dense "
      "bytes at the link rate, the sink's dense write alone), each stage measured alone in "
      "the same run on its core (tests/bench/bench_e2e.py). The detect alone is dted's own "
      "detect with the checksum over the trainer's very θ, m, v right after the step, run "
      "right before that version's publish on the source's core (gpu/bench_detect_once.c, "
      "best of three after a warm-up), so each version is compared with its own floor and "
      "the floor ratio is the median over the versions of sync time / floor: this VM's "
      "speed drifts minute to minute (bench_scan's detect alone over synthetic arrays: %s s "
      "before the trainer existed, %s s before each link). The "
      "dense and sparse times are for consecutive versions of the same run (the same model, "
      "one step apart), not literally the same version." % (
          n, "≥ 2^28" if n >= 1 << 28 else "BENCH_SMALL: below 2^28", 12 * n / 2**30,
          2 * n / 2**30, "%.3f" % e2e["alone"]["detect_s"] if e2e.get("alone") else "-",
          " / ".join("%.3f" % r["detect_alone_s"] for r in e2e["links"]
                     if "detect_alone_s" in r) or "-"))
    w("")
    w("| link Gbit/s | dense s | dense bytes | sparse s | sparse bytes | changed % | wire s "
      "| sync s (dense of 5) | floor s | floor ratio | speedup | capture ms | transfer ms "
      "| apply ms | sparse CPU s source / sink |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in e2e["links"]:
        s0 = sorted(r["sparse"], key=lambda m: m["total_s"])[len(r["sparse"]) // 2]
        cpu = ("%.2f / %.2f" % (statistics.median(m["src_cpu_s"] for m in r["sparse"]),
                                statistics.median(m["sink_cpu_s"] for m in r["sparse"]))
               if "src_cpu_s" in s0 else "-")
        w("| %d | %.3f | %d | %.3f | %d | %.3f | %.3f | %.3f (%d) | %.3f | %.2f | %.2f | %s | %s "
          "| %s | %s |"
          % (r["gbit"], r["dense_s"], r["dense"]["bytes"], r["sparse_s"], r["sparse_bytes"],
             100.0 * s0["changed"] / max(s0["elements"], 1), r["wire_s"], r["sync_s"],
             r["sync_dense"], r["floor_s"],
             r["floor_ratio"], r["speedup"], _ms(s0["capture_ms"]), _ms(s0["transfer_ms"]),
             _ms(s0["apply_ms"]), cpu))
    w("")
    w("Capture, transfer and apply columns are those of the median sparse version; the CPU "
      "column is what the two daemons themselves spent per sparse version (median), so the "
      "difference to the wall-clock time is time spent waiting: for a core on this shared "
      "machine, or for the link. "
      "Link rate reached by the dense payload (its bytes over the time from the capture's "
      "start to the sink applied, parts going out from the first entry on): %s Gbit/s. "
      "Where that is far below the setting, the link was not the limit. "
      "Sparse time is mostly capture: publish → answer, the one-pass detect over every "
      "entry (entries of at most 2^24 elements) with the expected checksum of every "
      "element, on both cores; payload parts of about 256 KiB (whole entries) go out while later entries are still "
      "detected, COUNTS last (payloads raw, zstd_level 0), and the parked sink swaps each into "
      "its weights as it arrives (a scatter straight from the payload bytes that also sums "
      "the checksum change; a full verification pass every 16 versions). Then the tail: the "
      "last part's transfer and swap, the sums, STAGED and the engine's apply, which writes "
      "nothing (the transfer column: from the capture's end to the sink applied). "
      "Both daemons, the trainer and the sink stand-in share this machine's 2 cores, so the "
      "sink's receive and the kernel's TCP work run on the cores the detect uses; two "
      "machines would not." % (
          ", ".join("%d Gbit/s → %s" % (r["gbit"], _rate2(r["dense"])) for r in e2e["links"])))
    w("")
    w("![e2e](bench-e2e.png)")
    w("")
    w("## Trainer stall")
    w("")
    fl = sc.get("floor_s", sc["detect_s"])
    flc = sc.get("floor_csum_s")
    w("Publish call → answer (the trainer may step again) on the sparse versions above: median "
      "%.3f s against the scan floor %.3f s (ratio %.2f). The answer goes as soon as the "
      "source memory has been read, before framing and sending: what remains inside it is the "
      "one-pass detect and the expected checksum, which DESIGN §2.3 requires of every version "
      "over the whole expected content, so every element's BF16 is converted and multiplied "
      "by its index's key (gpu/elem.h, dtc_csum_term). Against detect + checksum "
      "as bench_scan measures it (%s s) the ratio is %s.%s" % (
          e2e["stall_s"], fl, e2e["stall_s"] / fl, "%.3f" % flc if flc else "-",
          "%.2f" % (e2e["stall_s"] / flc) if flc else "-", memfd_note(res, e2e["stall_s"])))
    cpu = [m["src_cpu_s"] for r in e2e["links"] for m in r["sparse"] if "src_cpu_s" in m]
    core = sc.get("scan-cpu", {}).get("detect_csum")
    if cpu and core:
        ref = float(core) * 1e-9 * e2e["elements"]
        w("")
        w("In CPU time, which the machine's other load does not inflate: the source daemon "
          "spent a median %.3f s of CPU per sparse version (capture, framing and sending, all "
          "threads), against %.3f s of CPU for detect + checksum in bench_scan "
          "(core_ns_per_element detect_csum %s × %d elements): %.2f." % (
              statistics.median(cpu), ref, core, e2e["elements"],
              statistics.median(cpu) / ref))
    w("")
    b = bounds(res)
    if b:
        w(b)
        w("")
    w("## Daemon memory")
    w("")
    dense_src = max(r["dense"]["src_anon"] for r in e2e["links"]) / 2**20
    dense_snk = max(r["dense"]["sink_anon"] for r in e2e["links"]) / 2**20
    w("Peak private anonymous memory (RssAnon sampled every 10 ms; the memfds shared with the "
      "clients are excluded). During the sparse versions at lr 1e-6: source daemon %.0f MiB, "
      "sink daemon %.0f MiB, together %.0f MiB, against a snapshot-keeping baseline's BF16 "
      "copy of the previous version, 2 B/element = %.0f MiB (reduction %.1f %%). Counting "
      "every version, the dense ones and the crossover sweep included: source %.0f MiB, sink "
      "%.0f MiB, together %.0f MiB (reduction %.1f %%). A dense version peaks at source %.0f "
      "MiB, sink %.0f MiB: the sink holds every part of a version until the whole version is "
      "verified (no torn versions, DESIGN §2.4; a part swapped in on arrival holds the old "
      "values it replaced, the undo), so for a dense version it holds the whole BF16 model, "
      "2 B/element, like the snapshot baseline holds always, but only until the version is "
      "in (a fresh sink's arena, daemon/recvpool.h, is that memory populated ahead); no exact "
      "rollback of a version that changes every element can hold less. The source holds the parts the link has not taken yet "
      "(it frames them as fast as it reads θ, because publish returns once the version is "
      "captured and the trainer may step again, DESIGN §6; bounding them to a few parts would "
      "keep the trainer waiting for the whole transfer of a dense version). The sink's figure "
      "includes its peer staging region once touched (conf/dted.conf `[peer] staging_size`, "
      "16 MiB by default since parts became 256 KiB, 64 MiB before; registered with UCX once). "
      "VmHWM (peak RSS including mapped client memory): source %s MiB, sink %s MiB." % (
          e2e["peak_src_mb"], e2e["peak_sink_mb"], e2e["peak_mb"], e2e["snapshot_mb"],
          100 * (1 - e2e["peak_mb"] / e2e["snapshot_mb"]), e2e["all_src_mb"],
          e2e["all_sink_mb"], e2e["all_peak_mb"],
          100 * (1 - e2e["all_peak_mb"] / e2e["snapshot_mb"]), dense_src, dense_snk,
          fmt_mb(e2e["hwm"]["source"]), fmt_mb(e2e["hwm"]["sink"])))
    w("")
    w("## End to end with `detect = snapshot`")
    w("")
    a = next((r for r in e2e["links"] if r["gbit"] == 10), e2e["links"][0])
    if not snap:
        w("Not measured in this run: the job option is not wired into the daemon's capture.")
        return
    s = snap["links"][0]
    w("The daemons with the job option `detect = snapshot` (daemon/job_snapshot.c in the "
      "capture: the source daemon keeps the BF16 of the version last sent, 2 B/element) "
      "against AdamW inversion, at %d Gbit/s, same model (a second run with fresh daemons "
      "and a fresh trainer: its sparse versions are the first steps of that trainer, so "
      "they change more elements than the adamw run's versions at this link, which come "
      "after the 1 Gbit/s link's steps; the source's CPU per version is the steadier "
      "comparison on this shared machine):"
      % s["gbit"])
    w("")
    w("| detect | sparse s | stall s | sparse bytes | flagged per version | source daemon "
      "MiB | sink daemon MiB | source CPU s per version |")
    w("|---|---|---|---|---|---|---|---|")
    for name, r in (("adamw", a), ("snapshot", s)):
        w("| %s | %.3f | %.3f | %d | %d | %.0f | %.0f | %s |" % (
            name, r["sparse_s"], r["stall_s"], r["sparse_bytes"],
            statistics.median(m["changed"] for m in r["sparse"]),
            max(m["src_anon"] for m in r["sparse"]) / 2**20,
            max(m["sink_anon"] for m in r["sparse"]) / 2**20,
            "%.3f" % statistics.median(m["src_cpu_s"] for m in r["sparse"])
            if "src_cpu_s" in r["sparse"][0] else "-"))


def write_stall_async(w, st):
    """Issue 18's stall figure (tests/bench/bench_stall.py): a publish that
    does not stop the trainer, in an offloaded-optimizer loop."""
    w("")
    w("## Stall of a publish that does not stop the trainer")
    w("")
    if not st or not st.get("rows"):
        w("Not measured in this run (tests/bench/bench_stall.py; see the run log).")
        return
    w("tests/bench/bench_stall.py: an offloaded-optimizer loop over %d elements (forward + "
      "backward as a sleep of fb on the trainer thread, GPU time the host does not spend; "
      "torch AdamW on the host θ, m, v in memfds, one thread; publish every step through "
      "dte.Source, which answers once dted accepted the version; the wrapped optimizer step "
      "waits only while the capture still reads). The sink applies in its own process. "
      "Blocked = the publish call plus the step's wait, per version; the floor is bench_scan's "
      "detect alone, %.3f s. A synchronous publish (protocol 1) blocked the trainer %.3f s "
      "per version (%.2f of the floor). Step times are medians of %d interleaved rounds." % (
          st["elements"], st["floor_s"], st["sync"]["blocked_s"],
          st["sync"]["blocked_s"] / st["floor_s"], st.get("rounds", 0)))
    w("")
    w("| fb / capture | fb s | step s with publish | without | overhead | blocked s / version "
      "| / detect floor | capture s |")
    w("|---|---|---|---|---|---|---|---|")
    for r in st["rows"]:
        w("| %.2f | %.3f | %.3f | %.3f | %.3f | %.4f | %.3f | %.3f |" % (
            r["frac"], r["fb_s"], r["step_s_with"], r["step_s_without"], r["step_overhead"],
            r["blocked_s"], r["blocked_ratio"], r["capture_s"]))
    w("")
    w("At fb = %.2f x the capture time: blocked_ratio %.4f (goal <= 0.05), step_overhead "
      "%.3f (goal <= 1.05)." % (st["headline_frac"], st["blocked_ratio"], st["step_overhead"]))


def _cross_at(points):
    """Changed fraction (%) where sparse/dense time crosses 1, by linear
    interpolation in log(changed) between the measured points; None when
    every point is on one side."""
    import math
    pts = sorted(points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if (y0 - 1) * (y1 - 1) <= 0 and y0 != y1 and x0 > 0 and x1 > 0:
            f = (1 - y0) / (y1 - y0)
            return math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0)))
    return None


def write_baselines(w, res):
    e2e, sd = res["e2e"], res["snapdet"]
    w("## Baselines")
    w("")
    if e2e:
        w("### Dense: dted's dense path against the line rate")
        w("")
        w("The baseline a NCCL/RDMA broadcast approaches is every BF16 byte at the link rate "
          "and nothing else: dense bytes / link rate, the **line-rate floor**. dted's own dense "
          "path (a fresh sink's first version: extract every BF16 and its checksum from the "
          "trainer's θ, send, stage, apply, verify in full) is measured next to it, and so is "
          "a plain TCP stream over the same shaped link in the same run (one socket, 4 MiB "
          "sends, nothing else running, the sender on the source's core and the receiver on "
          "the sink's): what this machine's kernel carries between two namespaces, the bound "
          "for any TCP transport here.")
        w("")
        w("| link Gbit/s | dense MB | line-rate floor s | dted dense s | of line rate | dense "
          "capture ms | transfer tail ms | apply+verify ms | dense payload Gbit/s | plain TCP "
          "Gbit/s | CPU s source / sink | page faults source / sink | sparse s | speedup vs "
          "dted dense | speedup vs line-rate floor |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in e2e["links"]:
            d = r["dense"]
            w("| %d | %.0f | %.3f | %.3f | %.0f %% | %s | %s | %s | %s | %s | %s | %s | %.3f | "
              "%.2f | %.2f |" % (
                  r["gbit"], d["bytes"] / 1e6, r["line_s"], r["dense_s"],
                  100 * r["dense_line_ratio"], _ms(d["capture_ms"]), _ms(d["transfer_ms"]),
                  _ms(d["apply_ms"]), _rate2(d), "%.2f" % r["tcp_gbit"] if r.get("tcp_gbit")
                  else "-", "%.2f / %.2f" % (d["src_cpu_s"], d["sink_cpu_s"])
                  if "src_cpu_s" in d else "-", "%d / %d" % (d["src_faults"], d["sink_faults"])
                  if "src_faults" in d else "-", r["sparse_s"], r["speedup"], r["line_speedup"]))
        w("")
        w(dense_bound(e2e))
        w("")
        w("### Crossover: where sparse stops winning")
        w("")
        w("After the sparse versions at lr 1e-6, each link takes one more sparse version at "
          "each of the learning rates below (one torch AdamW step each, Gaussian gradients), "
          "so the changed fraction grows towards the whole model; every sparse version goes "
          "through the same daemons and link as the dense one. Cell = sparse time / dense "
          "time (below 1: sparse wins), with the changed fraction of that version. First "
          "against dted's dense path, then against the line-rate floor (what a broadcast at "
          "the full link rate would take).")
        w("")
        for title, key in (("sparse / dted dense", "dense_s"), ("sparse / line-rate floor",
                                                                  "line_s")):
            cols = []
            for r in e2e["links"]:
                for m in [None] + r.get("cross", []):
                    lr = 1e-6 if m is None else m["lr"]
                    if lr not in cols:
                        cols.append(lr)
            w("%s:" % title)
            w("")
            w("| link Gbit/s | " + " | ".join("lr %g" % lr for lr in cols) +
              " | crossover at changed % |")
            w("|---|" + "---|" * (len(cols) + 1))
            for r in e2e["links"]:
                base = r[key]
                pts, cells = [], []
                byl = {1e-6: {"total_s": r["sparse_s"], "changed": r["sparse"][-1]["changed"],
                              "elements": r["sparse"][-1]["elements"]}}
                for m in r.get("cross", []):
                    byl[m["lr"]] = m
                for lr in cols:
                    m = byl.get(lr)
                    if not m:
                        cells.append("-")
                        continue
                    pct = 100.0 * m["changed"] / max(m["elements"], 1)
                    q = m["total_s"] / base
                    pts.append((pct, q))
                    cells.append("%.2f (%.1f %%)%s" % (q, pct, "" if q < 1 else " **dense wins**"))
                x = _cross_at(pts)
                w("| %d | %s | %s |" % (r["gbit"], " | ".join(cells),
                                        "%.0f %%" % x if x else
                                        ("above %.0f %%" % max(p for p, _ in pts)
                                         if all(q < 1 for _, q in pts) else
                                         "below %.1f %%" % min(p for p, _ in pts))))
            w("")
        w("Against a broadcast at the full link rate the crossover moves with the link: the "
          "sparse sync at lr 1e-6 took %s, so it beats sending the whole model (%.0f MB) at line "
          "rate only on links slower than %s, the dense bytes over the sparse time; on faster "
          "links a line-rate broadcast would win here, because the sparse sync is bound by the "
          "CPU detect over θ, m, v (12 B/element on 2 shared cores), not by the wire." % (
              ", ".join("%.3f s at %d Gbit/s" % (r["sparse_s"], r["gbit"])
                        for r in e2e["links"]),
              e2e["links"][0]["dense"]["bytes"] / 1e6,
              ", ".join("%.1f Gbit/s (measured at %d)" % (
                  r["dense"]["bytes"] * 8 / r["sparse_s"] / 1e9, r["gbit"])
                  for r in e2e["links"])))
        w("")
        w("Each cell is one version, so one busy moment of the shared machine moves it; the "
          "columns are in order of the steps taken. "
          "Sparse payloads cost about 3 B per flagged element raw against dense's 2, and the "
          "detect reads 12 B/element of θ, m, v where the dense extract reads 4, so past "
          "the crossover the dense path is the cheaper one; dted does not switch to dense "
          "by itself when a version changes most of the model (it sends what the detect "
          "flags).")
        w("")
    w("### Same AdamW step: dted, snapshot diff, AReaL-DTE")
    w("")
    b, dt, sn, de = sd["baseline"], sd["baseline-dted"], sd["baseline-snapshot"], sd["baseline-dte"]
    n = int(dt["elements"])
    w("`%s`: %d elements of θ, m, v of one simulated torch AdamW step at lr %s (the model "
      "and step gpu/bench_scan.c builds), the sink holding the BF16 of θ_{t-1}; %s elements "
      "(%.2f %%) truly changed. Three ways to find what to send, each on both cores, timed "
      "in turn for a warm-up round and 5 rounds (ratios per round, the median round's "
      "shown): **dted** = dtc_detect as the daemon calls it (AdamW inverse with its derived "
      "error bound, the encoded payload included, no checksum); **snapshot** = "
      "daemon/job_snapshot.c, the PULSE/slime-style baseline built as well as it goes: the "
      "kept BF16 version persistent and updated in place, one pass over θ (4 B) and the "
      "kept values (2 B), AVX-512 with runtime dispatch (portable loop otherwise), "
      "threaded like the detect; **AReaL-DTE** = the seed paper's method: AdamW inverse "
      "with a fixed relative margin of 1e-4·|θ|, int32 index + BF16 value, no compression, "
      "vectorized and threaded the same way." % (
          sd["cmd"], n, dt["lr"], dt["changed"], 100.0 * int(dt["changed"]) / n))
    w("")
    w("| method | time s | flagged | flagged / changed | bytes | B per changed | kept in the "
      "daemon MiB |")
    w("|---|---|---|---|---|---|---|")
    ch = max(int(dt["changed"]), 1)
    w("| dted (AdamW inversion, derived bound) | %s | %s | %.4f | %s | %.3f | 0 |" % (
        dt["detect_s"], dt["flagged"], int(dt["flagged"]) / ch, dt["bytes"],
        int(dt["bytes"]) / ch))
    w("| snapshot diff | %s | %s | %.4f | (same codec as dted: ≈ %.3f) | - | %s |" % (
        sn["snapshot_s"], sn["flagged"], int(sn["flagged"]) / ch, int(dt["bytes"]) / ch,
        sn["kept_mb"]))
    w("| AReaL-DTE (1e-4 margin, int32+BF16) | %s | %s | %.4f | %s | %.3f | 0 |" % (
        de["dte_s"], de["flagged"], int(de["flagged"]) / ch, de["bytes"], int(de["bytes"]) / ch))
    w("")
    w("snapshot_detect_ratio = dted detect time / snapshot compare time = **%s**: %s. "
      "dte_margin_bytes_ratio = AReaL-DTE bytes / dted bytes = **%s** (its margin flags %.0f %% "
      "more elements than changed, dted's bound %.2f %%, and it spends 6 B per element where "
      "dted's gap code and raw value spend about 3); AReaL-DTE's detect takes %s of dted's time "
      "(a full inverse with sqrt and division per element, where dted's cheap test clears most "
      "elements without either). On the real AdamW steps of the codec table the same rule "
      "costs %.2f B per changed element against dted's %.2f (lr 1e-6)." % (
          b["snapshot_detect_ratio"],
          ("the snapshot compare is faster (it reads 6 B/element where the inversion reads 12) "
           "and pays with 2 B/element held for the job's life" if float(b["snapshot_detect_ratio"])
           > 1 else "dted's detect is faster even though it reads 12 B/element to the "
           "snapshot's 6"),
          b["dte_margin_bytes_ratio"], 100.0 * (int(de["flagged"]) - ch) / ch,
          100.0 * (int(dt["flagged"]) - ch) / ch, "%sx" % b["dte_detect_time_ratio"],
          _codec_lr(res, 1e-6)["bpc_dte"], _codec_lr(res, 1e-6)["bpc_wire"]))
    w("")


def _codec_lr(res, lr):
    return next(r for r in res["codec"]["rows"] if abs(r["lr"] - lr) < lr * 1e-6)


def _rate2(m):
    """Dense payload rate over the capture and the transfer tail (capture
    start to the sink's STAGED)."""
    c, t = m.get("capture_ms"), m.get("transfer_ms")
    if not isinstance(c, (int, float)) or not isinstance(t, (int, float)) or c + t <= 0:
        return "-"
    return "%.2f" % (m["bytes"] * 8 / ((c + t) / 1e3) / 1e9)


def _wire_s(r):
    """A link's dense bytes at the plain TCP stream's rate (the setting's
    when no stream was measured)."""
    return r["dense"]["bytes"] * 8 / ((r.get("tcp_gbit") or r["gbit"]) * 1e9)


def dense_bound(e2e):
    """What this run's numbers say bounds the dense path here."""
    parts = []
    cpu = [(r["dense"]["src_cpu_s"] + r["dense"]["sink_cpu_s"], r["dense_s"], r["gbit"],
            r["dense"]["bytes"]) for r in e2e["links"] if "src_cpu_s" in r["dense"]]
    for r in e2e["links"]:
        d = r["dense"]
        tcp = r.get("tcp_gbit")
        cap = (d.get("capture_ms") or 0) / 1e3
        ap = ((d.get("transfer_ms") or 0) + (d.get("apply_ms") or 0)) / 1e3
        if tcp:
            parts.append("at %d Gbit/s the plain stream reached %.2f Gbit/s (%.0f %% of the "
                         "setting), so moving the dense bytes alone takes at least %.3f s here; "
                         "dted took %.3f s, of which capture %.3f s (read θ, extract BF16, "
                         "checksum; parts go out meanwhile) and then %.3f s until the sink had "
                         "every part swapped in and verified" % (
                             r["gbit"], tcp, 100 * tcp / r["gbit"], max(_wire_s(r), r["line_s"]),
                             r["dense_s"], cap, ap))
    cpu_txt = ""
    if cpu:
        cpu_txt = (" The two daemons together spent %s CPU seconds on the dense versions "
                   "(%s of wall time: the rest of the wall time their threads waited for a core "
                   "or for the link); page faults are the first write of memory the version "
                   "needs, each a fresh page per 4 KiB, about 10-20 ms per 32 MiB on this VM "
                   "against 2 ms for a write to memory already mapped: at the source, the "
                   "payload parts in flight (the parts it frames reuse the buffers of parts "
                   "already sent, daemon/bufpool.c, and UCX sends each from the capture's own "
                   "buffer, no router copy); at the sink, the receive buffers, which hold the "
                   "old weights once their part is swapped in, until the whole version is "
                   "verified (no torn versions, DESIGN §2.4). A fresh sink knows its first "
                   "version is dense, so those buffers come from an arena populated while it "
                   "waits for that version (daemon/recvpool.h): its faults are left to the "
                   "weights' own pages, and UCX receives each large part straight into the "
                   "arena (no copy out of staging)." % (
                       " / ".join("%.2f" % c for c, _, _, _ in cpu),
                       " / ".join("%.0f %%" % (100 * c / t) for c, t, _, _ in cpu)))
    ten = [r for r in e2e["links"] if r["gbit"] == 10 and "src_cpu_s" in r["dense"]]
    if ten:
        r = ten[0]
        d = r["dense"]
        goal = r["line_s"] / 0.9
        wire = _wire_s(r)
        cpu_txt += (" At 10 Gbit/s, 90 %% of the link rate means the whole version in %.3f s. "
                    "The wire alone needs %.3f s of it at the plain stream's rate (TCP/IP and "
                    "Ethernet headers count against the shaped rate too), %s, and the "
                    "source's one core spent %.2f s (%.0f %% of the %.3f s; the sink's core "
                    "%.2f s): it reads θ, rounds and sums every BF16 (the checksum, DESIGN "
                    "§2.3) and writes each part, and it runs the kernel's TCP send, which on a "
                    "veth also carries the receiving socket's TCP input (veth_xmit hands each "
                    "frame to netif_rx on the sending CPU, where a NIC would raise it on the "
                    "sink's machine; steering it to the sink's core with RPS cost more in "
                    "inter-processor interrupts on this VM than it moved). With the source's "
                    "core that busy the sends keep the link full only between the capture's "
                    "runs: the first part goes out once it is extracted, parts follow one "
                    "rendezvous at a time on one TCP connection, and the last part is swapped "
                    "and summed after it lands."
                    % (goal, wire,
                       "which leaves %.3f s for the first part's extract, each part's "
                       "rendezvous and the last part's swap" % (goal - wire) if wire < goal
                       else "already more than that: no TCP sender reaches 90 % here",
                       d["src_cpu_s"], 100 * d["src_cpu_s"] / goal, goal,
                       d["sink_cpu_s"]))
    return ("What bounds it, from this run: " + "; ".join(parts) + "." + cpu_txt + " Both daemons, the "
            "trainer and the sink stand-in share 2 cores: the capture's extract and checksum "
            "threads, the source's sends, the sink's receive and swaps and the "
            "kernel's TCP work for both ends all run on them, where the plain stream runs "
            "alone. A 100 Gbit/s link is out of reach for any TCP sender on this machine "
            "(the plain stream is the ceiling); a dense sync cannot finish before its last "
            "part is in, swapped and summed (DESIGN §2.3, §2.4).")


def _ms(x):
    return "%.0f" % x if isinstance(x, (int, float)) else "-"


def main(argv):
    """--plots [FILE]: draw docs/bench-*.png again from FILE (default
    docs/bench-plots.json), without a run."""
    if not argv or argv[0] != "--plots" or len(argv) > 2:
        sys.exit("usage: report.py --plots [docs/bench-plots.json]")
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")
    path = argv[1] if len(argv) == 2 else os.path.join(docs, PLOT_DATA)
    with open(path) as f:
        made = draw(json.load(f), os.path.dirname(os.path.abspath(path)))
    print("report: drew %s" % ", ".join(made))


if __name__ == "__main__":
    main(sys.argv[1:])
