"""Counter-based random numbers keyed by (line seed, stream, step, unit).

Prenet dropout and WaveGlow's noise are drawn here instead of from torch's
global generator, so that a line's output depends only on its own seed, never
on its batch, its position in the batch, the device or the batch size. Every
value is a pure function of its key, computed with integer tensor ops that run
the same on CPU and CUDA and inside a CUDA graph (no generator state).

The mixer is a 32-bit integer hash (xor-shift / multiply rounds). Values stay
below 2**32 and multipliers below 2**31, so every product fits in int64 without
overflow on any backend.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_M1 = 0x7FEB352D
_M2 = 0x5BD1E995
MIX_MULTIPLIERS = (_M1, _M2)   # mix32's, for the kernels that draw the same bits (kernels.decoder._mix32)

# Stream numbers: the prenet's layers use 1, 2, ...; WaveGlow's noise from here.
NOISE_STREAM = 64


def mix32(x: Tensor) -> Tensor:
    """A bijective avalanche hash on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK32
    return x ^ (x >> 16)


def _keyed(seeds: Tensor, stream: int, steps: Tensor) -> Tensor:
    # seeds, steps: (B,) int64 -> (B,) hashed keys
    return mix32(mix32(mix32(seeds & _MASK32) ^ stream) ^ (steps & _MASK32))


def uniform(seeds: Tensor, stream: int, steps: Tensor, width: int) -> Tensor:
    """(B, width) float32 uniforms in (0, 1), one per (row, unit)."""
    units = torch.arange(width, device=seeds.device, dtype=torch.long)
    bits = mix32(_keyed(seeds, stream, steps)[:, None] ^ units[None, :])
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def dropout_keep(seeds: Tensor, steps: Tensor, stream: int, width: int, p: float) -> Tensor:
    """(B, width) float32 mask: 1/(1-p) where kept, 0 where dropped."""
    return (uniform(seeds, stream, steps, width) >= p).float() * (1.0 / (1.0 - p))


def normal(seeds: Tensor, stream: int, channels: int, length: int) -> Tensor:
    """(B, channels, length) float32 standard normals by Box-Muller; the value at
    (c, t) depends only on (seed, stream, c, t), not on ``length``."""
    b = seeds.shape[0]
    t = torch.arange(length, device=seeds.device, dtype=torch.long)
    out = []
    for c in range(channels):
        steps = t[None, :].expand(b, length).reshape(-1)
        rows = seeds[:, None].expand(b, length).reshape(-1)
        u = uniform(rows, stream + c, steps, 2)                   # (B*length, 2)
        radius = torch.sqrt(-2.0 * torch.log(u[:, 0]))
        out.append((radius * torch.cos(2.0 * math.pi * u[:, 1])).view(b, length))
    return torch.stack(out, 1)
