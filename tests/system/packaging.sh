#!/bin/sh
# Operations packaging: the systemd units verify, sysusers/tmpfiles make
# what the units need, the manuals lint clean and document every option,
# config key and command the programs really have, `make deb` builds
# packages lintian accepts, and the packaged programs run from an
# extracted root (the daemon answering the packaged dtectl).
set -u
B=${B:-build}
T=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT
checks=0; failed=0

ok()  { checks=$((checks + 1)); echo "ok   $1"; }
bad() { checks=$((checks + 1)); failed=$((failed + 1)); echo "FAIL $1"; }
# check NAME CMD...: the command must succeed.
check() { name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }

VERSION=$(sed -n 's/^DTE_VERSION *:= *//p' Makefile)
ARCH=$(dpkg-architecture -qDEB_HOST_ARCH)
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

# ---- make man, make deb -------------------------------------------------
# Run from `make test`: do not inherit its jobserver.  Until the top-level
# Makefile includes packaging.mk, name the fragment explicitly.
unset MAKEFLAGS MFLAGS MAKELEVEL
MK="make --no-print-directory"
grep -q '^include packaging/packaging.mk' Makefile || MK="$MK -f Makefile -f packaging/packaging.mk"
[ "$B" = build-asan ] && MK="$MK SANITIZE=1"
if $MK man deb DEB_OUT="$T/deb" >"$T/make.log" 2>&1; then ok "make man deb"; else bad "make man deb"; tail -20 "$T/make.log"; fi

DEB=$(ls "$T"/deb/dted_*_"$ARCH".deb 2>/dev/null | head -1)
DEBV=${DEB##*/dted_}; DEBV=${DEBV%_"$ARCH".deb}
check "package version $DEBV is $VERSION-<revision>" \
	sh -c "echo '$DEBV' | grep -qE '^$VERSION-[0-9]+\$'"
HAVE_LIB=0
[ -e "$B/lib/libdte.so.0" ] && HAVE_LIB=1

# ---- manuals --------------------------------------------------------------
for m in "$B/man/man8/dted.8" "$B/man/man8/dtectl.8" "$B/man/man5/dted.conf.5"; do
	[ -s "$m" ] || { bad "manual $m built"; continue; }
	out=$(mandoc -T lint -W warning "$m" 2>&1; groff -ww -z -man -t "$m" 2>&1;
	      MANWIDTH=80 man --warnings -l "$m" 2>&1 >/dev/null)
	if [ -z "$out" ] && ! grep -q '@[A-Z]*@' "$m"; then
		ok "manual $(basename "$m") lints clean"
	else
		bad "manual $(basename "$m") lints clean"; echo "$out" | head
	fi
done

# Every long option of `dted --help` is in dted(8) (roff writes - as \-).
miss=""
for o in $("$B/bin/dted" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
	r=$(echo "$o" | sed 's/-/\\\\-/g')
	grep -q -- "$r" "$B/man/man8/dted.8" || miss="$miss $o"
done
[ -z "$miss" ] && ok "dted(8) documents every option" || bad "dted(8) lacks:$miss"

# Every section and key of conf/dted.conf is in dted.conf(5).
miss=""
for s in $(sed -n 's/^\[\([a-z_]*\)\]$/\1/p' conf/dted.conf); do
	grep -q "^\.SH \"\[$s\] SECTION\"" "$B/man/man5/dted.conf.5" || miss="$miss [$s]"
done
for k in $(sed -n 's/^#\{0,1\}\([a-z_][a-z_]*\) *=.*/\1/p' conf/dted.conf | sort -u); do
	grep -q "^\.BI $k \" = \"" "$B/man/man5/dted.conf.5" || miss="$miss $k"
done
[ -z "$miss" ] && ok "dted.conf(5) documents every section and key" || bad "dted.conf(5) lacks:$miss"

# Every command `dtectl help` lists has an entry in dtectl(8).
if [ -x "$B/bin/dtectl" ]; then
	miss=""
	for c in $("$B/bin/dtectl" help | sed -n '/^commands:/,$s/^  \([a-z][a-z-]*\) .*/\1/p'); do
		grep -qE "^\.BR? $c( |\$)" "$B/man/man8/dtectl.8" || miss="$miss $c"
	done
	[ -z "$miss" ] && ok "dtectl(8) documents every command" || bad "dtectl(8) lacks:$miss"
fi

# ---- units ----------------------------------------------------------------
# verify needs ExecStart to exist: point it at the build, and let the man:
# links resolve against the pages just built.
mkdir -p "$T/units"
sed "s|^ExecStart=/usr/sbin/dted|ExecStart=$PWD/$B/bin/dted|" packaging/dted.service >"$T/units/dted.service"
cp packaging/dted.socket "$T/units/"
MANPATH="$PWD/$B/man" systemd-analyze verify "$T/units/dted.service" "$T/units/dted.socket" \
	>"$T/verify" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ ! -s "$T/verify" ]; then ok "systemd-analyze verify"; else
	bad "systemd-analyze verify (exit $rc)"; cat "$T/verify"; fi
for k in Type=notify WatchdogSec=30 Restart=on-failure RuntimeDirectory=dted \
	 RuntimeDirectoryMode=0750 Group=dte NoNewPrivileges=yes ProtectSystem=strict \
	 ProtectHome=yes PrivateTmp=yes LockPersonality=yes RestrictRealtime=yes \
	 ProtectKernelTunables=yes ProtectKernelModules=yes ProtectControlGroups=yes \
	 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK' \
	 'ExecStart=/usr/sbin/dted --foreground --config /etc/dted/dted.conf'; do
	grep -qxF "$k" packaging/dted.service || miss="$miss $k"
done
grep -q '^MemoryDenyWriteExecute' packaging/dted.service && miss="$miss (MemoryDenyWriteExecute set)"
grep -q '^SystemCallFilter=@system-service' packaging/dted.service || miss="$miss SystemCallFilter"
[ -z "$miss" ] && ok "service settings" || bad "service settings:$miss"
miss=""
for k in ListenStream=/run/dted/dted.sock SocketMode=0660 SocketGroup=dte; do
	grep -qxF "$k" packaging/dted.socket || miss="$miss $k"
done
[ -z "$miss" ] && ok "socket settings" || bad "socket settings:$miss"

# sysusers then tmpfiles in an empty root: group dte, user dted in it,
# /run/dted 0750 dted:dte.
R=$T/sysroot
mkdir -p "$R/etc"
systemd-sysusers --root="$R" - <packaging/dted.sysusers >/dev/null 2>&1
gid=$(awk -F: '$1 == "dte" { print $3 }' "$R/etc/group")
check "sysusers: dted user in group dte" \
	sh -c "awk -F: '\$1 == \"dted\" && \$4 == \"$gid\" && \$7 ~ /nologin/' '$R/etc/passwd' | grep -q ."
systemd-tmpfiles --root="$R" --create - <packaging/dted.tmpfiles >/dev/null 2>&1
uid=$(awk -F: '$1 == "dted" { print $3 }' "$R/etc/passwd")
check "tmpfiles: /run/dted 0750 dted:dte" \
	sh -c "[ \"\$(stat -c '%a %u %g' '$R/run/dted')\" = '750 $uid $gid' ]"

# ---- the packages ---------------------------------------------------------
if [ -z "$DEB" ]; then
	bad "dted .deb built"
	echo "packaging: checks=$checks passed=$((checks - failed))"
	exit 1
fi
DEBS=$DEB
[ $HAVE_LIB -eq 1 ] && DEBS="$DEBS $T/deb/libdte0_${DEBV}_$ARCH.deb $T/deb/libdte-dev_${DEBV}_$ARCH.deb $T/deb/python3-dte_${DEBV}_all.deb"

# lintian: no errors, no warnings; the overrides it honours are explained
# in packaging/lintian-overrides.
lintian $DEBS >"$T/lintian" 2>&1
if grep -qE '^[EW]: ' "$T/lintian"; then bad "lintian: no errors or warnings"; grep -E '^[EW]: ' "$T/lintian"
else ok "lintian: no errors or warnings"; fi

dpkg-deb -c "$DEB" | awk '{ print $6 }' | sed 's|^\./|/|' >"$T/list"
miss=""
for f in /usr/sbin/dted /usr/bin/dtectl /etc/dted/dted.conf \
	 /usr/lib/systemd/system/dted.service /usr/lib/systemd/system/dted.socket \
	 /usr/lib/sysusers.d/dted.conf /usr/lib/tmpfiles.d/dted.conf \
	 /usr/share/man/man8/dted.8.gz /usr/share/man/man8/dtectl.8.gz \
	 /usr/share/man/man5/dted.conf.5.gz /usr/share/doc/dted/copyright \
	 /usr/share/doc/dted/changelog.Debian.gz; do
	[ "$f" = /usr/bin/dtectl ] && [ ! -x "$B/bin/dtectl" ] && continue
	grep -qxF "$f" "$T/list" || miss="$miss $f"
done
# The Python package is python3-dte's (tests/system/packages.sh), not dted's.
grep -q '^/usr/lib/python3/' "$T/list" && miss="$miss (python modules: python3-dte's)"
[ -e "$B/lib/dte-cuda.so" ] && { grep -qxF /usr/lib/dted/dte-cuda.so "$T/list" || miss="$miss dte-cuda.so"; }
[ -z "$miss" ] && ok "dted package contents" || bad "dted package lacks:$miss"

if [ $HAVE_LIB -eq 1 ]; then
	dpkg-deb -c "$T/deb/libdte0_${DEBV}_$ARCH.deb" >"$T/lib0"
	grep -q " \./usr/lib/$MA/libdte\.so\.0$" "$T/lib0" &&
		ok "libdte0 holds libdte.so.0" || bad "libdte0 holds libdte.so.0"
	dpkg-deb -c "$T/deb/libdte-dev_${DEBV}_$ARCH.deb" | awk '{ print $6 }' >"$T/dev"
	miss=""
	for f in ./usr/include/dte/dte.h ./usr/lib/$MA/libdte.so ./usr/lib/$MA/libdte.a \
		 ./usr/lib/$MA/pkgconfig/dte.pc; do
		grep -qxF "$f" "$T/dev" || miss="$miss $f"
	done
	[ -z "$miss" ] && ok "libdte-dev contents" || bad "libdte-dev lacks:$miss"
fi

# Control data: conffile, maintainer scripts, md5sums that match.
X=$T/root
mkdir -p "$X"
dpkg-deb -x "$DEB" "$X"
dpkg-deb -e "$DEB" "$T/ctl"
check "conffiles: /etc/dted/dted.conf" grep -qxF /etc/dted/dted.conf "$T/ctl/conffiles"
check "md5sums match" sh -c "cd '$X' && md5sum --quiet -c '$T/ctl/md5sums'"
check "maintainer scripts parse" sh -c "sh -n '$T/ctl/postinst' && sh -n '$T/ctl/prerm' && sh -n '$T/ctl/postrm'"
if [ $HAVE_LIB -eq 1 ]; then
	dpkg-deb -e "$T/deb/libdte0_${DEBV}_$ARCH.deb" "$T/ctl0"
	check "libdte0: shlibs and ldconfig trigger" sh -c \
		"grep -q '^libdte 0 libdte0' '$T/ctl0/shlibs' && grep -qx 'activate-noawait ldconfig' '$T/ctl0/triggers'"
fi

# The packaged config differs from conf/dted.conf only in letting group dte in.
diff conf/dted.conf "$X/etc/dted/dted.conf" | grep '^[<>]' >"$T/confdiff"
check "packaged dted.conf = conf/dted.conf + allow_gids = dte" \
	sh -c "printf '< #allow_gids =\n> allow_gids = dte\n' | cmp -s - '$T/confdiff'"

# postinst configure against the extracted root makes the user and group
# there (DPKG_ROOT), postrm purge cleans the cache.
mkdir -p "$X/etc" "$X/var/cache/dted"
: >"$X/etc/passwd"; : >"$X/etc/group"
DPKG_ROOT=$X sh "$T/ctl/postinst" configure >"$T/postinst.log" 2>&1
check "postinst configure creates dte and dted" \
	sh -c "grep -q '^dte:' '$X/etc/group' && grep -q '^dted:' '$X/etc/passwd'"
DPKG_ROOT=$X sh "$T/ctl/postrm" purge >/dev/null 2>&1
check "postrm purge removes the cache" test ! -e "$X/var/cache/dted"

# Stripped programs that run from the extracted root.
for f in "$X/usr/sbin/dted" "$X/usr/bin/dtectl"; do
	[ -e "$f" ] || continue
	if readelf -S "$f" | grep -qE '\.(symtab|debug_info)'; then bad "$(basename "$f") stripped"
	else ok "$(basename "$f") stripped"; fi
done
# The packaged daemon is the production one: no test-hook code
# (tests/faults/prod_hooks.py, with its positive control on the test build).
if B=$B "${PYTHON:-/usr/bin/python3}" tests/faults/prod_hooks.py --binary "$X/usr/sbin/dted" \
	>"$T/prod_hooks" 2>&1; then ok "packaged dted carries no test-hook code"
	grep '^prod-hooks: ' "$T/prod_hooks"
else bad "packaged dted carries no test-hook code"; cat "$T/prod_hooks"; fi
check "packaged dted --version" sh -c "'$X/usr/sbin/dted' --version | grep -q '^dted $VERSION '"
if [ -x "$X/usr/bin/dtectl" ]; then
	check "packaged dtectl --help" sh -c "'$X/usr/bin/dtectl' --help | grep -q '^usage: dtectl'"
	# The packaged daemon with the packaged config (group dte swapped for
	# root's, which exists here) answers the packaged dtectl.
	sed 's/^allow_gids = dte$/allow_gids = 0/' "$X/etc/dted/dted.conf" >"$T/dted.conf"
	"$X/usr/sbin/dted" --foreground --config "$T/dted.conf" --socket "$T/s.sock" \
		>"$T/dted.log" 2>&1 &
	pid=$!
	i=0
	while [ ! -S "$T/s.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	"$X/usr/bin/dtectl" --socket "$T/s.sock" status >"$T/status" 2>&1
	if grep -qx "version: $VERSION" "$T/status"; then ok "packaged dtectl status against packaged dted"
	else bad "packaged dtectl status against packaged dted"; cat "$T/status" "$T/dted.log"; fi
	kill "$pid"; wait "$pid"; rc=$?; pid=
	check "packaged dted exits 0 on SIGTERM" test "$rc" -eq 0
fi

echo "packaging: checks=$checks passed=$((checks - failed))"
[ "$failed" -eq 0 ]
