#!/bin/sh
# The Python package as users install it (issue 32): python3-dte from
# `make deb` unpacked with libdte0 into a fresh root, and the dte wheel
# built offline from client/python installed into a fresh venv.  In both:
# every dte.integrations module imports (dte.integrations.vllm without
# importing vLLM), the test/demo stand-ins (STANDINS in client/python/setup.py)
# are absent, dte._lib finds libdte by itself (the root's libdte0, DTE_LIB)
# and, where it cannot, says what to install or set.  The stand-ins still
# import from the source tree, whose dte._lib loads $B/lib/libdte.so.0.
# Prints `packages: deb=ok wheel=ok integrations=N/N`.
set -u
B=${B:-build}
PY=${PYTHON:-/usr/bin/python3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
checks=0; failed=0
ok()  { checks=$((checks + 1)); echo "ok   $1"; }
bad() { checks=$((checks + 1)); failed=$((failed + 1)); echo "FAIL $1"; }
check() { name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }

[ -e "$B/lib/libdte.so.0" ] || { echo "SKIP: $B/lib/libdte.so.0 not built"; exit 77; }
ARCH=$(dpkg-architecture -qDEB_HOST_ARCH)
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
SRC=$PWD/client/python
STANDINS=$(sed -n 's/^STANDINS = (\(.*\))$/\1/p' client/python/setup.py | tr -d '",')
[ -n "$STANDINS" ] || { bad "STANDINS in client/python/setup.py"; exit 1; }
# The integration modules (dte.integrations itself included).
MODS="dte.integrations"
for f in client/python/dte/integrations/*.py; do
	m=${f##*/}; m=${m%.py}
	[ "$m" = __init__ ] || MODS="$MODS dte.integrations.$m"
done
# The installed modules: everything in the source tree but the stand-ins.
SHIPPED=""
for f in client/python/dte/*.py client/python/dte/integrations/*.py; do
	m=${f#client/python/dte/}
	case " $STANDINS " in *" ${m%.py} "*) continue ;; esac
	SHIPPED="$SHIPPED $m"
done

# A sanitizer build's libdte needs the ASan runtime first in the process
# (dte.demo.asan_reexec's rule).
asan=$(ldd "$B/lib/libdte.so.0" | sed -n 's/.*libasan\.so[^ ]* => \([^ ]*\).*/\1/p')
py() { # ENV... -- run python with the ASan preload when needed, from $T
	# env's own options (-u NAME) must come first: the preload goes into
	# the environment env starts from, not after them
	(cd "$T" && if [ -n "$asan" ]; then
		LD_PRELOAD="$asan" ASAN_OPTIONS=detect_leaks=0 env "$@"
	else env "$@"; fi)
}

# The probe every install is checked with: imports each module given,
# checks vLLM and SGLang stay unimported, the stand-ins absent (or, with
# --standins, present), and where libdte comes from.
cat >"$T/probe.py" <<'EOF'
import importlib, os, sys
args = sys.argv[1:]
want_standins = "--standins" in args
engine_env = "--engine" in args  # run by the engines' venv
mods = [a for a in args if a.startswith("dte.")]
standins = os.environ["STANDINS"].split()
out = []
n = 0
for m in mods:
    try:
        importlib.import_module(m)
        n += 1
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("vllm", "sglang") and not engine_env:
            print("needs-engine=%s" % m)  # an engine plugin: tried with the engine
        else:
            out.append("import %s: %s: %s" % (m, type(e).__name__, e))
    except Exception as e:
        out.append("import %s: %s: %s" % (m, type(e).__name__, e))
for engine in ("vllm", "sglang"):
    if engine in sys.modules and not engine_env:
        out.append("importing %s imported %s" % (" ".join(mods), engine))
for s in standins if not engine_env else []:
    try:
        importlib.import_module("dte." + s)
        present = True
    except ModuleNotFoundError:
        present = False
    if present != want_standins:
        out.append("stand-in dte.%s %s" % (s, "present" if present else "missing"))
import dte
print("imported=%d/%d" % (n, len(mods)))
if engine_env:
    for line in out:
        print("problem=%s" % line)
    sys.exit(0)
print("dte=%s" % os.path.dirname(dte.__file__))
from dte import _lib
try:
    L = _lib.lib()
    L.dte_strerror(-5)
    print("lib=%s" % _lib.lib_path)
except _lib.LibraryNotFound as e:
    print("liberror=%s" % e)
for line in out:
    print("problem=%s" % line)
EOF
field() { sed -n "s/^$1=//p" "$2" | head -1; }
# Modules that need an engine to import (a vLLM plugin subclassing vLLM's
# classes) are imported again by the engines' venv (scripts/install-deps.sh),
# with the same dte on PYTHONPATH.
ENGINE_PY=${ENGINE_PY:-/opt/dted-vllm/bin/python}
imported() { # OUT DTE_PARENT: "<imported>/<total>" over both interpreters
	i=$(field imported "$1" | cut -d/ -f1)
	eng=$(sed -n 's/^needs-engine=//p' "$1")
	if [ -n "$eng" ] && [ -x "$ENGINE_PY" ]; then
		(cd "$T" && env -u DTE_LIB -u LD_PRELOAD STANDINS="$STANDINS" PYTHONPATH="$2" \
			"$ENGINE_PY" "$T/probe.py" --engine $eng) >"$1.engine" 2>&1
		e=$(field imported "$1.engine" | cut -d/ -f1)
		grep '^problem=' "$1.engine" >>"$1"
		i=$((i + ${e:-0}))
	fi
	echo "$i/$(echo $MODS | wc -w)"
}
problems() { grep '^problem=' "$1" | sed 's/^problem=/  /'; }

# ---- the Debian packages, unpacked into a fresh root ---------------------
unset MAKEFLAGS MFLAGS MAKELEVEL
MK="make --no-print-directory"
[ "$B" = build-asan ] && MK="$MK SANITIZE=1"
if $MK deb DEB_OUT="$T/deb" >"$T/make.log" 2>&1; then ok "make deb"; else bad "make deb"; tail -20 "$T/make.log"; fi
PDEB=$(ls "$T"/deb/python3-dte_*_all.deb 2>/dev/null | head -1)
V=${PDEB##*/python3-dte_}; V=${V%_all.deb}
LDEB=$T/deb/libdte0_${V}_$ARCH.deb
deb=fail
dn=0/0; wn=0/0
R=$T/root
if [ -n "$PDEB" ] && [ -e "$LDEB" ]; then
	dpkg-deb -x "$LDEB" "$R" && dpkg-deb -x "$PDEB" "$R"
	check "python3-dte depends on libdte0, python3, torch" sh -c \
		"dpkg-deb -f '$PDEB' Depends | grep -q 'libdte0 (>= $V)' &&
		 dpkg-deb -f '$PDEB' Depends | grep -q 'python3:any' &&
		 dpkg-deb -f '$PDEB' Depends | grep -q 'python3-torch'"
	check "dted recommends python3-dte" sh -c \
		"dpkg-deb -f '$T/deb/dted_${V}_$ARCH.deb' Recommends | grep -q python3-dte"
	D=$R/usr/lib/python3/dist-packages/dte
	miss=""
	for m in $SHIPPED; do [ -f "$D/$m" ] || miss="$miss $m"; done
	[ -z "$miss" ] && ok "python3-dte holds dte and dte.integrations" || bad "python3-dte lacks:$miss"
	extra=""
	for s in $STANDINS; do [ -e "$D/$s.py" ] && extra="$extra $s"; done
	[ -z "$extra" ] && ok "python3-dte without the stand-ins" || bad "python3-dte ships stand-ins:$extra"
	[ -e "$R/usr/lib/$MA/libdte.so.0" ] && ok "libdte0 in the root" || bad "libdte0 in the root"
	# No DTE_LIB: dte._lib finds the root's libdte beside its own prefix.
	py -u DTE_LIB STANDINS="$STANDINS" PYTHONPATH="$R/usr/lib/python3/dist-packages" \
		"$PY" "$T/probe.py" $MODS >"$T/deb.out" 2>&1
	dn=$(imported "$T/deb.out" "$R/usr/lib/python3/dist-packages")
	if [ "$(field dte "$T/deb.out")" = "$D" ] && [ "$dn" = "$(echo $MODS | wc -w)/$(echo $MODS | wc -w)" ] &&
	   ! grep -q '^problem=' "$T/deb.out"; then
		ok "root: dte.integrations import ($dn), no engine imported, no stand-ins"
	else bad "root: imports"; cat "$T/deb.out"; fi
	if [ "$(field lib "$T/deb.out")" = "$R/usr/lib/$MA/libdte.so.0" ]; then
		ok "root: dte._lib loads the root's libdte0 without DTE_LIB"
		deb=ok
	else bad "root: dte._lib loads the root's libdte0 (got: $(grep -E '^lib' "$T/deb.out"))"; fi
else
	bad "python3-dte and libdte0 .debs built"
fi

# ---- the wheel, installed into a fresh venv --------------------------------
# Built from a copy (setuptools builds in place), offline, without build
# isolation; installed with its dependencies resolved against the system
# site packages only (torch from Debian), nothing downloaded.
wheel=fail
# No configured index or find-links (this machine's /opt/wheels): what is
# not on the system already is an error, never a download.
PIPENV="env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null"
mkdir -p "$T/src"
(cd "$SRC" && tar cf - --exclude=build --exclude='*.egg-info' --exclude=__pycache__ .) |
	(cd "$T/src" && tar xf -)
if $PIPENV "$PY" -m pip wheel --no-deps --no-build-isolation --no-index \
	-w "$T/wheel" "$T/src" >"$T/wheel.log" 2>&1; then ok "pip wheel (offline)"
else bad "pip wheel (offline)"; tail -20 "$T/wheel.log"; fi
WHL=$(ls "$T"/wheel/dte-*.whl 2>/dev/null | head -1)
W=$T/venv
if [ -n "$WHL" ] && "$PY" -m venv --system-site-packages "$W" >"$T/venv.log" 2>&1 &&
   $PIPENV "$W/bin/pip" install --no-index --disable-pip-version-check \
	"$WHL" >"$T/install.log" 2>&1; then
	ok "wheel installs into a fresh venv (dependencies from the system site, offline)"
	"$W/bin/python" - "$WHL" >"$T/meta" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]
print(z.read(meta).decode())
ep = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
names = set(z.namelist())
for n in ep:  # every entry point's module is in the wheel
    for line in z.read(n).decode().splitlines():
        if "=" in line and not line.startswith("["):
            mod = line.split("=", 1)[1].split(":")[0].strip()
            p = mod.replace(".", "/")
            if p + ".py" not in names and p + "/__init__.py" not in names:
                print("MISSING-ENTRY-POINT-MODULE %s" % mod)
EOF
	check "wheel metadata: torch, extras vllm and sglang, entry points resolve" sh -c \
		"grep -q '^Requires-Dist: torch' '$T/meta' && grep -q '^Provides-Extra: vllm' '$T/meta' &&
		 grep -q '^Provides-Extra: sglang' '$T/meta' && ! grep -q MISSING-ENTRY '$T/meta'"
	WD=$("$W/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dte
	miss=""
	for m in $SHIPPED; do [ -f "$WD/$m" ] || miss="$miss $m"; done
	[ -z "$miss" ] && ok "wheel holds dte and dte.integrations" || bad "wheel lacks:$miss"
	# With DTE_LIB: the venv's dte imports every integration, loads it.
	py -u PYTHONPATH DTE_LIB="$PWD/$B/lib/libdte.so.0" STANDINS="$STANDINS" \
		"$W/bin/python" "$T/probe.py" $MODS >"$T/whl.out" 2>&1
	wn=$(imported "$T/whl.out" "${WD%/dte}")
	if [ "$(field dte "$T/whl.out")" = "$WD" ] && [ "$wn" = "$(echo $MODS | wc -w)/$(echo $MODS | wc -w)" ] &&
	   ! grep -q '^problem=' "$T/whl.out"; then
		ok "venv: dte.integrations import ($wn), no engine imported, no stand-ins"
	else bad "venv: imports"; cat "$T/whl.out"; fi
	if [ "$(field lib "$T/whl.out")" = "$PWD/$B/lib/libdte.so.0" ]; then
		ok "venv: DTE_LIB is loaded"; wheel=ok
	else bad "venv: DTE_LIB is loaded (got: $(grep -E '^lib' "$T/whl.out"))"; fi
	# A DTE_LIB that does not exist: an error naming it.
	py -u PYTHONPATH DTE_LIB=/nonexistent/libdte.so.0 STANDINS="$STANDINS" \
		"$W/bin/python" "$T/probe.py" >"$T/bad.out" 2>&1
	check "venv: a missing DTE_LIB is an error naming it" \
		grep -q '^liberror=DTE_LIB=/nonexistent/libdte.so.0: no such file' "$T/bad.out"
	# No DTE_LIB and no libdte anywhere the venv looks: the error says
	# what to install or set (only where this machine has no libdte0).
	if ldconfig -p 2>/dev/null | grep -q 'libdte\.so\.0' || [ -e "/usr/lib/$MA/libdte.so.0" ]; then
		echo "note: libdte installed system-wide here; not-found error not checked"
	else
		py -u DTE_LIB -u PYTHONPATH STANDINS="$STANDINS" "$W/bin/python" "$T/probe.py" \
			>"$T/none.out" 2>&1
		check "venv: without libdte the error says to install libdte0 or set DTE_LIB" sh -c \
			"grep '^liberror=' '$T/none.out' | grep -q 'Install the libdte0 package' &&
			 grep '^liberror=' '$T/none.out' | grep -q 'DTE_LIB=/path/to/libdte.so.0'"
		grep '^liberror=' "$T/none.out" | sed 's/^liberror=/  error: /' | cut -c1-200
	fi
else
	bad "wheel installs into a fresh venv"; tail -20 "$T/venv.log" "$T/install.log" 2>/dev/null
fi

# ---- the source tree: stand-ins there, $B's libdte -------------------------
py -u DTE_LIB B="$B" STANDINS="$STANDINS" PYTHONPATH="$SRC" \
	"$PY" "$T/probe.py" --standins $MODS >"$T/src.out" 2>&1
if [ "$(field lib "$T/src.out")" = "$PWD/$B/lib/libdte.so.0" ] && ! grep -q '^problem=' "$T/src.out"; then
	ok "source tree: stand-ins import, dte._lib loads \$B/lib/libdte.so.0"
else bad "source tree: stand-ins and \$B's libdte"; cat "$T/src.out"; fi

n=$(echo $MODS | wc -w)
ri=${dn%/*}; wi=${wn%/*}
echo "packages: checks=$checks passed=$((checks - failed))"
echo "packages: deb=$deb wheel=$wheel integrations=$(( ${ri:-0} < ${wi:-0} ? ${ri:-0} : ${wi:-0} ))/$n"
[ "$failed" -eq 0 ]
