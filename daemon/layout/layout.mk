# daemon/layout — model specs, pieces, layout generators, plans.
# Objects are -fPIC and also go into libdte (client.mk uses LAYOUT_OBJS).
LAYOUT_SRCS := daemon/layout/plan_cli.c
LAYOUT_OBJS := $(LAYOUT_SRCS:%.c=$(B)/obj/%.o)

$(B)/lib/libdtelayout.a: $(LAYOUT_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

LIBS += $(B)/lib/libdtelayout.a
INTERNAL_LIBS += $(B)/lib/libdtelayout.a
