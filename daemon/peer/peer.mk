# daemon/peer — daemon-to-daemon transport over UCX active messages, driven
# by the libuv loop.  libdtepeer.a is linked by the daemon and every unit test.
PEER_SRCS := daemon/peer/peer_ctx.c daemon/peer/peer_conn.c \
             daemon/peer/peer_msg.c daemon/peer/peer_mem.c daemon/peer/peer_base.c
PEER_OBJS := $(PEER_SRCS:%.c=$(B)/obj/%.o)

$(B)/lib/libdtepeer.a: $(PEER_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

LIBS += $(B)/lib/libdtepeer.a
INTERNAL_LIBS += $(B)/lib/libdtepeer.a

UNIT_TESTS += test_peer

# dte-peer-probe: checks the transport between two nodes (echo, staged
# rendezvous, throughput, failure detection); the system tests drive it.
$(B)/bin/dte-peer-probe: $(B)/obj/daemon/peer/peer_probe.o $(B)/lib/libdtepeer.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(PKG_LIBS)

BINS += $(B)/bin/dte-peer-probe
SYSTEM_TESTS += tests/system/peer_loopback.sh tests/system/peer_netns.sh tests/system/peer_listen_retry.py
