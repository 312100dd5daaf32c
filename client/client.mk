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

# `dtectl storage` is dte-storage's code (libdtestorage, which needs the
# codec in libdtecompute); the layout spec it uses comes from libdte.
DTECTL_LIBS := $(B)/lib/libdtestorage.a $(B)/lib/libdte.a $(B)/lib/libdtecompute.a

$(B)/bin/dtectl: $(B)/obj/client/dtectl.o $(DTECTL_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $< -o $@ $(LDFLAGS) -Wl,--start-group $(DTECTL_LIBS) -Wl,--end-group $(PKG_LIBS) -ldl

BINS += $(B)/bin/dtectl
LIBS += $(B)/lib/libdte.a $(B)/lib/libdte.so.0 $(B)/lib/libdte.so

# dtectl as scripts meet it (dtectl(8)): exit codes, wait, history, help,
# errors under --json, the local commands' error messages.
SYSTEM_TESTS += tests/system/dtectl_cli.py
