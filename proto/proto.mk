# proto/ — the control protocol: dte.proto (protoc-c), framing, command table.
# PROTO_OBJS are -fPIC and also go into libdte (client/client.mk).
PROTO_GEN_C := $(B)/gen/proto/dte.pb-c.c
PROTO_GEN_H := $(B)/gen/proto/dte.pb-c.h
PROTO_SRCS  := proto/frame.c proto/cmdtab.c
PROTO_OBJS  := $(B)/obj/gen/proto/dte.pb-c.o $(PROTO_SRCS:%.c=$(B)/obj/%.o)

# protoc-c writes both files at once; the .c rule makes the header.
$(PROTO_GEN_C): proto/dte.proto
	@mkdir -p $(dir $@)
	protoc-c --proto_path=. --c_out=$(B)/gen $<
$(PROTO_GEN_H): $(PROTO_GEN_C)
	@test -f $@ || { rm -f $<; echo "protoc-c did not write $@" >&2; exit 1; }

$(B)/obj/gen/proto/dte.pb-c.o: $(PROTO_GEN_C) $(PROTO_GEN_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/lib/libdteproto.a: $(PROTO_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

GEN_HEADERS   += $(PROTO_GEN_H)
LIBS          += $(B)/lib/libdteproto.a
INTERNAL_LIBS += $(B)/lib/libdteproto.a
