# proto/ — the control protocol: dte.proto (protoc-c), framing, command table.
# PROTO_OBJS are -fPIC and also go into libdte (client/client.mk).
PROTO_GEN_C := $(B)/gen/proto/dte.pb-c.c
PROTO_GEN_H := $(B)/gen/proto/dte.pb-c.h
PROTO_SRCS  := proto/frame.c proto/cmdtab.c
PROTO_OBJS  := $(B)/obj/gen/proto/dte.pb-c.o $(PROTO_SRCS:%.c=$(B)/obj/%.o)

# peer.proto: daemon-to-daemon records; only the daemon needs them, so they
# go into libdteproto.a but not into libdte.
PEER_PROTO_GEN_C := $(B)/gen/proto/peer.pb-c.c
PEER_PROTO_GEN_H := $(B)/gen/proto/peer.pb-c.h
# peer_auth.c: job keys and record MACs (peer protocol 5, libsodium).
PEER_PROTO_SRCS  := proto/peer_auth.c
PEER_PROTO_OBJS  := $(B)/obj/gen/proto/peer.pb-c.o $(PEER_PROTO_SRCS:%.c=$(B)/obj/%.o)

# protoc-c writes both files at once; the .c rule makes the header.
# Static pattern rules: the generated files are real targets, never
# intermediates make would delete.
PROTO_ALL_C := $(PROTO_GEN_C) $(PEER_PROTO_GEN_C)
PROTO_ALL_H := $(PROTO_GEN_H) $(PEER_PROTO_GEN_H)
$(PROTO_ALL_C): $(B)/gen/proto/%.pb-c.c: proto/%.proto
	@mkdir -p $(dir $@)
	protoc-c --proto_path=. --c_out=$(B)/gen $<
$(PROTO_ALL_H): $(B)/gen/proto/%.pb-c.h: $(B)/gen/proto/%.pb-c.c
	@test -f $@ || { rm -f $<; echo "protoc-c did not write $@" >&2; exit 1; }

$(PROTO_ALL_C:$(B)/gen/%.c=$(B)/obj/gen/%.o): $(B)/obj/gen/proto/%.pb-c.o: $(B)/gen/proto/%.pb-c.c $(B)/gen/proto/%.pb-c.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/lib/libdteproto.a: $(PROTO_OBJS) $(PEER_PROTO_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

GEN_HEADERS   += $(PROTO_GEN_H) $(PEER_PROTO_GEN_H)
LIBS          += $(B)/lib/libdteproto.a
INTERNAL_LIBS += $(B)/lib/libdteproto.a
