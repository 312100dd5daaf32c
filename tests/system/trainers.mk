# tests/system/trainers.mk — real trainers attach (issue 19): Megatron-Core's
# optimizer memory (CPU model + megatron-core's own layout code), real
# FSDP2 on gloo CPU ranks, and real megatron-core run whole on gloo CPU
# ranks (real_megatron.py, through mcore_shim.py), into SGLang-layout
# sinks.  All run in the upstream venv (/opt/dted-venv,
# scripts/install-deps.sh); the FSDP2 test skips (77) without it, the
# Megatron model test falls back to the CPU model alone, and real_megatron
# fails: it never skips.
SYSTEM_TESTS += tests/system/trainers_mcore.py tests/system/trainers_fsdp2.py
SYSTEM_TESTS += tests/system/real_megatron.py
