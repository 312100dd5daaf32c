#!/usr/bin/python3
"""docs/SUPPORTED.md against the code and the pins (issue 32, item 3).

The code lists what it supports itself: `dtectl plan --supported --json`
(daemon/layout/spec.c's model families, daemon/layout/desc.c's layout kinds
with their options and defaults, and the options it refuses).  This test
checks, both ways, that

  * every family in the code is a row of the doc's family table and every
    row is a family of the code, with the same architecture;
  * every source and sink layout is a row of the layout table (and back),
    with the same options and defaults; the refused options likewise;
  * every version in the doc's version table is the pin (`pkg==version`)
    in every scripts/ pin file the row names;
  * every test a row names exists, is in `make list-tests`' system tests,
    and mentions what the row is about;
  * README.md and docs/INTEGRATION.md link the doc;

and that the listing is what the code does: every family plans with exact
coverage from every source layout that needs no shard table into every
sink layout (a tiny config of that family made here, MoE at ep=2), and
every refused option is refused with its reason unless its value is 1.

Prints one line per mismatch and
`supported: families=N layouts=M versions=K mismatches=0`.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B = os.environ.get("B", "build")
DOC = os.path.join(ROOT, "docs", "SUPPORTED.md")
SCRIPTS = os.path.join(ROOT, "scripts")
TESTS = os.path.join(ROOT, "tests", "system")

mismatches = []


def mismatch(msg):
    mismatches.append(msg)
    print("FAIL " + msg)


def plan_tool():
    for p in (os.path.join(B, "bin", "dtectl"), os.path.join(B, "bin", "dte-plan")):
        if os.access(p, os.X_OK):
            return [p, "plan"] if p.endswith("dtectl") else [p]
    sys.exit("supported: neither dtectl nor dte-plan built under %s" % B)


def run(args):
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


# ------------------------------------------------------------ the doc's tables
def tables(text):
    """{header tuple: [row tuples]}, cells stripped of spaces and backticks."""
    out, lines, i = {}, text.splitlines(), 0

    def cells(line):
        return tuple(c.strip().replace("`", "") for c in line.strip().strip("|").split("|"))

    while i < len(lines):
        if (lines[i].startswith("|") and i + 1 < len(lines)
                and re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", lines[i + 1])):
            head, rows, i = cells(lines[i]), [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(cells(lines[i]))
                i += 1
            out[head] = rows
        else:
            i += 1
    return out


def table(tabs, first, second):
    for head, rows in tabs.items():
        if len(head) >= 2 and head[0] == first and head[1] == second:
            return head, rows
    mismatch("docs/SUPPORTED.md: no table with columns \"%s | %s\"" % (first, second))
    return None, []


def names(cell):
    """"a.py, b.sh (why)" -> ["a.py", "b.sh"]"""
    return re.findall(r"[A-Za-z0-9_.-]+\.(?:py|sh)\b", cell)


def pins(fname):
    got = {}
    with open(os.path.join(SCRIPTS, fname)) as f:
        for line in f:
            m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s#;]+)", line)
            if m:
                got[m.group(1).lower()] = m.group(2)
    return got


# ---------------------------------------------------------------- the checks
def data_files():
    """{model_type: [config file names under tests/data]}: a test that
    loads one tests that family."""
    out = {}
    for d, _, files in os.walk(os.path.join(ROOT, "tests", "data")):
        for f in files:
            if f.endswith(".json"):
                try:
                    with open(os.path.join(d, f)) as fh:
                        mt = json.load(fh).get("model_type")
                except (ValueError, AttributeError, OSError):
                    continue
                if isinstance(mt, str):
                    out.setdefault(mt, []).append(f)
    return out


def check_tested_by(what, subjects, cell, registered):
    """subjects: names any of which the test must mention (the first is
    the one reported)."""
    tests = names(cell)
    if not tests:
        mismatch("%s: \"Tested by\" names no test" % what)
    for t in tests:
        path = os.path.join(TESTS, t)
        if not os.path.exists(path):
            mismatch("%s: tested by %s, which is not in tests/system" % (what, t))
            continue
        if "tests/system/" + t not in registered:
            mismatch("%s: tested by %s, which `make list-tests` does not run" % (what, t))
        if t == os.path.basename(__file__):
            continue   # this test covers every family and layout by construction
        with open(path) as f:
            text = f.read().lower()
        if not any(sub.lower() in text for sub in subjects):
            mismatch("%s: tested by %s, which never mentions \"%s\"" % (what, t, subjects[0]))


def registered_tests():
    env = dict(os.environ)
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(k, None)
    # The plain pass's list: the real-engine tests run there only (not
    # under SANITIZE=1, which this test may itself be running in).
    p = subprocess.run(["make", "--no-print-directory", "-s", "B=" + B, "SANITIZE=0", "list-tests"],
                       cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=120)
    if p.returncode:
        mismatch("make list-tests failed: %s" % p.stderr.strip()[-300:])
    return {ln.split(None, 1)[1] for ln in p.stdout.splitlines() if ln.startswith("system ")}


def kind_options(k):
    if k["file"]:
        return "FILE"
    return ",".join("%s=%d" % (key, val) for key, val in k["keys"].items())


def tiny_config(fam):
    cfg = {"architectures": [fam["architecture"]], "model_type": fam["model_type"],
           "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "vocab_size": 256, "tie_word_embeddings": False}
    if fam["moe"]:
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   decoder_sparse_step=1)
    return cfg


def desc(kind, opts):
    return "%s:%s" % (kind["name"], ",".join("%s=%d" % kv for kv in opts.items()
                                             if kv[0] in kind["keys"]))


def check_behaviour(tool, code, tmp):
    """Every family x every plain source x every sink: coverage exact.
    Every refused key: refused above 1, accepted at 1."""
    plain_src = [k for k in code["sources"] if not k["sharded"] and not k["file"]]
    plain_sink = [k for k in code["sinks"] if not k["file"]]
    plans = 0
    for fam in code["families"]:
        path = os.path.join(tmp, fam["model_type"] + ".json")
        with open(path, "w") as f:
            json.dump(tiny_config(fam), f)
        ep = {"ep": 2} if fam["moe"] else {}
        for s in plain_src:
            for k in plain_sink:
                sd, kd = desc(s, dict(tp=2, dp=2, **ep)), desc(k, dict(tp=2, **ep))
                rc, out, err = run(tool + ["--model", path, "--source", sd, "--sink", kd])
                plans += 1
                if rc or "coverage: exact" not in out.splitlines():
                    mismatch("%s %s -> %s: not exact (exit %d): %s"
                             % (fam["model_type"], sd, kd, rc, err.strip()[-300:]))
    fam = code["families"][0]
    path = os.path.join(tmp, fam["model_type"] + ".json")
    for r in code["refused"]:
        for side, k in (("--source", plain_src[0]), ("--sink", plain_sink[0])):
            other = ("--sink", desc(plain_sink[0], {})) if side == "--source" \
                else ("--source", desc(plain_src[0], {}))
            for val, want in ((2, False), (1, True)):
                d = "%s:%s=%d" % (k["name"], r["key"], val)
                rc, out, err = run(tool + ["--model", path, side, d, other[0], other[1]])
                if want and rc:
                    mismatch("%s %s: refused (exit %d): %s" % (side, d, rc, err.strip()))
                if not want and (rc != 1 or "not supported" not in err or r["what"] not in err):
                    mismatch("%s %s: not refused with \"%s is not supported\" (exit %d): %s"
                             % (side, d, r["what"], rc, err.strip()))
    return plans


def main():
    tool = plan_tool()
    rc, out, err = run(tool + ["--supported", "--json"])
    if rc:
        sys.exit("supported: %s --supported --json: exit %d: %s" % (" ".join(tool), rc, err))
    code = json.loads(out)
    with open(DOC) as f:
        tabs = tables(f.read())
    registered = registered_tests()
    data = data_files()

    # Families, both ways.
    _, rows = table(tabs, "Family", "Architecture")
    doc_fams = {r[0]: r for r in rows}
    code_fams = {f["model_type"]: f for f in code["families"]}
    for name in sorted(set(code_fams) - set(doc_fams)):
        mismatch("family %s: in the code (spec.c), not in docs/SUPPORTED.md" % name)
    for name in sorted(set(doc_fams) - set(code_fams)):
        mismatch("family %s: in docs/SUPPORTED.md, not in the code (spec.c)" % name)
    for name in sorted(set(doc_fams) & set(code_fams)):
        r = doc_fams[name]
        if r[1] != code_fams[name]["architecture"]:
            mismatch("family %s: architecture %s in the doc, %s in the code"
                     % (name, r[1], code_fams[name]["architecture"]))
        check_tested_by("family " + name, [name, r[1]] + data.get(name, []), r[-1], registered)

    # Layouts, both ways.
    _, rows = table(tabs, "Side", "Layout")
    doc_kinds = {(r[0], r[1]): r for r in rows}
    code_kinds = {("source", k["name"]): k for k in code["sources"]}
    code_kinds.update({("sink", k["name"]): k for k in code["sinks"]})
    for key in sorted(set(code_kinds) - set(doc_kinds)):
        mismatch("%s layout %s: in the code (desc.c), not in docs/SUPPORTED.md" % key)
    for key in sorted(set(doc_kinds) - set(code_kinds)):
        mismatch("%s layout %s: in docs/SUPPORTED.md, not in the code (desc.c)" % key)
    for key in sorted(set(doc_kinds) & set(code_kinds)):
        r, want = doc_kinds[key], kind_options(code_kinds[key])
        if r[2] != want:
            mismatch("%s layout %s: options %s in the doc, %s in the code" % (key + (r[2], want)))
        check_tested_by("%s layout %s" % key, [key[1]], r[-1], registered)

    # Refused options, both ways.
    _, rows = table(tabs, "Option", "What")
    doc_ref = {r[0]: r[1] for r in rows}
    code_ref = {r["key"]: r["what"] for r in code["refused"]}
    if doc_ref != code_ref:
        mismatch("refused options: %s in the doc, %s in the code" % (doc_ref, code_ref))

    # Versions against the pin files.
    _, rows = table(tabs, "Package", "Version")
    for r in rows:
        pkg, ver, files = r[0], r[1], re.findall(r"[A-Za-z0-9_.-]+\.txt", r[2])
        if not files:
            mismatch("%s: no pin file named" % pkg)
        for fname in files:
            if not os.path.exists(os.path.join(SCRIPTS, fname)):
                mismatch("%s: pin file scripts/%s does not exist" % (pkg, fname))
                continue
            got = pins(fname).get(pkg.lower())
            if got != ver:
                mismatch("%s: %s in docs/SUPPORTED.md, %s in scripts/%s"
                         % (pkg, ver, "not pinned" if got is None else got, fname))
        check_tested_by(pkg, [pkg.split("-")[0]], r[-1], registered)

    # Linked from where users look.
    for f in ("README.md", os.path.join("docs", "INTEGRATION.md")):
        with open(os.path.join(ROOT, f)) as fh:
            if "SUPPORTED.md" not in fh.read():
                mismatch("%s does not link docs/SUPPORTED.md" % f)

    with tempfile.TemporaryDirectory() as tmp:
        plans = check_behaviour(tool, code, tmp)
    print("plans: %d exact, refused options: %d" % (plans, len(code["refused"])))
    print("supported: families=%d layouts=%d versions=%d mismatches=%d"
          % (len(doc_fams), len(doc_kinds), len(rows), len(mismatches)))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
