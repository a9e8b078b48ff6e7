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
  mel is ever stored. The dilated convolutions' biases are folded in too;
* the skip outputs are only ever summed and fed to the (linear) end layer, so
  each layer's gated activations are kept side by side and one product with
  the skip weights and the end layer folded together, (L*C, 2*n_half), gives
  the flow's output: per layer only the residual half (C -> C) is computed.

On CUDA with Triton, the elementwise work between the products runs fused
(kernels.py), in one of these forms (``kernels_mode``): "elementwise", cuBLAS
products with two fused passes per layer between them (gate; residual add and
the next layer's taps buffer), or "matmul", our own products with that work
in their prologue and epilogues (the dilated convolution reads x's shifted
rows itself and applies the gate; the residual product adds into x), so no
elementwise pass is left; or "matmul_paired", the same with the gate's tanh
and sigmoid columns interleaved in the taps weights, so that product is one
accumulator twice as wide instead of two; or "matmul_padded", that product
over a copy of x with zero rows around each item, whose shifted tiles the
tensor memory accelerator loads without masks (it needs a Triton with
host-side tensor descriptors: asked for on CUDA without them, it is refused);
or "matmul_persistent", "matmul_paired"'s product from one or two programs per SM
looping over the tiles, its tile loop and K loop pipelined as one where the
autotuner finds that faster; or "matmul_fused_cond" (the default on CUDA),
"matmul_paired" with each layer's share of the folded conditioning as 4 x 80
more K rows of its taps+gate product (kernels.taps_cond_gate), so that the
(rows, 2CL) conditioning is never stored: a row block must then share one
phase's weights, so from the first flow to the last the rows are
phase-major (kernels.PhaseRows). In the "matmul" forms the gate's tanh and
sigmoid are computed as ``gate`` says (kernels.GATE_FORMS: exactly, or with
the GPU's tanh instruction; 16-bit dtypes only).

Weights are re-laid once at construction; nothing here does I/O.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

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
    res: list[Tensor]        # per layer but the last (C, C): the residual half of res_skip
    res_bias: list[Tensor]
    skip_end: Tensor         # (L*C, 2*n_half): every layer's skip half, then the end layer
    skip_end_bias: Tensor    # (2*n_half,)
    inverse: Tensor          # (c, c) float32: audio @ inverse == W^-1 applied per step
    paired_taps: list[Tensor] | None = None   # "matmul_paired"/"_padded": kernels.pair_gate_columns(taps)
    # "matmul_fused_cond", per layer: cond's columns for the layer, (P, J*n_mel, 2C)
    # paired (kernels.pair_phase_conditioning), and their bias (2C,)
    phase_cond: list[Tensor] | None = None
    phase_cond_bias: list[Tensor] | None = None


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


def _folded_skip_end(model: WaveGlow, k: int) -> tuple[Tensor, Tensor]:
    """end(sum_i skip_i(acts_i)) = [acts_0 | ... | acts_L-1] @ W + b (float32)."""
    wn = model.WN[k]
    c = wn.channels
    end, end_bias = _matrix(wn.end.weight).float(), wn.end.bias.float()
    skips = [_matrix(layer.weight).float()[:, -c:] for layer in wn.res_skip_layers]   # (C, C) each
    skip_biases = [layer.bias.float()[-c:] for layer in wn.res_skip_layers]
    return torch.cat(skips) @ end, sum(skip_biases) @ end + end_bias


def _flow_weights(model: WaveGlow, k: int, dtype: torch.dtype) -> FlowWeights:
    wn = model.WN[k]
    cast = lambda t: t.detach().to(dtype).contiguous()
    c = wn.channels
    cond, cond_bias = _folded_conditioning(model, k)
    skip_end, skip_end_bias = _folded_skip_end(model, k)
    residual_layers = wn.res_skip_layers[:-1]
    return FlowWeights(
        start=cast(_matrix(wn.start.weight)), start_bias=cast(wn.start.bias),
        cond=cast(cond), cond_bias=cast(cond_bias),
        # (2C, C, 3) -> (3, C, 2C) -> (3C, 2C): tap j multiplies x(t + (j-1)d)
        taps=[cast(layer.weight.permute(2, 1, 0).reshape(3 * c, 2 * c)) for layer in wn.in_layers],
        res=[cast(_matrix(layer.weight)[:, :c]) for layer in residual_layers],
        res_bias=[cast(layer.bias[:c]) for layer in residual_layers],
        skip_end=cast(skip_end), skip_end_bias=cast(skip_end_bias),
        inverse=model.convinv[k].inverse_weight().t().contiguous(),
    )


def waveglow_rows_within(budget_bytes: float, dims, dtype: torch.dtype) -> int:
    """How many (item x group step) rows WaveGlow may run at once within
    ``budget_bytes`` of activations. Per row, one coupling holds in the model
    dtype x (C), the shifted taps (3C), the dilated product (2C), every
    layer's gated activations (L*C) and every layer's conditioning (2*C*L),
    plus the float32 audio state; the plain path holds less, and
    "matmul_fused_cond" stores no conditioning (about half: run Y's peak
    was 7.4 GiB under the 15 GiB default). At least one."""
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


class FastWaveGlow:
    """Inference-only WaveGlow over re-laid weights; see the module docstring."""

    KERNELS_MODES = ("elementwise", "matmul", "matmul_paired", "matmul_padded", "matmul_persistent",
                     "matmul_fused_cond")
    PAIRED_MODES = ("matmul_paired", "matmul_padded", "matmul_persistent", "matmul_fused_cond")

    def __init__(self, model: WaveGlow, dtype: torch.dtype, kernels_mode: str = "elementwise",
                 gate: str = "exact"):
        """``kernels_mode``: which fused form runs on CUDA with Triton (module
        docstring); "matmul" autotunes its kernels here, on the weights' device.
        ``gate``: kernels.GATE_FORMS, for the "matmul" forms; float32 is always exact."""
        self.dims = model.dims
        self.dtype = dtype
        self.gate = kernels.gate_for(gate, dtype)
        self.flows = [_flow_weights(model, k, dtype) for k in range(self.dims.n_flows)]
        self.kernels_mode = "elementwise"
        self._set_kernels_mode(kernels_mode)

    def with_kernels(self, kernels_mode: str | None = None, gate: str | None = None) -> "FastWaveGlow":
        """This WaveGlow (the same weights, shared) running ``kernels_mode``
        and ``gate`` (None: as this one)."""
        other = copy.copy(self)
        if gate is not None:   # first: the kernels mode compiles the gate that will run
            other.gate = kernels.gate_for(gate, self.dtype)
        if kernels_mode is not None:
            other._set_kernels_mode(kernels_mode)
        return other

    def _set_kernels_mode(self, kernels_mode: str) -> None:
        if kernels_mode not in self.KERNELS_MODES:
            raise ValueError(f"kernels_mode must be one of {self.KERNELS_MODES}, not {kernels_mode!r}")
        self.kernels_mode = kernels_mode
        paired = kernels_mode in self.PAIRED_MODES
        if paired != (self.flows[0].paired_taps is not None):   # a new list: copies share the old
            self.flows = [replace(w, paired_taps=[kernels.pair_gate_columns(t) for t in w.taps] if paired
                                  else None) for w in self.flows]
        fused_cond = kernels_mode == "matmul_fused_cond"
        device = self.flows[0].start.device
        # only where the kernel runs: elsewhere this mode is plain torch, and the
        # weights would be a second copy of the conditioning (2 GB in float32)
        self._keep_phase_conditioning(fused_cond and device.type == "cuda" and kernels.available())
        if kernels_mode == "matmul_padded" and device.type == "cuda" and kernels.available() \
                and not kernels.padded_available():
            raise RuntimeError("kernels_mode 'matmul_padded' needs a Triton with host-side tensor "
                               "descriptors (triton.tools.tensor_descriptor); use 'matmul_paired'")
        if kernels_mode.startswith("matmul") and device.type == "cuda" and kernels.available():
            kernels.tune(self.flows[0].start.shape[1], self.dtype, device, paired=paired,
                         persistent=kernels_mode == "matmul_persistent",
                         fused_cond=self.flows[0] if fused_cond else None, gate=self.gate)

    def _keep_phase_conditioning(self, wanted: bool) -> None:
        """Every flow's "matmul_fused_cond" weights built, or dropped (a new
        list of flows either way: copies share the old)."""
        if wanted != (self.flows[0].phase_cond is not None):
            self.flows = [replace(w, **self._phase_conditioning(w, wanted)) for w in self.flows]

    def _phase_conditioning(self, w: FlowWeights, wanted: bool) -> dict:
        """FlowWeights fields for "matmul_fused_cond" (None where not ``wanted``)."""
        if not wanted:
            return {"phase_cond": None, "phase_cond_bias": None}
        d = self.dims
        phases, layers, c2 = d.hop_length // d.n_group, len(w.taps), 2 * w.start.shape[1]
        return {"phase_cond": [kernels.pair_phase_conditioning(w.cond, i, phases, layers) for i in range(layers)],
                "phase_cond_bias": [w.cond_bias[c2 * i: c2 * (i + 1)].contiguous() for i in range(layers)]}

    def phase_rows(self, items: int, frames: int) -> kernels.PhaseRows:
        """The phase-major layout of the group steps of ``items`` items of ``frames`` mel frames."""
        d = self.dims
        return kernels.PhaseRows(items=items, frames=frames, phases=d.hop_length // d.n_group)

    def frame_windows(self, mel: Tensor) -> Tensor:
        """(B, n_mel, F) -> (B*F, J*n_mel): frames q-J+1..q for each q, zeros before 0."""
        d = self.dims
        taps = d.upsample_kernel // d.hop_length
        padded = F.pad(mel.to(self.dtype), (taps - 1, 0))
        windows = padded.unfold(2, taps, 1)                       # (B, n_mel, F, J)
        return windows.permute(0, 2, 3, 1).reshape(-1, taps * d.n_mel)

    def coupling(self, w: FlowWeights, a0: Tensor, windows: Tensor, keep: Tensor) -> Tensor:
        """WN(a0, mel): (B, T, n_half) -> (B, T, 2*n_half) in the model dtype."""
        fused = self._fused_coupling(a0)
        if fused is not None and self.kernels_mode == "matmul_fused_cond":   # via the phase-major rows
            rows = self.phase_rows(a0.shape[0], a0.shape[1] * self.dims.n_group // self.dims.hop_length)
            if w.phase_cond is None:   # a caller's flow from before the mode was set
                w = replace(w, **self._phase_conditioning(w, True))
            out = fused(w, rows.gather(a0), windows, rows.gather(keep).view(-1), rows)
            return rows.scatter(out)
        x = _linear(a0.to(self.dtype), w.start, w.start_bias)
        cond = torch.addmm(w.cond_bias, windows, w.cond).view(*x.shape[:2], -1)   # (B, T, 2CL)
        if fused is not None:
            return fused(w, x, cond, keep)
        c, layers = w.start.shape[1], len(w.taps)
        acts = x.new_empty(*x.shape[:2], layers * c)            # every layer's gated activations
        for i, taps in enumerate(w.taps):
            xs = shifted_taps(x * keep, 2 ** i)
            z = torch.addmm(cond[..., 2 * c * i: 2 * c * (i + 1)].reshape(-1, 2 * c),
                            xs.reshape(-1, 3 * c), taps).view(*x.shape[:2], 2 * c)
            acts[..., c * i: c * (i + 1)] = torch.tanh(z[..., :c]) * torch.sigmoid(z[..., c:])
            if i < layers - 1:
                x = x + _linear(acts[..., c * i: c * (i + 1)], w.res[i], w.res_bias[i])
        return _linear(acts, w.skip_end, w.skip_end_bias)

    def _fused_coupling(self, x: Tensor):
        """The fused form of ``coupling`` for x's device and ``kernels_mode``;
        None: plain torch. (Tests under Triton's CPU interpreter replace it.)"""
        if not (x.is_cuda and kernels.available()):
            return None
        if self.kernels_mode == "matmul_padded":   # refused in _set_kernels_mode where it cannot run
            return self._coupling_fused_padded
        if self.kernels_mode == "matmul_fused_cond":
            return self._coupling_fused_cond
        return self._coupling_fused if self.kernels_mode == "elementwise" else self._coupling_fused_matmul

    def _coupling_fused(self, w: FlowWeights, x: Tensor, cond: Tensor, keep: Tensor) -> Tensor:
        """``coupling`` with the elementwise work in two fused kernels per layer."""
        b, t, c = x.shape
        layers = len(w.taps)
        x, cond, keep = x.reshape(-1, c), cond.reshape(b * t, -1), keep.reshape(-1)
        taps = x.new_empty(b * t, 3 * c)
        z = x.new_empty(b * t, 2 * c)
        acts = x.new_empty(b * t, layers * c)
        kernels.residual_taps(None, x, keep, taps, t, dilation=1)
        for i, tap_weight in enumerate(w.taps):
            torch.mm(taps, tap_weight, out=z)
            layer_acts = acts[:, c * i: c * (i + 1)]
            kernels.gate(z, cond, i, out=layer_acts)
            if i < layers - 1:
                res = torch.addmm(w.res_bias[i], layer_acts, w.res[i])
                kernels.residual_taps(res, x, keep, taps, t, dilation=2 ** (i + 1))
        return torch.addmm(w.skip_end_bias, acts, w.skip_end).view(b, t, -1)

    def _coupling_fused_matmul(self, w: FlowWeights, x: Tensor, cond: Tensor, keep: Tensor) -> Tensor:
        """``coupling`` with two products per layer and no elementwise pass:
        the dilated convolution reads x's shifted rows itself and applies the
        gate in its epilogue (kernels.taps_gate); the residual product adds
        into x in its epilogue (kernels.residual_update). x is updated in place."""
        b, t, c = x.shape
        layers = len(w.taps)
        x, cond, keep = x.reshape(-1, c), cond.reshape(b * t, -1), keep.reshape(-1)
        acts = x.new_empty(b * t, layers * c)
        paired = w.paired_taps is not None
        persistent = self.kernels_mode == "matmul_persistent"
        for i, tap_weight in enumerate(w.paired_taps if paired else w.taps):
            layer_acts = acts[:, c * i: c * (i + 1)]
            kernels.taps_gate(x, keep, cond, i, tap_weight, t, 2 ** i, out=layer_acts, paired=paired,
                              persistent=persistent, gate=self.gate)
            if i < layers - 1:
                kernels.residual_update(layer_acts, w.res[i], w.res_bias[i], x)
        return torch.addmm(w.skip_end_bias, acts, w.skip_end).view(b, t, -1)

    def _coupling_fused_padded(self, w: FlowWeights, x: Tensor, cond: Tensor, keep: Tensor) -> Tensor:
        """``_coupling_fused_matmul`` (paired) over a copy of x with zero rows
        around each item, as many as the largest dilation, and its rows past
        each item's length zeroed: the taps+gate product's shifted loads
        need no masks (kernels.taps_gate_padded). Activations, conditioning
        and the output keep the unpadded rows."""
        b, t, c = x.shape
        layers = len(w.taps)
        pad = 2 ** (layers - 1)
        x_pad = x.new_zeros(b, t + 2 * pad, c)
        x_pad[:, pad: pad + t] = x * keep
        x_pad, cond, keep = x_pad.view(-1, c), cond.reshape(b * t, -1), keep.reshape(-1).contiguous()
        acts = x.new_empty(b * t, layers * c)
        for i, tap_weight in enumerate(w.paired_taps):
            layer_acts = acts[:, c * i: c * (i + 1)]
            kernels.taps_gate_padded(x_pad, cond, i, tap_weight, t, pad, 2 ** i, out=layer_acts, gate=self.gate)
            if i < layers - 1:
                kernels.residual_update_padded(layer_acts, w.res[i], w.res_bias[i], x_pad, keep, t, pad)
        return torch.addmm(w.skip_end_bias, acts, w.skip_end).view(b, t, -1)

    def _coupling_fused_cond(self, w: FlowWeights, a0: Tensor, windows: Tensor, keep: Tensor,
                             rows: kernels.PhaseRows) -> Tensor:
        """``coupling`` over phase-major rows (a0: (n_rows, n_half), keep:
        (n_rows,)), the conditioning inside each layer's taps+gate product
        (kernels.taps_cond_gate): no (rows, 2CL) conditioning is ever stored.
        Returns (n_rows, 2*n_half); dummy rows hold finite values."""
        x = torch.addmm(w.start_bias, a0.to(self.dtype), w.start)
        c, layers = x.shape[1], len(w.taps)
        acts = x.new_empty(x.shape[0], layers * c)
        for i in range(layers):
            layer_acts = acts[:, c * i: c * (i + 1)]
            kernels.taps_cond_gate(x, keep, windows, w.phase_cond[i], w.phase_cond_bias[i], w.paired_taps[i],
                                   rows, 2 ** i, out=layer_acts, gate=self.gate)
            if i < layers - 1:
                kernels.residual_update(layer_acts, w.res[i], w.res_bias[i], x)
        return torch.addmm(w.skip_end_bias, acts, w.skip_end)

    def infer(self, mel: Tensor, frames: Tensor, seeds: Tensor, sigma: float) -> Tensor:
        """Same contract as ``WaveGlow.infer``: float32 audio (B, F*hop)."""
        d = self.dims
        windows = self.frame_windows(mel)
        b, steps = mel.shape[0], mel.shape[2] * d.hop_length // d.n_group
        valid = frames * (d.hop_length // d.n_group)
        keep = (torch.arange(steps, device=mel.device)[None, :] < valid[:, None])[..., None]
        noise = lambda stream, n: sigma * randomness.normal(seeds, stream, n, steps).transpose(1, 2)
        fused = self._fused_coupling(mel)
        if fused is not None and self.kernels_mode == "matmul_fused_cond":
            # phase-major rows from the first flow to the last (_coupling_fused_cond)
            self._keep_phase_conditioning(True)   # built already where the kernel runs on a GPU
            rows = self.phase_rows(mel.shape[0], mel.shape[2])
            keep_rows = rows.gather(keep.to(self.dtype)).view(-1)
            audio = self._flows_inverse(lambda w, a0: fused(w, a0, windows, keep_rows, rows),
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
