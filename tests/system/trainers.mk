# tests/system/trainers.mk — real trainers attach (issue 19): Megatron-Core's
# optimizer memory (CPU model + megatron-core's own layout code), real
# FSDP2 on gloo CPU ranks, and real megatron-core run whole on gloo CPU
# ranks (real_megatron.py, through mcore_shim.py), into SGLang-layout
# sinks.  All run in the upstream venv (/opt/dted-venv,
# scripts/install-deps.sh); the FSDP2 and the Megatron model tests skip
# (77) without it (the latter needs megatron-core's own layout code: no
# CPU-model-only pass), and real_megatron fails: it never skips.
SYSTEM_TESTS += tests/system/trainers_mcore.py tests/system/trainers_fsdp2.py
SYSTEM_TESTS += tests/system/real_megatron.py
