# daemon/route_ucx.mk — daemon-to-daemon routing over UCX: unit test, the
# forge tool for misbehaving-peer tests, the multi-daemon system tests.
# (route_ucx.c itself is in DAEMON_SRCS, so it is part of libdted.a.)
UNIT_TESTS += test_route_ucx
