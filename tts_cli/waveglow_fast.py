"""WaveGlow's inverse as large matrix products, time-major.

The same function as ``WaveGlow.infer`` (to rounding), laid out for the GPU's
matrix units instead of cuDNN's dilated convolutions, which on the shapes
inside WaveGlow reach a small share of the matmul rate (BENCHMARKS.md, the
step that made WaveGlow matrix products):

* activations are (B, T, C), so every 1x1 convolution is one (B*T, C) matrix
  product with the bias fused (``addmm``);
* a dilated convolution with kernel 3 is one product with K = 3C over the
  three shifted copies of its input, zeroed outside each item's length (which
  is also what makes a batched item equal the item alone);
* the upsampler (a transposed convolution) and each flow's conditioning layer
  are both linear, so they are folded into one matrix applied to the mel
  frames directly: group step t = P q + p sees mel frames q-J+1..q through
  phase p's weights, so per layer one product maps each frame's window
  (K = J x n_mel) to the conditioning of its P group steps. That is half the
  multiply-adds of upsampling then conditioning, and no upsampled mel is ever
  stored. The dilated convolutions' biases are folded in too;
* the skip outputs are only ever summed and fed to the (linear) end layer, so
  each layer's gated activations are kept side by side and one product with
  the skip weights and the end layer folded together, (L*C, 2*n_half), gives
  the flow's output: per layer only the residual half (C -> C) is computed.

Each layer's gate columns are paired (tanh j, sigmoid j side by side), the
layout the CUDA kernels read. On CUDA with Triton each layer runs as the two
fused products of ``kernels.waveglow`` over phase-major rows, in a model
padded with zero channels to the kernels' width multiple (zero channels stay
zero through every layer and add nothing to any output); elsewhere the same
weights run as plain torch. Weights are re-laid once at construction;
nothing here does I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.nn import functional as F

from tts_cli import kernels, randomness
from tts_cli.kernels import Launch, waveglow as wg_kernels
from tts_cli.waveglow import WaveGlow, WaveGlowDims


@dataclass(frozen=True)
class FlowWeights:
    """One flow's weights as (K, N) matrices for ``x @ W``, C channels
    (the model's, or padded with zero channels for the kernels)."""
    start: Tensor              # (n_half, C)
    start_bias: Tensor         # (C,)
    taps: list[Tensor]         # per layer (3C, 2C): rows [x(t-d) | x(t) | x(t+d)], gate columns paired
    cond: list[Tensor]         # per layer (WIN, P, 2C): frame window -> P group steps, paired
    cond_bias: list[Tensor]    # per layer (2C,) paired: upsampler, conditioning, dilated convolution
    res: list[Tensor]          # per layer but the last (C, C): the residual half of res_skip
    res_bias: list[Tensor]
    skip_end: Tensor           # (L*C, 2*n_half): every layer's skip half, then the end layer
    skip_end_bias: Tensor      # (2*n_half,)
    inverse: Tensor            # (c, c) float32: audio @ inverse == W^-1 applied per step


def _matrix(conv_weight: Tensor) -> Tensor:
    # Conv1d weight (out, in, 1) -> (in, out)
    return conv_weight.squeeze(2).t()


def _pad(t: Tensor, dim: int, size: int) -> Tensor:
    """``t`` zero-padded at the end of dimension ``dim`` to ``size``."""
    pad = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [0, size - t.shape[dim]]
    return F.pad(t, pad)


def _folded_conditioning(model: WaveGlow, k: int) -> tuple[Tensor, Tensor]:
    """The upsampler followed by flow k's conditioning layer, as one (float32)
    map from a window of J mel frames to P group steps: weights (J*n_mel, P,
    2CL) and bias (2CL,), the dilated convolutions' biases included."""
    d, wn = model.dims, model.WN[k]
    taps, phases = d.upsample_kernel // d.hop_length, d.hop_length // d.n_group   # J = 4, P = 32
    up = model.upsample.weight.float()                                        # (I, C, kernel)
    up = up.reshape(d.n_mel, d.n_mel, taps, phases, d.n_group)                 # kernel = (j, p, g)
    cond = wn.cond_layer.weight.float().reshape(-1, d.n_mel, d.n_group)        # (O, C, G)
    # sample 8t+g of frame block q sees frame q-j through kernel tap 256j + 8p + g
    folded = torch.einsum("ocg,icjpg->jipo", cond, up).flip(0)                 # window slot k = J-1-j
    in_bias = torch.cat([layer.bias for layer in wn.in_layers]).float()
    bias = cond.sum(2) @ model.upsample.bias.float() + wn.cond_layer.bias.float() + in_bias
    return folded.reshape(taps * d.n_mel, phases, -1), bias


def _flow_weights(model: WaveGlow, k: int, dtype: torch.dtype, channels: int, window: int) -> FlowWeights:
    """Flow k's weights in ``dtype``, padded with zero channels to
    ``channels`` and zero window columns to ``window``."""
    wn = model.WN[k]
    c, layers = wn.channels, len(wn.in_layers)
    cast = lambda t: t.detach().to(dtype).contiguous()
    square = lambda t: _pad(_pad(t, 0, channels), 1, channels)          # (C, C) -> (channels, channels)
    cond, cond_bias = _folded_conditioning(model, k)
    per_layer = lambda t, i: t[..., 2 * c * i: 2 * c * (i + 1)]
    # (2C, C, 3) -> per tap (C, 2C), padded and paired, stacked: (3 channels, 2 channels)
    taps = [torch.cat([_pad(wg_kernels.paired_gate_columns(layer.weight[:, :, j].t(), channels), 0, channels)
                       for j in range(3)]) for layer in wn.in_layers]
    end = _matrix(wn.end.weight).float()
    skips = [_pad(_matrix(layer.weight).float()[:, -c:] @ end, 0, channels) for layer in wn.res_skip_layers]
    skip_bias = sum(layer.bias.float()[-c:] for layer in wn.res_skip_layers) @ end + wn.end.bias.float()
    residual_layers = wn.res_skip_layers[:-1]
    return FlowWeights(
        start=cast(_pad(_matrix(wn.start.weight), 1, channels)), start_bias=cast(_pad(wn.start.bias, 0, channels)),
        taps=[cast(t) for t in taps],
        cond=[cast(_pad(wg_kernels.paired_gate_columns(per_layer(cond, i), channels), 0, window))
              for i in range(layers)],
        cond_bias=[cast(wg_kernels.paired_gate_columns(per_layer(cond_bias, i), channels)) for i in range(layers)],
        res=[cast(square(_matrix(layer.weight)[:, :c])) for layer in residual_layers],
        res_bias=[cast(_pad(layer.bias[:c], 0, channels)) for layer in residual_layers],
        skip_end=cast(torch.cat(skips)), skip_end_bias=cast(skip_bias),
        inverse=model.convinv[k].inverse_weight().t().contiguous(),
    )


def kernel_widths(dims: WaveGlowDims, multiple: int = wg_kernels.CHANNELS_MULTIPLE) -> tuple[int, int]:
    """The channel count and window width FastWaveGlow runs a WaveGlow of
    these dimensions at: the model's, padded to ``multiple`` (the kernels'
    CHANNELS_MULTIPLE; 1 for plain torch)."""
    window = (dims.upsample_kernel // dims.hop_length) * dims.n_mel
    return wg_kernels.round_up(dims.wn_channels, multiple), wg_kernels.round_up(window, multiple)


def kernel_launches(dims: WaveGlowDims, dtype: torch.dtype) -> dict[str, Launch]:
    """Every kernel launch FastWaveGlow makes on CUDA for a WaveGlow of
    these dimensions in ``dtype``, by the product it computes: each layer's
    activations are a column block of the (rows, L C) activations."""
    channels, window = kernel_widths(dims)
    launches = {"taps, conditioning and gate": wg_kernels.taps_cond_gate_launch(
        dtype, channels, window, dims.hop_length // dims.n_group, dtype != torch.float32, dims.wn_layers * channels)}
    if dims.wn_layers > 1:    # the last layer has no residual half
        launches["residual update"] = wg_kernels.residual_launch(dtype, channels, dims.wn_layers * channels)
    return launches


def supports(dims: WaveGlowDims) -> bool:
    """Whether FastWaveGlow can run a WaveGlow of these dimensions: its
    dilated convolutions are three-tap, as in every published WaveGlow."""
    return dims.wn_kernel == 3


def waveglow_rows_within(budget_bytes: float, dims: WaveGlowDims, dtype: torch.dtype) -> int:
    """How many (item x group step) rows WaveGlow may run at once within
    ``budget_bytes`` of activations. Per row, one coupling holds in the model
    dtype x (C), the shifted taps (3C), the dilated product (2C), every
    layer's gated activations (L*C) and up to every layer's conditioning
    (2*C*L), plus the float32 audio state: an upper bound for both the plain
    path and the kernels' (which store no conditioning). At least one."""
    c, layers = dims.wn_channels, dims.wn_layers
    per_row = (6 + 3 * layers) * c * torch.empty((), dtype=dtype).element_size() + 4 * 2 * dims.n_group
    return max(1, int(budget_bytes // per_row))


def shifted_taps(x: Tensor, d: int) -> Tensor:
    """(B, T, C) -> (B, T, 3C): [x(t-d) | x(t) | x(t+d)], zero outside [0, T)."""
    padded = F.pad(x, (0, 0, d, d))
    return torch.cat((padded[:, : x.shape[1]], x, padded[:, 2 * d:]), dim=2)


def _linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """(..., K) @ (K, N) + bias, as one addmm over the flattened rows."""
    out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
    return out.view(*x.shape[:-1], weight.shape[1])


def _gate(z: Tensor) -> Tensor:
    """(..., 2C) paired -> (..., C): tanh of the even columns times sigmoid of the odd."""
    return torch.tanh(z[..., 0::2]) * torch.sigmoid(z[..., 1::2])


class FastWaveGlow:
    """Inference-only WaveGlow over re-laid weights; see the module docstring."""

    def __init__(self, model: WaveGlow, dtype: torch.dtype, use_kernels: bool | None = None):
        """``use_kernels``: run the CUDA kernels (None: where they run, on
        a CUDA device of kernels.TARGETS with Triton; tests pass True to run
        them under Triton's interpreter). Raises ValueError for a model
        ``supports`` refuses."""
        if not supports(model.dims):
            raise ValueError(f"FastWaveGlow needs three-tap dilated convolutions, not {model.dims.wn_kernel}")
        device = model.upsample.weight.device
        if use_kernels is None:
            use_kernels = device.type == "cuda" and kernels.usable(device)[0]
        self.use_kernels = use_kernels
        d = model.dims
        # the kernels' width: the model's channels and window, padded
        self.channels, self.window = kernel_widths(d, wg_kernels.CHANNELS_MULTIPLE if self.use_kernels else 1)
        self.dims = d
        self.dtype = dtype
        self.flows = [_flow_weights(model, k, dtype, self.channels, self.window) for k in range(d.n_flows)]
        # the gate's tanh from the GPU's instruction in 16-bit; float32 stays exact
        self.fast_tanh = dtype != torch.float32

    @property
    def padded_dims(self) -> WaveGlowDims:
        """The dimensions the weights run at (channels padded for the kernels)."""
        return replace(self.dims, wn_channels=self.channels)

    def phase_rows(self, items: int, frames: int) -> wg_kernels.PhaseRows:
        """The phase-major layout of the group steps of ``items`` items of ``frames`` mel frames."""
        d = self.dims
        return wg_kernels.PhaseRows(items=items, frames=frames, phases=d.hop_length // d.n_group)

    def frame_windows(self, mel: Tensor) -> Tensor:
        """(B, n_mel, F) -> (B*F, WIN): frames q-J+1..q for each q, zeros
        before 0 and in the padded columns."""
        d = self.dims
        taps = d.upsample_kernel // d.hop_length
        padded = F.pad(mel.to(self.dtype), (taps - 1, 0))
        windows = padded.unfold(2, taps, 1)                       # (B, n_mel, F, J)
        return _pad(windows.permute(0, 2, 3, 1).reshape(-1, taps * d.n_mel), 1, self.window).contiguous()

    def coupling(self, w: FlowWeights, a0: Tensor, windows: Tensor, keep: Tensor) -> Tensor:
        """WN(a0, mel) in plain torch, time-major: (B, T, n_half) -> (B, T,
        2*n_half) in the model dtype; keep: (B, T, 1) of 0 and 1."""
        x = _linear(a0.to(self.dtype), w.start, w.start_bias)
        b, t, c = x.shape
        # every layer's gated activations; zeroed, as a 16-bit CPU matmul over
        # one layer's columns has read (as NaN) the later layers' not yet written
        acts = x.new_zeros(b, t, len(w.taps) * c)
        for i, taps in enumerate(w.taps):
            xs = shifted_taps(x * keep, 2 ** i)
            z = (windows @ w.cond[i].view(windows.shape[1], -1)).view(-1, 2 * c)   # rows (b, q, p) = (b, t)
            z = torch.addmm(z.add_(w.cond_bias[i]), xs.view(-1, 3 * c), taps)
            acts[..., c * i: c * (i + 1)] = _gate(z).view(b, t, c)
            if i < len(w.res):
                x = x + _linear(acts[..., c * i: c * (i + 1)], w.res[i], w.res_bias[i])
        return _linear(acts, w.skip_end, w.skip_end_bias)

    def coupling_kernels(self, w: FlowWeights, a0: Tensor, windows: Tensor, keep: Tensor,
                         rows: wg_kernels.PhaseRows) -> Tensor:
        """WN(a0, mel) through the kernels, over phase-major rows (a0:
        (n_rows, n_half), keep: (n_rows,)): no (rows, 2CL) conditioning is
        ever stored. Returns (n_rows, 2*n_half); dummy rows hold finite values."""
        x = torch.addmm(w.start_bias, a0.to(self.dtype), w.start)
        c, layers = x.shape[1], len(w.taps)
        acts = x.new_empty(x.shape[0], layers * c)
        for i in range(layers):
            layer_acts = acts[:, c * i: c * (i + 1)]
            wg_kernels.taps_cond_gate(x, keep, windows, w.cond[i], w.cond_bias[i], w.taps[i], rows, 2 ** i,
                                      out=layer_acts, fast_tanh=self.fast_tanh)
            if i < len(w.res):
                wg_kernels.residual_update(layer_acts, w.res[i], w.res_bias[i], x)
        return torch.addmm(w.skip_end_bias, acts, w.skip_end)

    def infer(self, mel: Tensor, frames: Tensor, seeds: Tensor, sigma: float) -> Tensor:
        """Same contract as ``WaveGlow.infer``: float32 audio (B, F*hop)."""
        d = self.dims
        windows = self.frame_windows(mel)
        b, steps = mel.shape[0], mel.shape[2] * d.hop_length // d.n_group
        valid = frames * (d.hop_length // d.n_group)
        keep = (torch.arange(steps, device=mel.device)[None, :] < valid[:, None])[..., None]
        noise = lambda stream, n: sigma * randomness.normal(seeds, stream, n, steps).transpose(1, 2)
        if self.use_kernels:
            # phase-major rows from the first flow to the last
            rows = self.phase_rows(mel.shape[0], mel.shape[2])
            keep_rows = rows.gather(keep.to(self.dtype)).view(-1)
            audio = self._flows_inverse(lambda w, a0: self.coupling_kernels(w, a0, windows, keep_rows, rows),
                                        lambda stream, n: rows.gather(noise(stream, n)), 1)
            return (rows.scatter(audio) * keep).reshape(b, -1)
        keep_model = keep.to(self.dtype)
        audio = self._flows_inverse(lambda w, a0: self.coupling(w, a0, windows, keep_model), noise, 2)
        return (audio * keep).reshape(b, -1)

    def _flows_inverse(self, coupling, noise, dim: int) -> Tensor:
        """The flows undone from the last to the first over float32 audio
        whose channels are dimension ``dim`` (rows before it): ``coupling(w,
        a0)`` gives a flow's WN output, ``noise(stream, n)`` n channels of
        noise (the initial state and each early output) in the same rows."""
        d = self.dims
        audio = noise(randomness.NOISE_STREAM, self.flows[-1].inverse.shape[0])
        for k in reversed(range(d.n_flows)):
            w = self.flows[k]
            n_half = audio.shape[dim] // 2
            a0, a1 = audio.split(n_half, dim)
            out = coupling(w, a0).float()
            a1 = (a1 - out.narrow(dim, 0, n_half)) / torch.exp(out.narrow(dim, n_half, n_half))
            audio = torch.cat((a0, a1), dim) @ w.inverse
            if k % d.n_early_every == 0 and k > 0:
                audio = torch.cat((noise(randomness.NOISE_STREAM + 16 * k, d.n_early_size), audio), dim)
        return audio
