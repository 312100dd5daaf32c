# packaging/ - manuals (`make man`) and Debian packages (`make deb`).
#
# Manual sources are docs/man/<page>.<section>.in, written directly in
# man(7) roff; the build only fills in the version and date.  The packages
# are made from the normal build by packaging/mkdeb.sh with dpkg-deb.

MAN_SRCS  := $(wildcard docs/man/*.in)
MAN_PAGES := $(foreach s,$(MAN_SRCS),$(B)/man/man$(subst .,,$(suffix $(basename $(s))))/$(notdir $(basename $(s))))

# The date a page last changed in git (reproducible), else today.
man_date = $(or $(shell git log -1 --format=%cs -- $(1) 2>/dev/null),$(shell date -u +%F))

$(B)/man/man5/%: docs/man/%.in
	@mkdir -p $(dir $@)
	sed -e 's/@VERSION@/$(DTE_VERSION)/g' -e 's/@DATE@/$(call man_date,$<)/g' $< > $@

$(B)/man/man8/%: docs/man/%.in
	@mkdir -p $(dir $@)
	sed -e 's/@VERSION@/$(DTE_VERSION)/g' -e 's/@DATE@/$(call man_date,$<)/g' $< > $@

# A Debian revision: packaging may change without a new upstream version,
# and the changelog is then changelog.Debian.gz as policy wants.
DEB_VERSION    ?= $(DTE_VERSION)-1
# The maintainer is the project's, kept in packaging/MAINTAINER (not whoever
# builds); DEB_MAINTAINER='Name <address>' on the command line overrides it.
DEB_MAINTAINER ?= $(shell sed -n '/^[^\#[:space:]]/{p;q;}' packaging/MAINTAINER)

.PHONY: man deb
man: $(MAN_PAGES)

# Always rebuilt: staging is quick and a stale package is worse.  Into
# DEB_OUT (emptied first; the tests give each their own).
DEB_OUT ?= $(B)/deb
deb: $(BINS) $(LIBS) $(MAN_PAGES)
	B=$(B) DEB_OUT='$(DEB_OUT)' DEB_VERSION='$(DEB_VERSION)' DEB_MAINTAINER='$(DEB_MAINTAINER)' \
	DTED=$(B)/bin/dted DTECTL='$(filter %/dtectl,$(BINS))' \
	LIBDTE_SO='$(filter %/libdte.so.0,$(LIBS))' LIBDTE_A='$(filter %/libdte.a,$(LIBS))' \
	CUDA_PLUGIN='$(filter %/dte-cuda.so,$(LIBS))' \
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
	./packaging/mkdeb.sh

SYSTEM_TESTS += tests/system/packaging.sh

# The Python package as users install it: python3-dte (+ libdte0) unpacked
# into a fresh root, the dte wheel (built offline) in a fresh venv; prints
# `packages: deb=ok wheel=ok integrations=N/N`.
SYSTEM_TESTS += tests/system/packages.sh
