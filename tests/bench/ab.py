#!/usr/bin/python3
"""Same-run A/B of two builds of dted, each in its own source tree.

    tests/bench/ab.py [--rounds N] [--prefix P ...] [--key K ...] BASE NEW -- CMD ...

CMD runs in each tree's root (B=build unless the environment sets B),
interleaved ABBA over N rounds each (default 3: A B B A A B), so a drift of
this shared machine's speed during the run falls on both builds alike.
Each tree runs its own scripts and its own binaries: the A/B compares two
commits as a user would run them, not one script against two daemons whose
control protocol may differ.

From each run's stdout, the lines that start with a P (--prefix may be
given more than once; default "bench ") are read as `word ... key=value
...`; a line's label is its words before the first key=value plus the
values of the --key keys (e.g. --key link: one row per link rate).
Per label and numeric key: the median of each build's runs and the ratio
new/base.  Every run's exit status and wall time are kept; one line sums
them up:

    ab: cmd=NAME rounds=N base_ok=N/N new_ok=N/N wall_base_s=W wall_new_s=W wall_ratio=R

and one line per label and key:

    ab: LABEL KEY base=X new=Y ratio=R

A run that fails is reported (its exit status and the tail of its output),
its numbers are left out, and the script exits 1.
"""

import os
import statistics
import subprocess
import sys
import time


def parse(line, prefix, keys):
    words = line[len(prefix):].split()
    lead = 0
    while lead < len(words) and "=" not in words[lead]:
        lead += 1
    label = [prefix.strip()] + words[:lead]
    kv = {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            kv[k] = v
    label += ["%s=%s" % (k, kv[k]) for k in keys if k in kv]
    nums = {}
    for k, v in kv.items():
        if k in keys:
            continue
        try:
            nums[k] = float(v)
        except ValueError:
            pass
    return " ".join(label), nums


def run_once(tree, cmd, prefixes, keys, env):
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    rows = {}
    for line in p.stdout.splitlines():
        for prefix in prefixes:
            if line.startswith(prefix):
                label, nums = parse(line, prefix, keys)
                rows.setdefault(label, {}).update(nums)
                break
    return p.returncode, wall, rows, p.stdout


def main(argv):
    rounds, prefixes, keys = 3, [], []
    args = list(argv)
    while args and args[0].startswith("--"):
        opt = args.pop(0)
        if opt == "--":
            break
        val = args.pop(0)
        if opt == "--rounds":
            rounds = int(val)
        elif opt == "--prefix":
            prefixes.append(val)
        elif opt == "--key":
            keys.append(val)
        else:
            sys.exit("ab.py: unknown option %s" % opt)
    if len(args) < 4 or args[2] != "--":
        sys.exit(__doc__)
    prefixes = prefixes or ["bench "]
    trees = {"base": os.path.abspath(args[0]), "new": os.path.abspath(args[1])}
    cmd = args[3:]
    env = dict(os.environ)
    env.setdefault("B", "build")
    order = []
    for r in range(rounds):
        order += ["base", "new"] if r % 2 == 0 else ["new", "base"]
    res = {"base": [], "new": []}
    failed = False
    for which in order:
        rc, wall, rows, out = run_once(trees[which], cmd, prefixes, keys, env)
        print("ab: run %s rc=%d wall_s=%.1f" % (which, rc, wall), flush=True)
        if rc != 0:
            failed = True
            print("ab: %s failed (rc %d); its output's tail:\n%s"
                  % (which, rc, "\n".join(out.splitlines()[-20:])), flush=True)
        res[which].append((rc, wall, rows if rc == 0 else {}))
    name = os.path.basename(cmd[-1]) if len(cmd) > 1 else cmd[0]
    ok = {w: sum(1 for rc, _, _ in res[w] if rc == 0) for w in res}
    wall = {w: statistics.median([x[1] for x in res[w]]) for w in res}
    print("ab: cmd=%s rounds=%d base_ok=%d/%d new_ok=%d/%d wall_base_s=%.1f wall_new_s=%.1f "
          "wall_ratio=%.3f" % (name, rounds, ok["base"], rounds, ok["new"], rounds,
                               wall["base"], wall["new"], wall["new"] / wall["base"]))
    labels = []
    for w in ("base", "new"):
        for _, _, rows in res[w]:
            for lab in rows:
                if lab not in labels:
                    labels.append(lab)
    for lab in labels:
        keys_here = []
        for w in ("base", "new"):
            for _, _, rows in res[w]:
                for k in rows.get(lab, {}):
                    if k not in keys_here:
                        keys_here.append(k)
        for k in keys_here:
            vals = {w: [rows[lab][k] for _, _, rows in res[w] if k in rows.get(lab, {})]
                    for w in res}
            if not vals["base"] or not vals["new"]:
                print("ab: %s %s only in %s" % (lab, k, "base" if vals["base"] else "new"))
                continue
            b, n = statistics.median(vals["base"]), statistics.median(vals["new"])
            ratio = ("%.3f" % (n / b)) if b else ("=" if n == b else "inf")
            print("ab: %s %s base=%.6g new=%.6g ratio=%s" % (lab, k, b, n, ratio))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
