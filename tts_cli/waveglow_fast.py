"""WaveGlow's inverse as large matrix products, time-major.

The same function as ``WaveGlow.infer`` (to rounding), laid out for the GPU's
matrix units instead of cuDNN's dilated convolutions, which reach a quarter of
the matmul rate on the shapes inside WaveGlow (DESIGN.md):

* activations are (B, T, C), so every 1x1 convolution is one (B*T, C) matrix
  product with the bias fused (``addmm``);
* a dilated convolution with kernel 3 is one product with K = 3C over the
  three shifted copies of its input, zeroed outside each item's length (which
  is also what makes a batched item equal the item alone);
* the upsampler (a transposed convolution) and each flow's conditioning layer
  are both linear, so they are folded into one matrix applied to the mel
  frames directly: the group step t = 32q + p sees mel frames q-3..q through
  phase p's weights, so one product per flow maps each frame's 4-frame window
  (K = 4 x 80) to the conditioning of its 32 group steps (N = 32 x 2CL). That
  is half the multiply-adds of upsampling then conditioning, and no upsampled
  mel is ever stored. The dilated convolutions' biases are folded in too.

Weights are re-laid once at construction; nothing here does I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from tts_cli import kernels, randomness
from tts_cli.waveglow import WaveGlow


@dataclass(frozen=True)
class FlowWeights:
    """One flow's weights as (K, N) matrices for ``x @ W``."""
    start: Tensor            # (n_half, C)
    start_bias: Tensor       # (C,)
    cond: Tensor             # (J*n_mel, P*2*C*L): frame window -> P group steps' conditioning
    cond_bias: Tensor        # (P*2*C*L,) upsampler, conditioning and dilated-convolution biases
    taps: list[Tensor]       # per layer (3*C, 2*C): rows [x(t-d) | x(t) | x(t+d)]
    res_skip: list[Tensor]   # per layer (C, 2*C), the last (C, C)
    res_skip_bias: list[Tensor]
    end: Tensor              # (C, 2*n_half)
    end_bias: Tensor
    inverse: Tensor          # (c, c) float32: audio @ inverse == W^-1 applied per step


def _matrix(conv_weight: Tensor) -> Tensor:
    # Conv1d weight (out, in, 1) -> (in, out)
    return conv_weight.squeeze(2).t().contiguous()


def _folded_conditioning(model: WaveGlow, k: int) -> tuple[Tensor, Tensor]:
    """The upsampler followed by flow k's conditioning layer, as one matrix from
    a window of J mel frames to P group steps (float32)."""
    d, wn = model.dims, model.WN[k]
    taps, phases = d.upsample_kernel // d.hop_length, d.hop_length // d.n_group   # J = 4, P = 32
    up = model.upsample.weight.float()                                        # (I, C, kernel)
    up = up.reshape(d.n_mel, d.n_mel, taps, phases, d.n_group)                 # kernel = (j, p, g)
    cond = wn.cond_layer.weight.float().reshape(-1, d.n_mel, d.n_group)        # (O, C, G)
    # sample 8t+g of frame block q sees frame q-j through kernel tap 256j + 8p + g
    folded = torch.einsum("ocg,icjpg->jipo", cond, up).flip(0)                 # window slot k = J-1-j
    in_bias = torch.cat([layer.bias for layer in wn.in_layers]).float()
    bias = cond.sum(2) @ model.upsample.bias.float() + wn.cond_layer.bias.float() + in_bias
    return folded.reshape(taps * d.n_mel, -1), bias.repeat(phases)


def _flow_weights(model: WaveGlow, k: int, dtype: torch.dtype) -> FlowWeights:
    wn = model.WN[k]
    cast = lambda t: t.detach().to(dtype).contiguous()
    c = wn.channels
    cond, cond_bias = _folded_conditioning(model, k)
    return FlowWeights(
        start=cast(_matrix(wn.start.weight)), start_bias=cast(wn.start.bias),
        cond=cast(cond), cond_bias=cast(cond_bias),
        # (2C, C, 3) -> (3, C, 2C) -> (3C, 2C): tap j multiplies x(t + (j-1)d)
        taps=[cast(layer.weight.permute(2, 1, 0).reshape(3 * c, 2 * c)) for layer in wn.in_layers],
        res_skip=[cast(_matrix(layer.weight)) for layer in wn.res_skip_layers],
        res_skip_bias=[cast(layer.bias) for layer in wn.res_skip_layers],
        end=cast(_matrix(wn.end.weight)), end_bias=cast(wn.end.bias),
        inverse=model.convinv[k].inverse_weight().t().contiguous(),
    )


def shifted_taps(x: Tensor, d: int) -> Tensor:
    """(B, T, C) -> (B, T, 3C): [x(t-d) | x(t) | x(t+d)], zero outside [0, T)."""
    padded = F.pad(x, (0, 0, d, d))
    return torch.cat((padded[:, : x.shape[1]], x, padded[:, 2 * d:]), dim=2)


def _linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """(..., K) @ (K, N) + bias, as one addmm over the flattened rows."""
    out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
    return out.view(*x.shape[:-1], weight.shape[1])


class FastWaveGlow:
    """Inference-only WaveGlow over re-laid weights; see the module docstring."""

    def __init__(self, model: WaveGlow, dtype: torch.dtype):
        self.dims = model.dims
        self.dtype = dtype
        self.flows = [_flow_weights(model, k, dtype) for k in range(self.dims.n_flows)]

    def frame_windows(self, mel: Tensor) -> Tensor:
        """(B, n_mel, F) -> (B*F, J*n_mel): frames q-J+1..q for each q, zeros before 0."""
        d = self.dims
        taps = d.upsample_kernel // d.hop_length
        padded = F.pad(mel.to(self.dtype), (taps - 1, 0))
        windows = padded.unfold(2, taps, 1)                       # (B, n_mel, F, J)
        return windows.permute(0, 2, 3, 1).reshape(-1, taps * d.n_mel)

    def coupling(self, w: FlowWeights, a0: Tensor, windows: Tensor, keep: Tensor) -> Tensor:
        """WN(a0, mel): (B, T, n_half) -> (B, T, 2*n_half) in the model dtype."""
        x = _linear(a0.to(self.dtype), w.start, w.start_bias)
        cond = torch.addmm(w.cond_bias, windows, w.cond).view(*x.shape[:2], -1)   # (B, T, 2CL)
        if x.is_cuda and kernels.available():
            return self._coupling_fused(w, x, cond, keep)
        c = w.start.shape[1]
        skip = None
        for i, (taps, rs, rs_bias) in enumerate(zip(w.taps, w.res_skip, w.res_skip_bias)):
            xs = shifted_taps(x * keep, 2 ** i)
            z = torch.addmm(cond[..., 2 * c * i: 2 * c * (i + 1)].reshape(-1, 2 * c),
                            xs.reshape(-1, 3 * c), taps)
            acts = torch.tanh(z[:, :c]) * torch.sigmoid(z[:, c:])
            out = torch.addmm(rs_bias, acts, rs).view(*x.shape[:2], rs.shape[1])
            if rs.shape[1] == 2 * c:
                x = x + out[..., :c]
                out = out[..., c:]
            skip = out if skip is None else skip + out
        return _linear(skip, w.end, w.end_bias)

    def _coupling_fused(self, w: FlowWeights, x: Tensor, cond: Tensor, keep: Tensor) -> Tensor:
        """``coupling`` with the elementwise work in two fused kernels per layer."""
        b, t, c = x.shape
        x, cond, keep = x.reshape(-1, c), cond.reshape(b * t, -1), keep.reshape(-1)
        taps = x.new_empty(b * t, 3 * c)
        z = x.new_empty(b * t, 2 * c)
        acts = x.new_empty(b * t, c)
        skip = x.new_empty(b * t, c)
        kernels.residual_taps(None, x, skip, keep, taps, t, dilation=1, first=True)
        last = len(w.taps) - 1
        for i, (tap_weight, rs, rs_bias) in enumerate(zip(w.taps, w.res_skip, w.res_skip_bias)):
            torch.mm(taps, tap_weight, out=z)
            kernels.gate(z, cond, i, out=acts)
            out = torch.addmm(rs_bias, acts, rs)
            if i < last:
                kernels.residual_taps(out, x, skip, keep, taps, t, dilation=2 ** (i + 1), first=i == 0)
            elif i == 0:
                skip.copy_(out)
            else:
                skip += out
        return _linear(skip, w.end, w.end_bias).view(b, t, -1)

    def infer(self, mel: Tensor, frames: Tensor, seeds: Tensor, sigma: float) -> Tensor:
        """Same contract as ``WaveGlow.infer``: float32 audio (B, F*hop)."""
        d = self.dims
        windows = self.frame_windows(mel)
        b, steps = mel.shape[0], mel.shape[2] * d.hop_length // d.n_group
        valid = frames * (d.hop_length // d.n_group)
        keep = (torch.arange(steps, device=mel.device)[None, :] < valid[:, None])[..., None]
        n_final = self.flows[-1].inverse.shape[0]
        audio = sigma * randomness.normal(seeds, randomness.NOISE_STREAM, n_final, steps).transpose(1, 2)
        for k in reversed(range(d.n_flows)):
            w = self.flows[k]
            n_half = audio.shape[2] // 2
            a0, a1 = audio[..., :n_half], audio[..., n_half:]
            out = self.coupling(w, a0, windows, keep.to(self.dtype)).float()
            a1 = (a1 - out[..., :n_half]) / torch.exp(out[..., n_half:])
            audio = torch.cat((a0, a1), 2) @ w.inverse
            if k % d.n_early_every == 0 and k > 0:
                z = randomness.normal(seeds, randomness.NOISE_STREAM + 16 * k, d.n_early_size, steps)
                audio = torch.cat((sigma * z.transpose(1, 2), audio), 2)
        return (audio * keep).reshape(b, -1)
