# daemon/peer — daemon-to-daemon transport over UCX active messages, driven
# by the libuv loop.  libdtepeer.a is linked by the daemon and every unit test.
PEER_SRCS := daemon/peer/peer_ctx.c daemon/peer/peer_conn.c \
             daemon/peer/peer_msg.c daemon/peer/peer_mem.c
PEER_OBJS := $(PEER_SRCS:%.c=$(B)/obj/%.o)

$(B)/lib/libdtepeer.a: $(PEER_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

LIBS += $(B)/lib/libdtepeer.a
INTERNAL_LIBS += $(B)/lib/libdtepeer.a

UNIT_TESTS += test_peer
