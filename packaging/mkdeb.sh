#!/bin/sh
# packaging/mkdeb.sh - stage the built tree and turn it into .deb files with
# dpkg-deb, without a debian/ source package: `make deb` runs it after a
# normal build, so the packaged binaries are exactly the tested ones
# (stripped into the staging tree; the build keeps its debug info).
#
#   dted_<v>_<arch>.deb        dted, dtectl, units, sysusers/tmpfiles,
#                              /etc/dted/dted.conf, manuals,
#                              the CUDA plugin when it was built
#   python3-dte_<v>_all.deb    the Python package dte (dte.integrations
#                              included, the test stand-ins not; when
#                              libdte was built)
#   libdte0_<v>_<arch>.deb     libdte.so.0 (when libdte was built)
#   libdte-dev_<v>_<arch>.deb  dte.h, libdte.so, libdte.a, dte.pc
#
# The library is split off as Debian policy (and lintian) want for a
# shared library: a package named after its soname, with shlibs and an
# ldconfig trigger, and the development files in -dev.
#
# Environment (set by packaging/packaging.mk):
#   B             build directory (binaries in $B/bin, libraries in $B/lib)
#   DEB_VERSION   package version
#   DEB_MAINTAINER "Name <address>"; unset or empty: packaging/MAINTAINER's
#   DTED DTECTL   built programs (DTECTL may be empty while dtectl is not built)
#   LIBDTE_SO LIBDTE_A   the built library (empty: no libdte packages)
#   CUDA_PLUGIN   the built dte-cuda.so (may be empty)
#   SOURCE_DATE_EPOCH    time stamp for every file in the packages
set -eu

die() { echo "mkdeb: $*" >&2; exit 1; }

: "${B:?}" "${DEB_VERSION:?}" "${DTED:?}"
PKG=packaging
# One maintainer for every package, the project's (packaging/MAINTAINER).
if [ -z "${DEB_MAINTAINER:-}" ]; then
	DEB_MAINTAINER=$(sed -n '/^[^#[:space:]]/{p;q;}' "$PKG/MAINTAINER")
fi
case $DEB_MAINTAINER in
*'|'* | *'&'* | *'\'* | *'#'*)
	die "DEB_MAINTAINER \"$DEB_MAINTAINER\": no |, &, \\ or # (they reach sed)" ;;
?*' <'?*@?*.?*'>') ;;
*)	die "DEB_MAINTAINER \"$DEB_MAINTAINER\" is not \"Name <user@host.domain>\" (packaging/MAINTAINER)" ;;
esac
case $DEB_MAINTAINER in
*'<root@'* | *'@localhost>'* | *'@localhost.'*)
	die "DEB_MAINTAINER \"$DEB_MAINTAINER\": a person or team, not root@ or @localhost" ;;
esac
DTECTL=${DTECTL:-}
LIBDTE_SO=${LIBDTE_SO:-}
LIBDTE_A=${LIBDTE_A:-}
CUDA_PLUGIN=${CUDA_PLUGIN:-}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(date +%s)}

ARCH=$(dpkg-architecture -qDEB_HOST_ARCH)
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
OUT=${DEB_OUT:-$B/deb}
STAGE=$OUT/stage

[ -x "$DTED" ] || die "$DTED is missing: run make first"
for f in $DTECTL $LIBDTE_SO $LIBDTE_A $CUDA_PLUGIN; do
	[ -e "$f" ] || die "$f is missing: run make first"
done

rm -rf "$OUT"
mkdir -p "$STAGE"

# inst MODE SRC DST: copy into the staging tree with an exact mode.
inst() { install -D -m "$1" "$2" "$3"; }

# Programs and shared objects lose their symbols (dh_strip's choices).
strip_prog() { strip --strip-unneeded --remove-section=.comment --remove-section=.note "$1"; }
strip_static() {
	strip --strip-debug --enable-deterministic-archives \
	      --remove-section=.comment --remove-section=.note "$1"
}

# What every package carries: copyright, a changelog and the lintian
# overrides (each explained in packaging/lintian-overrides).
add_docs() { # ROOT PACKAGE
	inst 0644 "$PKG/lintian-overrides" "$1/usr/share/lintian/overrides/$2"
	d=$1/usr/share/doc/$2
	mkdir -p "$d"
	sed "s|@MAINTAINER@|$DEB_MAINTAINER|" "$PKG/copyright" > "$d/copyright"
	chmod 0644 "$d/copyright"
	{
		echo "dted ($DEB_VERSION) unstable; urgency=medium"
		echo
		echo "  * Package built from the dted source tree${GIT_DESC:+ at $GIT_DESC}."
		echo
		echo " -- $DEB_MAINTAINER  $(date -R -u -d "@$SOURCE_DATE_EPOCH")"
	} | gzip -9n > "$d/changelog.Debian.gz"
	chmod 0644 "$d/changelog.Debian.gz"
}

# shlibs:Depends of the ELF files given, as dpkg-shlibdeps computes it
# (it wants a debian/control, so give it a throwaway one).
shlibdeps() {
	t=$(mktemp -d)
	mkdir "$t/debian"
	printf 'Source: dted\n\nPackage: dted\nArchitecture: any\n' > "$t/debian/control"
	abs=""
	for f in "$@"; do abs="$abs $(readlink -f "$f")"; done
	# shellcheck disable=SC2086
	(cd "$t" && dpkg-shlibdeps -O ${SHLIBS_LOCAL:+-L"$SHLIBS_LOCAL"} $abs) |
		sed -n 's/^shlibs:Depends=//p'
	rm -rf "$t"
}

# finish ROOT PACKAGE DEPENDS: control file, md5sums, then dpkg-deb.
finish() {
	root=$1 pkg=$2 deps=$3
	size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
	mkdir -p "$root/DEBIAN"
	sed -e "s|@VERSION@|$DEB_VERSION|" -e "s|@ARCH@|$ARCH|" \
	    -e "s|@MAINTAINER@|$DEB_MAINTAINER|" -e "s|@SIZE@|$size|" \
	    -e "s#@DEPENDS@#$deps#" "$PKG/debian/$pkg.control" > "$root/DEBIAN/control"
	for s in postinst prerm postrm; do
		[ -f "$PKG/debian/$pkg.$s" ] && install -m 0755 "$PKG/debian/$pkg.$s" "$root/DEBIAN/$s"
	done
	for s in triggers shlibs conffiles; do
		[ -f "$PKG/debian/$pkg.$s" ] && install -m 0644 "$PKG/debian/$pkg.$s" "$root/DEBIAN/$s"
	done
	(cd "$root" && find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' |
		LC_ALL=C sort | xargs -r md5sum) > "$root/DEBIAN/md5sums"
	chmod 0644 "$root/DEBIAN/md5sums"
	find "$root" -type d -exec chmod 0755 {} +
	a=$(sed -n 's/^Architecture: //p' "$root/DEBIAN/control")
	dpkg-deb --root-owner-group -Zxz --build "$root" "$OUT/${pkg}_${DEB_VERSION}_$a.deb" >/dev/null
	echo "mkdeb: $OUT/${pkg}_${DEB_VERSION}_$a.deb"
}

GIT_DESC=$(git describe --always --dirty 2>/dev/null || true)

# ---- libdte0 and libdte-dev -------------------------------------------
if [ -n "$LIBDTE_SO" ]; then
	soname=$(objdump -p "$LIBDTE_SO" | sed -n 's/^ *SONAME *//p')
	[ "$soname" = "libdte.so.0" ] || die "$LIBDTE_SO has soname '$soname', expected libdte.so.0"
	r=$STAGE/libdte0
	inst 0644 "$LIBDTE_SO" "$r/usr/lib/$MA/libdte.so.0"
	strip_prog "$r/usr/lib/$MA/libdte.so.0"
	add_docs "$r" libdte0
	mkdir -p "$r/DEBIAN"
	# Any version of this ABI (soname 0) satisfies programs built now.
	echo "libdte 0 libdte0 (>= ${DEB_VERSION%-*})" > "$r/DEBIAN/shlibs"
	finish "$r" libdte0 "$(shlibdeps "$r/usr/lib/$MA/libdte.so.0")"

	r=$STAGE/libdte-dev
	inst 0644 client/dte.h "$r/usr/include/dte/dte.h"
	mkdir -p "$r/usr/lib/$MA/pkgconfig"
	ln -s libdte.so.0 "$r/usr/lib/$MA/libdte.so"
	if [ -n "$LIBDTE_A" ]; then
		inst 0644 "$LIBDTE_A" "$r/usr/lib/$MA/libdte.a"
		strip_static "$r/usr/lib/$MA/libdte.a"
	fi
	# Static linking needs what the shared library links: its NEEDED
	# entries, less libc, are the private libraries.
	private=$(objdump -p "$LIBDTE_SO" | sed -n 's/^ *NEEDED *lib\([^.]*\)\.so.*/-l\1/p' |
		grep -v '^-lc$' | tr '\n' ' ' | sed 's/ $//')
	cat > "$r/usr/lib/$MA/pkgconfig/dte.pc" <<EOF
prefix=/usr
exec_prefix=\${prefix}
libdir=\${prefix}/lib/$MA
includedir=\${prefix}/include

Name: dte
Description: client library of the dted delta transfer engine
Version: ${DEB_VERSION%%-*}
Libs: -L\${libdir} -ldte
Libs.private: $private
Cflags: -I\${includedir}/dte
EOF
	chmod 0644 "$r/usr/lib/$MA/pkgconfig/dte.pc"
	add_docs "$r" libdte-dev
	finish "$r" libdte-dev "libdte0 (= $DEB_VERSION)"
	SHLIBS_LOCAL=$STAGE/libdte0/DEBIAN/shlibs
fi

# ---- dted -------------------------------------------------------------
r=$STAGE/dted
inst 0755 "$DTED" "$r/usr/sbin/dted"
strip_prog "$r/usr/sbin/dted"
elves="$r/usr/sbin/dted"
if [ -n "$DTECTL" ]; then
	inst 0755 "$DTECTL" "$r/usr/bin/dtectl"
	strip_prog "$r/usr/bin/dtectl"
	elves="$elves $r/usr/bin/dtectl"
fi
if [ -n "$CUDA_PLUGIN" ]; then
	# Private plugin, found through DTE_CUDA_PLUGIN set in dted.service.
	inst 0644 "$CUDA_PLUGIN" "$r/usr/lib/dted/dte-cuda.so"
	strip_prog "$r/usr/lib/dted/dte-cuda.so"
	elves="$elves $r/usr/lib/dted/dte-cuda.so"
fi

inst 0644 "$PKG/dted.service" "$r/usr/lib/systemd/system/dted.service"
inst 0644 "$PKG/dted.socket" "$r/usr/lib/systemd/system/dted.socket"
inst 0644 "$PKG/dted.sysusers" "$r/usr/lib/sysusers.d/dted.conf"
inst 0644 "$PKG/dted.tmpfiles" "$r/usr/lib/tmpfiles.d/dted.conf"
inst 0644 "$PKG/dtectl.bash-completion" "$r/usr/share/bash-completion/completions/dtectl"
# A Grafana dashboard of the metrics dted exports (docs/DEPLOY.md, Metrics).
inst 0644 conf/grafana/dted-dashboard.json "$r/usr/share/dted/grafana/dted-dashboard.json"

# The packaged configuration lets group dte (created by the package) past
# the credential check; everything else stays at the documented defaults.
mkdir -p "$r/etc/dted"
grep -q '^#allow_gids =$' conf/dted.conf ||
	die "conf/dted.conf has no '#allow_gids =' line to set for the package; update $0"
sed 's/^#allow_gids =$/allow_gids = dte/' conf/dted.conf > "$r/etc/dted/dted.conf"
chmod 0644 "$r/etc/dted/dted.conf"
mkdir -p "$r/DEBIAN"
echo /etc/dted/dted.conf > "$r/DEBIAN/conffiles"

for m in "$B"/man/man*/*; do
	sec=$(basename "$(dirname "$m")")
	mkdir -p "$r/usr/share/man/$sec"
	gzip -9n < "$m" > "$r/usr/share/man/$sec/$(basename "$m").gz"
	chmod 0644 "$r/usr/share/man/$sec/$(basename "$m").gz"
done

add_docs "$r" dted

deps=$(shlibdeps $elves)
deps="$deps, systemd | systemd-standalone-sysusers"
[ -n "$LIBDTE_SO" ] && deps="$deps, libdte0 (= $DEB_VERSION)"
finish "$r" dted "$deps"

# ---- python3-dte --------------------------------------------------------
# The whole Python package dte (dte.integrations included) less the test
# and demo stand-ins, the same list client/python/setup.py leaves out of
# the wheel.  dte._lib finds libdte0's library beside its own prefix.
if [ -n "$LIBDTE_SO" ]; then
	standins=$(sed -n 's/^STANDINS = (\(.*\))$/\1/p' client/python/setup.py | tr -d '",')
	[ -n "$standins" ] || die "no STANDINS = (...) line in client/python/setup.py; update $0"
	r=$STAGE/python3-dte
	py=$r/usr/lib/python3/dist-packages/dte
	for f in client/python/dte/*.py client/python/dte/integrations/*.py; do
		m=${f#client/python/dte/}
		case " $standins " in *" ${m%.py} "*) continue ;; esac
		inst 0644 "$f" "$py/$m"
	done
	add_docs "$r" python3-dte
	# Architecture all: libdte0 by a lower bound (binNMU-safe).
	finish "$r" python3-dte "python3:any, python3-torch, libdte0 (>= $DEB_VERSION)"
fi
