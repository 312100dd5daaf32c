# client/ — libdte (C API, dte.h) and dtectl.  libdte carries the protocol
# and the layout code too, so the Python binding needs nothing else.
CLIENT_SRCS := client/dte.c client/dte_cmds.c client/dte_sync.c client/msgfmt.c
CLIENT_OBJS := $(CLIENT_SRCS:%.c=$(B)/obj/%.o)
LIBDTE_OBJS := $(CLIENT_OBJS) $(PROTO_OBJS) $(LAYOUT_OBJS)

$(B)/lib/libdte.a: $(LIBDTE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	$(AR) rcs $@ $^

$(B)/lib/libdte.so.0: $(LIBDTE_OBJS)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libdte.so.0 $^ -o $@ $(LDFLAGS) $(PKG_LIBS) -ldl

$(B)/lib/libdte.so: $(B)/lib/libdte.so.0
	ln -sf libdte.so.0 $@

$(B)/bin/dtectl: $(B)/obj/client/dtectl.o $(B)/lib/libdte.a
	@mkdir -p $(dir $@)
	$(CC) $< -o $@ $(LDFLAGS) $(B)/lib/libdte.a $(PKG_LIBS) -ldl

BINS += $(B)/bin/dtectl
LIBS += $(B)/lib/libdte.a $(B)/lib/libdte.so.0 $(B)/lib/libdte.so
