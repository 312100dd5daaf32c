# daemon/layout — model specs, pieces, layout generators, plans.
# Objects are -fPIC and also go into libdte (client.mk uses LAYOUT_OBJS).
LAYOUT_SRCS := daemon/layout/spec.c daemon/layout/layout.c daemon/layout/desc.c \
               daemon/layout/gen_megatron.c daemon/layout/gen_fsdp.c \
               daemon/layout/gen_sglang.c daemon/layout/gen_json.c \
               daemon/layout/gen_shards.c \
               daemon/layout/plan.c daemon/layout/plan_cli.c
LAYOUT_OBJS := $(LAYOUT_SRCS:%.c=$(B)/obj/%.o)

$(B)/lib/libdtelayout.a: $(LAYOUT_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

# dte-plan: `dtectl plan` without dtectl (same entry point).
$(B)/bin/dte-plan: $(B)/obj/daemon/layout/plan_main.o $(B)/lib/libdtelayout.a
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDFLAGS) $(PKG_LIBS)

LIBS += $(B)/lib/libdtelayout.a
BINS += $(B)/bin/dte-plan
INTERNAL_LIBS += $(B)/lib/libdtelayout.a
UNIT_TESTS += test_spec test_layout test_plan test_layout_tensors test_shards
SYSTEM_TESTS += tests/system/layout_cli.sh tests/system/layout_reference.py
