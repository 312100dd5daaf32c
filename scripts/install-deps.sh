#!/bin/sh
# Install every Debian package that building, testing and the demo need.
# Idempotent: packages already present are skipped; apt-get runs only when
# something is missing.
set -eu

PKGS="build-essential pkg-config clang llvm lld libclang-rt-14-dev \
libuv1-dev libucx-dev ucx-utils libprotobuf-c-dev protobuf-c-compiler \
libzstd-dev zstd libsystemd-dev libcmocka-dev libinih-dev libjansson-dev \
libxxhash-dev libsodium-dev python3 python3-torch python3-numpy python3-venv python3-pip \
iproute2 util-linux procps gnuplot-nox libopenblas0-pthread \
systemd dpkg-dev lintian groff-base mandoc prometheus"

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "install-deps: all packages present"
else
	echo "install-deps: installing:$missing"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO="sudo"
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $missing
fi

# --- The upstream venv -----------------------------------------------------
# Tests that call real upstream code on a CPU (torch 2.x FSDP2 and AdamW,
# megatron-core's optimizer layout, SGLang's and vLLM's weight loaders) run in
# a venv of Debian's python3.11 with the pins below; Debian's python3-torch
# (1.13) paths keep working beside it.  scripts/venv-requirements.txt is
# installed with dependencies, scripts/venv-nodeps.txt without (only their
# pure-Python layout and loader code is used).  A stamp of both files' hash
# makes this a no-op when nothing changed.  DTE_NO_VENV=1 skips it.
[ "${DTE_NO_VENV:-0}" = 1 ] && exit 0
here=$(cd "$(dirname "$0")" && pwd)
VENV=${DTE_VENV:-/opt/dted-venv}
# One builder at a time: parallel builds and test runs share the venv.
exec 9>"$VENV.lock"
flock 9
want=$(cat "$here/venv-requirements.txt" "$here/venv-nodeps.txt" "$here/venv-engines.txt" \
	| sha256sum | cut -c1-16)
vllm_venv() {
	# --- The vLLM venv ------------------------------------------------------
	# vLLM's CPU build, whole (tests/system/real_vllm.py, source_real.py,
	# real_chain.py): a venv of its own, every package pinned in
	# scripts/venv-vllm.txt and installed --no-deps (the file says why).
	# About 3.4 GB and 1.5-4 minutes.  DTE_NO_VLLM=1 skips it (those tests
	# then fail: they never skip on this machine kind).
	[ "${DTE_NO_VLLM:-0}" = 1 ] && return 0
	VV=${DTE_VLLM_VENV:-/opt/dted-vllm}
	vwant=$(sha256sum <"$here/venv-vllm.txt" | cut -c1-16)
	if [ -x "$VV/bin/python" ] && [ "$(cat "$VV/.dte-stamp" 2>/dev/null)" = "$vwant" ]; then
		echo "install-deps: venv $VV up to date"
		return 0
	fi
	echo "install-deps: building venv $VV (vLLM CPU)"
	# built in place from nothing (a half-built one has no stamp, so the
	# next run starts over): a removed pin does not linger
	rm -rf "$VV"
	/usr/bin/python3 -m venv "$VV"
	"$VV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
		--find-links /opt/wheels -r "$here/venv-vllm.txt"
	"$VV/bin/python" -c "import vllm, transformers, megatron.core" >/dev/null 2>&1 || {
		echo "install-deps: the vLLM venv $VV does not import vllm" >&2; exit 1; }
	echo "$vwant" >"$VV/.dte-stamp"
	echo "install-deps: venv $VV ready"
}

if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.dte-stamp" 2>/dev/null)" = "$want" ]; then
	echo "install-deps: venv $VENV up to date"
	vllm_venv
	exit 0
fi
echo "install-deps: building venv $VENV"
[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
	--find-links /opt/wheels -r "$here/venv-requirements.txt"
grep -qvE '^\s*(#|$)' "$here/venv-nodeps.txt" && \
	"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
	-r "$here/venv-nodeps.txt"
# SGLang's and vLLM's weight loaders (tests/system/engines_upstream.py) go
# into $VENV/engines, --no-deps, which only that test puts on sys.path:
# transformers, triton and the engines stay out of every other venv test.
# Rebuilt whole, so a removed pin does not linger.  DTE_NO_ENGINES=1 skips it
# (the test then says SKIP).
ewant=$(sha256sum <"$here/venv-engines.txt" | cut -c1-16)
if [ "${DTE_NO_ENGINES:-0}" != 1 ] && \
	[ "$(cat "$VENV/engines/.dte-stamp" 2>/dev/null)" != "$ewant" ]; then
	rm -rf "$VENV/engines.new"
	"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
		--target "$VENV/engines.new" -r "$here/venv-engines.txt"
	rm -rf "$VENV/engines"
	echo "$ewant" >"$VENV/engines.new/.dte-stamp"
	mv "$VENV/engines.new" "$VENV/engines"
fi
echo "$want" > "$VENV/.dte-stamp"
echo "install-deps: venv $VENV ready"
vllm_venv
