# gpu/ — compute core (element math, kernels, codec, backends).
COMPUTE_SRCS := gpu/backend.c
COMPUTE_OBJS := $(COMPUTE_SRCS:%.c=$(B)/obj/%.o)

$(B)/lib/libdtecompute.a: $(COMPUTE_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

LIBS += $(B)/lib/libdtecompute.a
INTERNAL_LIBS += $(B)/lib/libdtecompute.a
