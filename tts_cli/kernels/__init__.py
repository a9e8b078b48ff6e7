"""Triton kernels for the GPU fast paths, one module per model:
``kernels.waveglow`` (WaveGlow's coupling layers as two fused matrix
products per layer) and ``kernels.decoder`` (Tacotron2's decoder step in a
few launches). Each is proven against the plain torch path over a matrix of
model shapes (tests/test_gpu.py), and the callers route any shape a kernel
cannot serve to plain torch.

``available()`` is False without Triton or CUDA; the callers then run plain
torch. Tests run the kernels on the CPU through Triton's interpreter
(tests/test_kernels_interpreted.py).
"""
from __future__ import annotations

import torch

try:
    import triton
except ImportError:  # CPU-only installs: the plain torch paths run instead
    triton = None


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: float32 stays float32 (no TF32); the
    setting is moot for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"
