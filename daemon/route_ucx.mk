# daemon/route_ucx.mk — daemon-to-daemon routing over UCX: unit test, the
# forge tool for misbehaving-peer tests, the multi-daemon system tests.
# (route_ucx.c itself is in DAEMON_SRCS, so it is part of libdted.a.)
UNIT_TESTS += test_route_ucx

# dte-peer-forge: a misbehaving peer (wrong token, unknown job, stale base,
# out-of-range or corrupt payloads) for the system tests.
$(B)/bin/dte-peer-forge: $(B)/obj/tests/forge/dte_peer_forge.o $(B)/lib/libdted.a \
		$(B)/lib/libdtelayout.a $(B)/lib/libdtepeer.a $(B)/lib/libdtecompute.a \
		$(B)/lib/libdteproto.a
	@mkdir -p $(dir $@)
	$(CC) $< -o $@ $(LDFLAGS) -Wl,--start-group $(filter %.a,$^) -Wl,--end-group \
		$(PKG_LIBS) -ldl

BINS += $(B)/bin/dte-peer-forge

# Three daemons, real UCX, real AdamW: loopback, then network namespaces.
# Both import tests/system/sync_local.py (the single-daemon harness).
SYSTEM_TESTS += tests/system/cluster_sync.py tests/system/cluster_sync_netns.py
# Relay between sink daemons (issue 34): chain, tree, a late replica, a relay
# killed mid-version.
SYSTEM_TESTS += tests/system/relay_sync.py
# One storage reader per cluster (issue 34, cross-cluster): a relay reader
# feeds the cluster's sink daemons over UCX, relayed; a corrupt chunk and
# the reader killed and restarted.
SYSTEM_TESTS += tests/system/storage_relay.py
# The relay shape from measured links (issue 34): one replica's uplink
# shaped slow in network namespaces; the members' RATES make it a leaf.
SYSTEM_TESTS += tests/system/relay_shape.py

# Peers that prove the job key (peer protocol 5): the forge without it is
# refused and counted, nothing lost; with auth off it is not refused.
SYSTEM_TESTS += tests/system/peer_auth.py
