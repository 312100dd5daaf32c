#!/bin/sh
# Install every Debian package that building, testing and the demo need.
# Idempotent: packages already present are skipped; apt-get runs only when
# something is missing.
set -eu

PKGS="build-essential pkg-config clang llvm lld libclang-rt-14-dev \
libuv1-dev libucx-dev ucx-utils libprotobuf-c-dev protobuf-c-compiler \
libzstd-dev zstd libsystemd-dev libcmocka-dev libinih-dev libjansson-dev \
libxxhash-dev python3 python3-torch python3-numpy python3-venv python3-pip \
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
	exit 0
fi

echo "install-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
