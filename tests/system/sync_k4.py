#!/usr/bin/python3
"""Publish interval K = 4 without the union's false positives
(daemon/side_table.h), through a real dted on AdamW steps built like
adamw_fixtures.py's (tests/system/k4_lib.py: torch.optim.AdamW single-tensor
and foreach, and the FusedAdam forward; the trainer marks three steps and
publishes the fourth).

After every version the sink must hold RNE(θ_t) exactly, and no change may
go unsent (k4_lib checks both).  Phases, the same configurations each:
  off    [daemon] mark_table_size = 0: the union of the marks is sent
  on     the default cap: the false positives fall (per configuration, and
         to at most 1e-3 of the elements over all of them), the tables'
         memory is freed by the publishes (dted_mark_table_bytes back to 0)
  cap    a cap far below what the tables want: exact all the same, the
         elements past it are counted (over_cap) and sent as without
  wrong  the test build with DTE_TEST_HOOK=wrong-drop@3: version 3 withholds
         one element that did change (the drop rule broken once); the sink's
         checksum catches it, wait(3) reports it, version 4 goes dense and
         is exact again.
Prints
  sync-k4: fp_rate_union=R fp_rate_table=R cap_fp_rate=R table_bytes_per_element=B ...
"""

import sys

import harness  # sets ROOT and B, puts client/python on sys.path

harness.asan_reexec()

import k4_lib  # noqa: E402
from dte.checks import Checks  # noqa: E402

CONFIGS = [("torch-single", 1e-4, 0.01), ("torch-foreach", 1e-5, 0.1), ("fused", 1e-6, 0.0),
           ("torch-single", 1e-7, 0.0)]
VOCAB, HIDDEN = 512, 256          # a 131072-element embedding (+ one small layer)
TARGET = 1e-3


def total(res):
    el = sum(s["elements"] for s in res.values())
    return sum(s["fp"] for s in res.values()) / el if el else float("nan"), el


def main():
    c = Checks("sync-k4")
    log = lambda m: print(m, flush=True)  # noqa: E731
    off, moff, elements = k4_lib.run(CONFIGS, 0, VOCAB, HIDDEN, log=log, label="k4-off")
    on_rows = {}
    on, mon, _ = k4_lib.run(CONFIGS, None, VOCAB, HIDDEN, log=log, label="k4-on",
                            rows_out=on_rows)
    c.check(all(s["sparse"] == s["versions"] - 1 == 4 for s in list(off.values()) +
                list(on.values())), "every version after the first sparse, every sink exact "
            "after every version, no change unsent (both runs)")
    c.check(moff.get("kept", 0) == 0 and moff.get("peak_bytes", 0) == 0,
            "mark_table_size = 0: no table (%s)" % moff)
    for cfg in CONFIGS:
        a, b = off[cfg]["fp"], on[cfg]["fp"]
        c.check(b < a or a == 0, "%s lr=%g wd=%g: false positives %d -> %d" % (
            cfg[0], cfg[1], cfg[2], a, b))
        c.check(on[cfg]["changed"] == off[cfg]["changed"],
                "%s lr=%g: the same steps both runs (%d changes)" % (cfg[0], cfg[1],
                                                                      on[cfg]["changed"]))
    fu, _ = total(off)
    ft, _ = total(on)
    c.check(fu > 10 * TARGET / 4, "the union's false positives are there to remove (%.2e)" % fu)
    c.check(ft <= TARGET, "with the tables: %.2e of the elements sent unchanged (<= %g)"
            % (ft, TARGET))
    c.check(mon.get("not_sent", 0) == sum(off[k]["sent"] - on[k]["sent"] for k in CONFIGS),
            "dted_mark_table_elements_total{outcome=not_sent} = the fewer elements sent (%s)"
            % mon.get("not_sent"))
    c.check(mon.get("kept", 0) > 0 and mon.get("peak_bytes", 0) > 0 and
            mon.get("bytes_now", -1) == 0,
            "tables kept %d elements, peak %d bytes, all freed by the publishes" % (
                mon.get("kept", 0), mon.get("peak_bytes", 0)))
    # A cap far below the peak: the rest goes as the union, still exact.
    cap = int(mon["peak_bytes"] // 8)
    capped, mcap, _ = k4_lib.run(CONFIGS, cap, VOCAB, HIDDEN, log=log, label="k4-cap")
    fc, _ = total(capped)
    c.check(mcap.get("over_cap", 0) > 0 and mcap.get("peak_bytes", 0) <= cap,
            "cap %d bytes: %d first marks past it, peak %d" % (cap, mcap.get("over_cap", 0),
                                                                mcap.get("peak_bytes", 0)))
    c.check(ft <= fc <= fu, "capped: false positives between (%.2e <= %.2e <= %.2e)"
            % (ft, fc, fu))
    # The drop rule broken once: caught by the checksum, repaired densely.
    rows = {}
    wcfg = [CONFIGS[0]]
    k4_lib.run(wcfg, None, VOCAB, HIDDEN, log=log, label="k4-wrong", hook="wrong-drop@3",
               fault_version=3, rows_out=rows)
    r = {x["version"]: x for x in rows[CONFIGS[0]]}
    v3, v4 = r[3], r[4]
    # The same configuration and seed as the first of the `on` run: the
    # same steps, so the same elements to send but the one withheld.
    good = {x["version"]: x for x in on_rows[CONFIGS[0]]}[3]
    c.check(v3["changed"] == good["changed"] and v3["sent"] == good["sent"] - 1,
            "wrong-drop landed: version 3 sent %d, the same steps without the fault %d"
            % (v3["sent"], good["sent"]))
    c.check(not v3["checksum_ok"] and v3["wait_failed"] and v3["differs"],
            "the sink's checksum caught it (checksum_ok %s, wait failed %s, differs: %s)"
            % (v3["checksum_ok"], v3["wait_failed"], ", ".join(v3["differs"][:2])))
    c.check(v4["dense"] == 1 and v4["checksum_ok"] and not v4["differs"],
            "version 4 repaired densely and exact (%s)" % {k: v4[k] for k in ("dense",
                                                                               "checksum_ok")})
    print("sync-k4: fp_rate_union=%.2e fp_rate_table=%.2e cap_fp_rate=%.2e "
          "table_bytes_per_element=%.3f configs=%d elements=%d" % (
              fu, ft, fc, mon["peak_bytes"] / elements, len(CONFIGS), elements))
    sys.stdout.flush()
    c.finish()


if __name__ == "__main__":
    main()
