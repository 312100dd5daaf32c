#!/usr/bin/python3
"""The production dted carries no test-hook code (issue 17).

Fault injection (tests/faults/testhook.c, testhook_decor.c) is linked only into
the test build, $B/tests/dted-faults.  This checks, for the production
daemon $B/bin/dted (or the binaries named with --binary, such as the
packaged /usr/sbin/dted that tests/system/packaging.sh extracts):

  symbols  nm (and nm -D): no symbol named like the test hooks
           (testhook, test_hook) and none of the global symbols that the
           test-hook objects define;
  strings  its read-only data holds neither "DTE_TEST_HOOK" nor
           "test hook" nor any fault name of testhook.c's table (as a
           word: "dup" in "strdup" is not one);
  runtime  (the build's dted only) started with DTE_TEST_HOOK set, once
           malformed and once well formed, it comes up and answers, and
           says nothing of a test hook: it does not read the variable;
  getenv   every environment variable production may read is one of
           PROD_ENV: each getenv()/secure_getenv() in the daemon's sources
           (daemon/, gpu/, proto/; the test-hook sources of faults.mk's
           TESTHOOK_SRCS aside) names a PROD_ENV variable as a literal,
           and the binary's read-only data holds no DTE_*/DTC_* name
           outside PROD_ENV, so none of the test builds' variables
           (DTE_TEST_HOOK, DTE_STORAGE_HOOK, ...).  A new getenv in
           production fails here until it is added to PROD_ENV with its
           reason.

Each check has its positive control on the test build, which must carry
every such symbol and string, refuse the malformed spec and arm the good
one: a check that finds nothing there could not fail.  Prints
    prod-hooks: binary=... hook_symbols=0 hook_strings=0 test_build_symbols=N ...
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "system"))

import harness  # noqa: E402  (sets ROOT and B)

B, ROOT = harness.B, harness.ROOT
TEST_BUILD = harness.DTED_FAULTS
HOOK_OBJS = [os.path.join(B, "obj", "tests", "faults", n)
             for n in ("testhook.o", "testhook_decor.o", "testhook_storage.o")]
SYMBOL_RE = re.compile(r"testhook|test_hook", re.I)
FIXED_STRINGS = ["DTE_TEST_HOOK", "test hook", "DTE_STORAGE_HOOK", "dte-storage hook"]
# Every environment variable a production binary may read, and why.
PROD_ENV = {
    "JOURNAL_STREAM": "daemon/log.c: log to the systemd journal when started by it",
    "DTE_PEER_DEBUG": "daemon/peer/peer_base.c: the peer layer's debug lines",
    "DTE_CUDA_PLUGIN": "gpu/backend.c: where the dlopen()ed CUDA backend is",
    "DTC_CPU_SIMD": "gpu/cpu.c, daemon/job_snapshot.c: the CPU backend's SIMD level",
    "DTC_CPU_THREADS": "gpu/cpu.c: the CPU backend's threads",
}
# Where the production daemon's code is (what the source scan reads).
PROD_SRC_DIRS = ["daemon", "gpu", "proto"]
ENV_NAME_RE = re.compile(r"^(?:DTE|DTC)_[A-Z0-9][A-Z0-9_]*$")
GETENV_RE = re.compile(r"\b(?:secure_)?getenv\s*\(\s*([^)]*)\)")

failures = []


def need(ok, what):
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        failures.append(what)
    return ok


def fault_names():
    """The fault names of testhook.c's table ({ "name", F_... })."""
    with open(os.path.join(ROOT, "tests", "faults", "testhook.c")) as f:
        return re.findall(r'\{\s*"([a-z][a-z0-9-]*)",\s*F_[A-Z0-9_]+\s*\}', f.read())


def testhook_srcs():
    """faults.mk's TESTHOOK_SRCS: the sources only the test builds link."""
    with open(os.path.join(ROOT, "tests", "faults", "faults.mk")) as f:
        m = re.search(r"^TESTHOOK_SRCS\s*:?=\s*(.*)$", f.read(), re.M)
    return set(m.group(1).split()) if m else set()


def getenv_calls():
    """(path, line, argument) of every getenv()/secure_getenv() call in the
    daemon's C sources and the test hooks' (TESTHOOK_SRCS), comments
    dropped."""
    out = []
    paths = [os.path.join(ROOT, p) for p in sorted(testhook_srcs())]
    for d in PROD_SRC_DIRS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, d)):
            paths += [os.path.join(dirpath, fn) for fn in sorted(files)
                      if fn.endswith((".c", ".h"))]
    for path in paths:
        with open(path, errors="replace") as f:
            text = f.read()
        text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        for m in GETENV_RE.finditer(text):
            out.append((os.path.relpath(path, ROOT), text.count("\n", 0, m.start()) + 1,
                        m.group(1).strip()))
    return out


def env_check(prods):
    """The getenv check (see the docstring).  Returns (test-only names,
    {prod: names outside PROD_ENV in its read-only data})."""
    tsrcs = testhook_srcs()
    need(tsrcs, "faults.mk's TESTHOOK_SRCS parsed (%s)" % " ".join(sorted(tsrcs)))
    test_env, bad = set(), []
    calls = getenv_calls()
    for path, line, arg in calls:
        m = re.fullmatch(r'"([A-Za-z0-9_]+)"', arg)
        if path in tsrcs:
            if m:
                test_env.add(m.group(1))
            continue
        if not m:
            bad.append("%s:%d: getenv(%s) (not a literal name)" % (path, line, arg))
        elif m.group(1) not in PROD_ENV:
            bad.append("%s:%d: getenv(\"%s\") (not in PROD_ENV)" % (path, line, m.group(1)))
    need(not bad, "production sources read only PROD_ENV variables (%d getenv calls%s)"
         % (len(calls), ": " + "; ".join(bad) if bad else ""))
    need({"DTE_TEST_HOOK", "DTE_STORAGE_HOOK"} <= test_env and not test_env & set(PROD_ENV),
         "the test-hook sources read %s, none of them in PROD_ENV" % " ".join(sorted(test_env)))
    # Positive control: the test build's data names every test variable.
    tnames = {x for x in rodata_strings(TEST_BUILD) if ENV_NAME_RE.match(x)}
    need(test_env <= tnames, "test build %s names every test variable in its data (%s)"
         % (os.path.relpath(TEST_BUILD, ROOT), " ".join(sorted(tnames & test_env))))
    found = {}
    for prod in prods:
        names = {x for x in rodata_strings(prod) if ENV_NAME_RE.match(x)}
        found[prod] = sorted(names - set(PROD_ENV))
        need(not found[prod], "%s: every DTE_*/DTC_* name in its data is in PROD_ENV (%s)%s"
             % (prod, " ".join(sorted(names)),
                "; not: %s" % " ".join(found[prod]) if found[prod] else ""))
    return test_env, found


def symbols(path):
    """Every symbol the binary defines (static and dynamic tables).  An
    undefined weak reference is no code: the engine's `job_ext_builtin`
    (daemon/job_ext.h) is one in the production dted, NULL there, and
    defined only by the test build's testhook_decor.c."""
    names = set()
    for args in (["nm", "-a", "--defined-only"], ["nm", "-D", "--defined-only"]):
        r = subprocess.run(args + [path], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            parts = line.split()
            if parts:
                names.add(parts[-1])
    return names


def hook_globals():
    """The global symbols the test-hook objects define."""
    out = set()
    for o in HOOK_OBJS:
        r = subprocess.run(["nm", "--defined-only", "-g", o], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("nm %s: %s" % (o, r.stderr.strip()))
        out |= {line.split()[-1] for line in r.stdout.splitlines() if line.split()}
    return out


def rodata_strings(path):
    """The NUL-terminated strings of the binary's read-only data."""
    with tempfile.NamedTemporaryFile() as t:
        r = subprocess.run(["objcopy", "-O", "binary", "--only-section=.rodata", path, t.name],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("objcopy %s: %s" % (path, r.stderr.strip()))
        data = open(t.name, "rb").read()
    if not data:
        raise RuntimeError("%s: no .rodata" % path)
    return [s.decode("latin-1") for s in data.split(b"\0") if s]


def string_hits(strs, needles):
    """needle -> how many strings hold it (fault names as whole words)."""
    hits = {}
    for n in needles:
        if n in FIXED_STRINGS:
            rx = re.compile(re.escape(n))
        else:
            rx = re.compile(r"(?<![A-Za-z0-9_-])%s(?![A-Za-z0-9_-])" % re.escape(n))
        hits[n] = sum(1 for s in strs if rx.search(s))
    return hits


def run_with_hook(binary, spec, tmp, tag):
    """Start binary with DTE_TEST_HOOK=spec (the fixture's hook_check off:
    the production dted gets the variable on purpose, to show it ignores
    it; no --peer-listen, as a packaged dted starts).  Returns (came_up,
    answered, exit status or None, log text)."""
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    dm = harness.Daemon(d, tag, binary=binary, hook=spec, hook_check=False, log_level="debug",
                        peer_listen=False,
                        env={"DTE_TEST_HOOK_RELEASE": os.path.join(d, "release")})
    up = answered = False
    try:
        dm.start(timeout=10)
        up = True
        r = dm.ctl("status", check=False, timeout=10)
        answered = r.returncode == 0 and "version:" in r.stdout
    except RuntimeError:
        pass
    finally:
        rc = dm.stop() if dm.proc else None
    return up, answered, rc, dm.log_text()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", action="append",
                    help="production binary to check (default $B/bin/dted, with the runtime "
                    "check, and $B/bin/dte-storage); may be repeated; strings, symbols "
                    "and environment names only")
    args = ap.parse_args()
    # By default the build's dted (with the runtime check) and dte-storage
    # (the other binary that links the storage writer).
    prods = args.binary or [harness.DTED, os.path.join(ROOT, B, "bin", "dte-storage")]

    for p in [TEST_BUILD] + prods + HOOK_OBJS:
        if not os.path.exists(p):
            print("prod-hooks: %s is missing: run make first" % p)
            return 1
    names = fault_names()
    need(len(names) >= 7, "testhook.c's fault table parsed (%d names: %s)"
         % (len(names), " ".join(names)))
    needles = FIXED_STRINGS + names
    globs = hook_globals()
    need("testhook_init" in globs and "testhook_send" in globs,
         "the test-hook objects define the hooks (%d global symbols)" % len(globs))

    # Positive control: the test build carries all of it.
    tsyms = symbols(TEST_BUILD)
    t_hook_syms = sorted(s for s in tsyms if SYMBOL_RE.search(s))
    t_missing = sorted(globs - tsyms)
    need(t_hook_syms and not t_missing,
         "test build %s: %d hook symbols, every test-hook global present%s"
         % (os.path.relpath(TEST_BUILD, ROOT), len(t_hook_syms),
            " (missing %s)" % t_missing if t_missing else ""))
    thits = string_hits(rodata_strings(TEST_BUILD), needles)
    t_absent = [n for n, c in thits.items() if not c]
    need(not t_absent, "test build carries every hook string (%d strings%s)"
         % (sum(thits.values()), "; absent: %s" % t_absent if t_absent else ""))

    test_env, env_found = env_check(prods)
    result = 0
    for prod in prods:
        psyms = symbols(prod)
        bad_syms = sorted({s for s in psyms if SYMBOL_RE.search(s)} | (globs & psyms))
        need(not bad_syms, "%s: no test-hook symbols%s" % (prod, (": %s" % bad_syms[:10])
                                                          if bad_syms else ""))
        phits = string_hits(rodata_strings(prod), needles)
        bad_strs = {n: c for n, c in phits.items() if c}
        need(not bad_strs, "%s: no test-hook strings%s" % (prod, (": %s" % bad_strs)
                                                          if bad_strs else ""))
        line = ("prod-hooks: binary=%s hook_symbols=%d hook_strings=%d test_build_symbols=%d "
                "test_build_strings=%d" % (os.path.relpath(prod, ROOT) if prod.startswith(ROOT)
                                           else prod, len(bad_syms), sum(bad_strs.values()),
                                           len(t_hook_syms), sum(thits.values())))
        line += " test_env_names=%d other_env_names=%d" % (
            len(test_env), len(env_found[prod]))
        if args.binary is None and prod == harness.DTED:
            line += " env_ignored=%d" % runtime_check(prod)
        print(line)
    if failures:
        print("FAILED: %s" % "; ".join(failures))
        result = 1
    return result


def runtime_check(prod):
    """DTE_TEST_HOOK, malformed or armed, changes nothing in prod; the test
    build refuses the first and arms the second.  Returns 1 when prod
    ignored both."""
    tmp = tempfile.mkdtemp(prefix="dte-prod-hooks-")
    try:
        return runtime_checks(prod, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def runtime_checks(prod, tmp):
    ignored = 1
    for spec, tag in (("die-in-counts@x", "malformed"), ("capture-stall@1", "armed")):
        up, answered, rc, text = run_with_hook(prod, spec, tmp, "prod-" + tag)
        said = [x for x in text.splitlines() if "test hook" in x.lower()]
        ok = need(up and answered and rc == 0 and not said,
                  "production dted with DTE_TEST_HOOK=%s: up, answers, exits 0, says nothing "
                  "of a hook (exit %s%s)" % (spec, rc, "; said: %s" % said[0] if said else ""))
        ignored &= ok
    up, answered, rc, text = run_with_hook(TEST_BUILD, "die-in-counts@x", tmp, "test-malformed")
    need(not up and rc not in (0, None) and 'test hook: refusing DTE_TEST_HOOK="die-in-counts@x"'
         in text, "test build refuses DTE_TEST_HOOK=die-in-counts@x (exit %s)" % rc)
    up, answered, rc, text = run_with_hook(TEST_BUILD, "capture-stall@1", tmp, "test-armed")
    need(up and answered and rc == 0 and "test hook armed: capture-stall@1" in text,
         "test build arms DTE_TEST_HOOK=capture-stall@1 and exits 0 (exit %s)" % rc)
    return ignored


if __name__ == "__main__":
    sys.exit(main())
