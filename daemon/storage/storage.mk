# daemon/storage — cross-cluster transport through a shared file system:
# chunk codec, manifests, writer, reader, watcher, retention, and the CLI
# behind `dte-storage` (later `dtectl storage`).  Uses gpu/codec (gap
# coding, chunk framing) and, in the CLI only, the layout's model spec.
STORAGE_SRCS := daemon/storage/chunk.c daemon/storage/manifest.c \
                daemon/storage/fsutil.c daemon/storage/writer.c \
                daemon/storage/reader.c daemon/storage/gc.c \
                daemon/storage/watch.c daemon/storage/storage_cli.c \
                daemon/storage/cli_rw.c daemon/storage/cli_model.c
STORAGE_OBJS := $(STORAGE_SRCS:%.c=$(B)/obj/%.o)

$(B)/lib/libdtestorage.a: $(STORAGE_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(B)/bin/dte-storage: $(B)/obj/daemon/storage/storage_main.o $(B)/lib/libdtestorage.a \
		$(B)/lib/libdtelayout.a $(B)/lib/libdtecompute.a
	@mkdir -p $(dir $@)
	$(CC) $^ -o $@ $(LDFLAGS) $(PKG_LIBS) -ldl

LIBS += $(B)/lib/libdtestorage.a
BINS += $(B)/bin/dte-storage
INTERNAL_LIBS += $(B)/lib/libdtestorage.a
UNIT_TESTS += test_storage test_storage_watch
SYSTEM_TESTS += tests/system/storage_basic.py
