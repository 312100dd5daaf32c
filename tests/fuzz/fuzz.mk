# tests/fuzz — libFuzzer targets for every parser of untrusted input.
#
# Included last by the top-level Makefile, so every layer's source list is
# known.  The project's own sources are compiled again with clang and the
# fuzzer's coverage instrumentation (plus ASan+UBSan) into $(B)/fuzz/obj and
# archived per layer: a target pulls only the objects it needs, and what it
# tests is the product's code, not a copy.
#
#   make fuzz          builds $(B)/fuzz/fuzz_* (clang -fsanitize=fuzzer,...)
#   make fuzz-smoke    runs each target from tests/fuzz/corpus/<target>/ for
#                      FUZZ_SECONDS (default 15) and prints
#                      "fuzz: targets=N execs=E crashes=0"

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 15
FUZZ_B       := $(B)/fuzz
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
                -fno-omit-frame-pointer
# Objects get coverage hooks only; the fuzzer's main() joins at link time.
FUZZ_CFLAGS  := -std=gnu11 -O1 -g -pthread -D_GNU_SOURCE $(WARN) \
                -fsanitize=fuzzer-no-link $(FUZZ_SAN) \
                -I. -I$(B)/gen $(PKG_CFLAGS) \
                -DDTE_VERSION=\"$(DTE_VERSION)\"
FUZZ_LDFLAGS := -fsanitize=fuzzer $(FUZZ_SAN) -pthread

FUZZ_TARGETS := fuzz_frame fuzz_peer_msg fuzz_codec fuzz_conf fuzz_layout fuzz_spec
FUZZ_BINS    := $(addprefix $(FUZZ_B)/,$(FUZZ_TARGETS))

# The peer protocol's generated code (proto/proto.mk builds it when
# proto/peer.proto is in the tree).
FUZZ_GEN_C := $(PROTO_GEN_C) $(PEER_PROTO_GEN_C)
ifneq ($(PEER_PROTO_GEN_C),)
FUZZ_TARGETS += fuzz_peer_proto fuzz_job_peer
FUZZ_BINS    += $(FUZZ_B)/fuzz_peer_proto $(FUZZ_B)/fuzz_job_peer
endif

# Storage manifests and chunks (daemon/storage/storage.mk defines the
# sources once that layer is in the tree).
ifneq ($(STORAGE_SRCS),)
FUZZ_TARGETS += fuzz_manifest
FUZZ_BINS    += $(FUZZ_B)/fuzz_manifest
endif

# Per-layer archives of the product's sources, rebuilt with clang.
FUZZ_LAYERS := proto compute layout peer daemon $(if $(STORAGE_SRCS),storage)
fuzz_srcs_storage := $(STORAGE_SRCS)
fuzz_srcs_proto   := $(PROTO_SRCS) $(PEER_PROTO_SRCS)
fuzz_srcs_compute := $(COMPUTE_SRCS)
fuzz_srcs_layout  := $(LAYOUT_SRCS)
fuzz_srcs_peer    := $(PEER_SRCS)
fuzz_srcs_daemon  := $(DAEMON_SRCS)
FUZZ_ARCHIVES := $(foreach l,$(FUZZ_LAYERS),$(FUZZ_B)/lib/libfz$(l).a)

$(FUZZ_B)/lib/libfzproto.a: $(FUZZ_GEN_C:$(B)/gen/%.c=$(FUZZ_B)/obj/gen/%.o)
define fuzz_archive
$(FUZZ_B)/lib/libfz$(1).a: $$(fuzz_srcs_$(1):%.c=$(FUZZ_B)/obj/%.o)
	@mkdir -p $$(dir $$@)
	@rm -f $$@
	$$(AR) rcs $$@ $$^
endef
$(foreach l,$(FUZZ_LAYERS),$(eval $(call fuzz_archive,$(l))))

$(FUZZ_B)/obj/gpu/%.o: FUZZ_CFLAGS += $(DTC_FPFLAGS)

$(FUZZ_B)/obj/%.o: %.c $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_B)/obj/gen/%.o: $(B)/gen/%.c $(GEN_HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

-include $(shell find $(FUZZ_B)/obj -name '*.d' 2>/dev/null)

$(FUZZ_B)/fuzz_%: $(FUZZ_B)/obj/tests/fuzz/fuzz_%.o $(FUZZ_ARCHIVES)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_LDFLAGS) $(filter %.o,$^) -o $@ \
		-Wl,--start-group $(FUZZ_ARCHIVES) -Wl,--end-group $(PKG_LIBS) -ldl

.PHONY: fuzz fuzz-smoke
fuzz: $(FUZZ_BINS)

fuzz-smoke: $(FUZZ_BINS)
	@B=$(B) FUZZ_SECONDS=$(FUZZ_SECONDS) ./tests/fuzz/run-smoke.sh $(FUZZ_TARGETS)

# Keep the targets' objects (make would delete them as intermediates).
.SECONDARY: $(FUZZ_TARGETS:%=$(FUZZ_B)/obj/tests/fuzz/%.o)
