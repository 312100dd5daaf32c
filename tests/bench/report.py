"""docs/BENCHMARKS.md and docs/bench-*.png from one run's results."""

import os
import statistics
import subprocess
import tempfile


def _plot(script, data, out):
    with tempfile.TemporaryDirectory(prefix="dte-bench-plot-") as tmp:
        paths = []
        for i, rows in enumerate(data):
            p = os.path.join(tmp, "d%d.dat" % i)
            with open(p, "w") as f:
                for r in rows:
                    f.write(" ".join(str(x) for x in r) + "\n")
            paths.append(p)
        text = "set terminal pngcairo size 800,500\nset output '%s'\n" % out + script % tuple(paths)
        r = subprocess.run(["gnuplot"], input=text, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError("gnuplot: %s" % r.stderr)


def plots(res, docs):
    made = []
    rows = res["codec"]["rows"]
    _plot("set logscale x\nset xlabel 'learning rate'\nset ylabel 'bytes per changed element'\n"
          "set y2label 'changed %%'\nset y2tics\nset logscale y2\nset key top center\n"
          "set title 'Real torch AdamW step: encoded bytes per changed BF16 element'\n"
          "plot '%s' u 1:2 w lp t 'same-cluster, raw', '' u 1:3 w lp t 'same-cluster, zstd 1', "
          "'' u 1:4 w lp t 'storage (zstd)', '' u 1:5 axes x1y2 w lp dt 2 t 'changed %% (right)',"
          " 2.5 w l dt 3 t 'storage goal 2.5'\n",
          [[(r["lr"], r["bpc_cluster_raw"], r["bpc_cluster_zstd"], r["bpc_storage"],
             r["changed_pct"]) for r in rows]], os.path.join(docs, "bench-codec.png"))
    made.append("bench-codec.png")
    e2e = res.get("e2e")
    if e2e:
        _plot("set logscale xy\nset xlabel 'link (Gbit/s)'\nset ylabel 'seconds to applied'\n"
              "set xtics (1, 10, 100)\nset key top right\n"
              "set title 'One version end to end, %d elements'\n" % e2e["elements"] +
              "plot '%s' u 1:2 w lp t 'dense (fresh sink)', '' u 1:3 w lp t 'sparse (AdamW "
              "inversion)', '' u 1:4 w lp dt 2 t 'floor max(scan, wire)'\n",
              [[(r["gbit"], r["dense_s"], r["sparse_s"], r["floor_s"]) for r in e2e["links"]]],
              os.path.join(docs, "bench-e2e.png"))
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
    applies = [m["apply_ms"] for r in e2e["links"] for m in r["sparse"]
               if m.get("apply_ms") is not None]
    if not flc or not applies:
        return None
    ap = statistics.median(applies) / 1e3
    chg = statistics.median(m["changed"] / max(m["elements"], 1)
                            for r in e2e["links"] for m in r["sparse"])
    lines = 1 - (1 - chg) ** 32     # BF16 elements per 64-byte line
    return ("What bounds the stall and end-to-end ratios here, from this run's own numbers: "
            "the trainer may step only once the capture has read θ, m and v and mixed every "
            "element's BF16 into the expected checksum (DESIGN §2.3: per version, over the "
            "whole expected content, computed by the sender from the source memory), so the "
            "stall cannot go below detect + checksum = %.3f s, %.2f of the detect floor (the "
            "stall goal is 1.1); and a version reaches the sink's memory as a whole, after its "
            "last part (§2.4: no torn versions; the scatter, median %.0f ms over the sparse "
            "versions, touches %.0f%% of the sink's cache lines at a median %.2f%% changed), "
            "so on this machine a sync whose transfer hid entirely under the capture still "
            "takes at least %.3f s, %.2f of the floor (the e2e goal is 1.25). Applying parts "
            "as they arrive into a sink parked at its safe point, with the payload's values "
            "swapped for the old ones so a failed version can be rolled back, would take the "
            "apply off that sum; the checksum stays. The checksum is compute "
            "(splitmix64 per element, about %.0f%% of the detect's time on these 2 cores, "
            "where the detect, at %.2f of the stream, leaves no memory stall for the mix to "
            "hide in); on a GPU the same kernels are bound by HBM reads "
            "(`make bench-gpu`)." % (
                flc, flc / fl, ap * 1e3, 100 * lines, 100 * chg, flc + ap, (flc + ap) / fl,
                100.0 * (flc - fl) / fl, sc["ratio"]))


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
    w("Whole run: %.0f s." % res["elapsed_s"])
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
    w("| storage bytes per changed element, lr 1e-6 | %.2f | ≤ 2.5 | %s |" % (
        row["bpc_storage"], "yes" if row["bpc_storage"] <= 2.5 else "no"))
    if e2e:
        for r in e2e["links"]:
            w("| e2e floor ratio at %d Gbit/s | %.2f | ≤ 1.25 | %s |" % (
                r["gbit"], r["floor_ratio"], "yes" if r["floor_ratio"] <= 1.25 else "no"))
        st = e2e["stall_s"] / sc.get("floor_s", sc["detect_s"])
        w("| trainer stall / scan floor | %.2f | ≤ 1.1 | %s |" % (st, "yes" if st <= 1.1 else "no"))
        red = 100 * (1 - e2e["peak_mb"] / e2e["snapshot_mb"])
        w("| daemon memory reduction vs 2 B/element snapshot | %.1f %% | ≥ 87 %% | %s |" % (
            red, "yes" if red >= 87 else "no"))
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
      "the next step's changed BF16 elements (exactly those whose rounding changed) are "
      "encoded. Same-cluster = the wire codec of gpu/codec.h as the source daemon frames a "
      "remote pair (zstd level 1) or a same-node pair (raw); storage = `dte-storage write` "
      "(daemon/storage chunk codec), size from `dte-storage ls`. Values included; dense = "
      "2 B/element." % (cd["elements"], cd["tensors"], cd["warm"]))
    w("")
    w("| lr | changed % | same-cluster raw B/chg | same-cluster zstd B/chg | storage B/chg "
      "| storage / dense |")
    w("|---|---|---|---|---|---|")
    for r in cd["rows"]:
        w("| %g | %.3f | %.3f | %.3f | %.3f | %.5f |" % (
            r["lr"], r["changed_pct"], r["bpc_cluster_raw"], r["bpc_cluster_zstd"],
            r["bpc_storage"], r["storage"] / r["dense"]))
    w("")
    w("![codec](bench-codec.png)")
    w("")
    if not e2e:
        w("## End to end, stall, memory")
        w("")
        w("Not measured in this run: the end-to-end figures need root for network namespaces.")
        w("Snapshot-diff detect cost: `%s`: %s" % (res["snapdet"]["cmd"], res["snapdet"]))
    else:
        write_e2e(w, res, e2e, snap, sc)
    w("")
    w("## Exact commands")
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
    w("Plots: %s." % ", ".join("docs/" + p for p in made))
    with open(os.path.join(docs, "BENCHMARKS.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def write_e2e(w, res, e2e, snap, sc):
    n = e2e["elements"]
    w("## End to end over shaped links")
    w("")
    w("Source daemon and sink daemon in two network namespaces joined by one veth pair, tbf "
      "at the link rate on both ends; UCX over TCP. The source holds a Qwen3-shaped model of "
      "%d elements (≥ 2^28; FP32 θ, m, v = %.1f GiB in memfds) updated by torch AdamW "
      "(lr 1e-6, Gaussian gradients) in place; the sink is one SGLang tp=1 BF16 copy "
      "(%.2f GiB). Per link: a fresh sink attaches, so the next version goes dense through "
      "dted's own dense path (what a broadcast-based system sends), then three sparse versions "
      "(median shown). Time = publish call until `wait` returns (sink applied, checksum "
      "verified). Floor = max(scan, wire) with scan = bench_scan's detect time at this "
      "element count (%.3f s) and wire = sparse bytes at the link rate. The dense and sparse "
      "times are for consecutive versions of the same run (the same model, one step apart), "
      "not literally the same version (dted has no forced resync yet)." % (
          n, 12 * n / 2**30, 2 * n / 2**30, sc.get("floor_s", sc["detect_s"])))
    w("")
    w("| link Gbit/s | dense s | dense bytes | sparse s | sparse bytes | changed % | wire s "
      "| floor s | floor ratio | speedup | capture ms | transfer ms | apply ms |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in e2e["links"]:
        s0 = r["sparse"][-1]
        w("| %d | %.3f | %d | %.3f | %d | %.3f | %.3f | %.3f | %.2f | %.2f | %s | %s | %s |" % (
            r["gbit"], r["dense_s"], r["dense"]["bytes"], r["sparse_s"], r["sparse_bytes"],
            100.0 * s0["changed"] / max(s0["elements"], 1), r["wire_s"], r["floor_s"],
            r["floor_ratio"], r["speedup"], _ms(s0["capture_ms"]), _ms(s0["transfer_ms"]),
            _ms(s0["apply_ms"])))
    w("")
    w("Link rate reached by the dense payload (its bytes over the source's capture→staged "
      "transfer time): %s. Where that is far below the setting, the link was not the limit. "
      "Sparse time is mostly capture: publish → answer, the one-pass detect over every "
      "entry (entries of at most 2^24 elements) with the expected checksum of every "
      "element, on both cores; payload parts of 4 MiB go out while later entries are still "
      "detected, COUNTS last (payloads raw, zstd_level 0). Then the tail of the transfer and "
      "the sink's apply: a scatter straight from the payload bytes that also sums the "
      "checksum change (a full verification pass every 16 versions and after dense ones). "
      "Both daemons, the trainer and the sink stand-in share this machine's 2 cores, so the "
      "sink's receive and the kernel's TCP work run on the cores the detect uses; two "
      "machines would not." % (
          ", ".join("%d Gbit/s → %s" % (r["gbit"], _rate(r["dense"])) for r in e2e["links"])))
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
      "over the whole expected content, so every element's BF16 is mixed (splitmix64; on this "
      "CPU about as much compute per element as the detect itself). Against detect + checksum "
      "as bench_scan measures it (%s s) the ratio is %s.%s" % (
          e2e["stall_s"], fl, e2e["stall_s"] / fl, "%.3f" % flc if flc else "-",
          "%.2f" % (e2e["stall_s"] / flc) if flc else "-", memfd_note(res, e2e["stall_s"])))
    w("")
    b = bounds(res)
    if b:
        w(b)
        w("")
    w("## Daemon memory")
    w("")
    w("Peak private anonymous memory (RssAnon sampled every 10 ms; the memfds shared with the "
      "clients are excluded) during the sparse versions: source daemon %.0f MiB, sink daemon "
      "%.0f MiB, together %.0f MiB, against a snapshot-keeping baseline's BF16 copy of the "
      "previous version, 2 B/element = %.0f MiB (reduction %.1f %%). VmHWM (peak RSS "
      "including mapped client memory and the dense versions): source %s MiB, sink %s MiB." % (
          e2e["peak_src_mb"], e2e["peak_sink_mb"], e2e["peak_mb"], e2e["snapshot_mb"],
          100 * (1 - e2e["peak_mb"] / e2e["snapshot_mb"]), fmt_mb(e2e["hwm"]["source"]),
          fmt_mb(e2e["hwm"]["sink"])))
    w("")
    w("## AdamW inversion vs snapshot diff (`detect = snapshot`)")
    w("")
    sd = res["snapdet"]
    w("The baseline PULSE- and slime-style systems use: keep the BF16 version the sink holds "
      "and compare (daemon/job_snapshot.c). It needs no optimizer state and flags exactly the "
      "elements whose rounding changed, but holds 2 B/element in the daemon for the job's "
      "life (plus 2 B/element while a scan runs). `%s` (one flat entry, a step perturbing "
      "every element by 1e-4 relative):" % sd["cmd"])
    w("")
    a = next((r for r in e2e["links"] if r["gbit"] == 10), e2e["links"][0])
    s0 = a["sparse"][-1]
    w("| detect | detect time s (this element count) | kept by the daemon MiB | source daemon "
      "peak MiB (sparse) | elements flagged per version |")
    w("|---|---|---|---|---|")
    w("| adamw (inversion) | %.3f (bench_scan) | 0 | %.0f | %d (%.2f %%, incl. guard band) |" % (
        sc["detect_s"], max(m["src_anon"] for m in a["sparse"]) / 2**20, s0["changed"],
        100.0 * s0["changed"] / max(s0["elements"], 1)))
    w("| snapshot (diff) | %.3f (bench_snapshot) | %s | %.0f + %s = %.0f (estimated) | exactly "
      "the changed ones (%s in its synthetic step) |" % (
          float(sd["scan_s"]), sd["kept_mb"], max(m["src_anon"] for m in a["sparse"]) / 2**20,
          sd["kept_mb"], max(m["src_anon"] for m in a["sparse"]) / 2**20 + float(sd["kept_mb"]),
          sd["changed"]))
    w("")
    w("Payload bytes per changed element are the codec table's: both modes send positions "
      "and values in the same codec; AdamW inversion also sends the guard-band elements it "
      "cannot prove unchanged.")
    if not snap:
        w("")
        w("End to end with `detect = snapshot` was not measured in this run: the job option is "
          "not wired into the daemon's capture yet (see the report of issue 8).")
        return
    s = snap["links"][0]
    w("")
    w("End to end at %d Gbit/s, same model:" % s["gbit"])
    w("")
    w("| detect | sparse s | stall s | sparse bytes | flagged per version | source daemon "
      "MiB | sink daemon MiB |")
    w("|---|---|---|---|---|---|---|")
    for name, r in (("adamw", a), ("snapshot", s)):
        w("| %s | %.3f | %.3f | %d | %d | %.0f | %.0f |" % (
            name, r["sparse_s"], r["stall_s"], r["sparse_bytes"], r["sparse"][-1]["changed"],
            max(m["src_anon"] for m in r["sparse"]) / 2**20,
            max(m["sink_anon"] for m in r["sparse"]) / 2**20))


def _rate(m):
    t = m.get("transfer_ms")
    if not isinstance(t, (int, float)) or t <= 0:
        return "-"
    return "%.2f Gbit/s" % (m["bytes"] * 8 / (t / 1e3) / 1e9)


def _ms(x):
    return "%.0f" % x if isinstance(x, (int, float)) else "-"
