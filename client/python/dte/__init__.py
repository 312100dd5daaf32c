"""dte — Python side of dted.

Pure torch/numpy modules (no native code):
  qwen3     canonical HF Qwen3 tensors and the reference forward
  shm       memfd arenas: tensors described as (fd, offset, nbytes, dtype)
  megatron  trainer: Megatron-Core TP layout, AdamW state in shm, converters
  sglang    inference stand-in: SGLang TP layout in BF16 shm, converters
  toy       a toy task whose loss falls in ~20 steps
  shard     a shard an optimizer holds, memfd arenas for host tensors, SourceError
  trainers  walks real optimizers (Megatron-Core, FSDP2) for the shards they hold
            (used by dte.source: Source.megatron_core, Source.fsdp2)

The ctypes binding over libdte lives in dte._lib (written separately); none of
the modules above import it, so they work without the C library.
"""

__version__ = "0.1.0"
