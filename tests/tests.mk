# tests/ — foundation tests (control protocol, config, daemon, client).
# Other layers append their own UNIT_TESTS / SYSTEM_TESTS in their fragments.
UNIT_TESTS   += test_frame test_conf test_proto test_msgfmt test_client test_apply
UNIT_TESTS   += test_detect
# Record MACs of peer protocol 5 (proto/peer_auth.h).
UNIT_TESTS   += test_peer_auth
SYSTEM_TESTS += tests/system/foundation.py
# conf/grafana/dted-dashboard.json against a real scrape; the per-sink lag.
SYSTEM_TESTS += tests/system/metrics_dashboard.py
# docs/SUPPORTED.md against `dtectl plan --supported` and the pin files.
SYSTEM_TESTS += tests/system/supported_matrix.py
# DeepSeek-V3 / Kimi-K2 / GLM-4.5 MoE: plans at real size, element maps at small dims.
SYSTEM_TESTS += tests/system/families.py
# A failed check (skip-write) through the vLLM and SGLang controllers: undone, split kept paused.
SYSTEM_TESTS += tests/system/controllers_failed_check.py
# A source that leaves a tensor out: plan_error in dtectl job, and the sink's wait says why.
SYSTEM_TESTS += tests/system/plan_error.py

# Unit tests that talk to libdte link it too (not an INTERNAL_LIB: it
# repeats the proto and layout objects).
$(B)/tests/test_msgfmt $(B)/tests/test_client: $(B)/lib/libdte.a
$(B)/tests/test_msgfmt $(B)/tests/test_client: INTERNAL_LIBS += $(B)/lib/libdte.a
