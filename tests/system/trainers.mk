# tests/system/trainers.mk — real trainers attach (issue 19): Megatron-Core's
# optimizer memory (CPU model + megatron-core's own layout code) and real
# FSDP2 on gloo CPU ranks, into SGLang-layout sinks.  Both run in the
# upstream venv (/opt/dted-venv, scripts/install-deps.sh); the FSDP2 test
# skips (77) without it, the Megatron one falls back to the CPU model alone.
SYSTEM_TESTS += tests/system/trainers_mcore.py tests/system/trainers_fsdp2.py
