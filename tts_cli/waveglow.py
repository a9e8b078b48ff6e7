"""WaveGlow (mel -> audio) and its denoiser, batched and masked.

Parameter names follow NVIDIA/waveglow's ``glow.py`` with weight norm already
folded (``checkpoints.py`` does that) and the conditioning layer fused, so a
canonical state dict loads as is. Every dimension (flows, group, early outputs,
WN layers, channels, kernel) is read from the tensors. No I/O happens here.

Reference semantics kept: the upsampled mel is trimmed by (kernel - stride)
samples; the inverse coupling divides by exp(s); the 1x1 convolution inverse is
``W.float().inverse()`` and is applied in float32 whatever the precision (the
audio state is kept in float32, the WN networks run in the model dtype); early
outputs are prepended. For batched == alone, activations past each item's
length are zeroed before every dilated convolution; a zero-padded mel upsamples
exactly, since zero frames contribute nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tts_cli import randomness


@dataclass(frozen=True)
class WaveGlowDims:
    n_mel: int
    n_flows: int
    n_group: int
    n_early_every: int
    n_early_size: int
    wn_layers: int
    wn_channels: int
    wn_kernel: int
    upsample_kernel: int
    hop_length: int              # the upsampler's stride: audio samples per mel frame

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor]) -> "WaveGlowDims":
        n_flows = sum(1 for k in sd if k.startswith("convinv.") and k.endswith(".conv.weight"))
        widths = [sd[f"convinv.{k}.conv.weight"].shape[0] for k in range(n_flows)]
        drops = [k for k in range(1, n_flows) if widths[k] < widths[k - 1]]
        up = sd["upsample.weight"]                       # (n_mel, n_mel, kernel)
        first_in = sd["WN.0.in_layers.0.weight"]         # (2*C, C, kernel)
        return cls(
            n_mel=up.shape[0],
            n_flows=n_flows,
            n_group=widths[0],
            n_early_every=drops[0] if drops else n_flows,
            n_early_size=(widths[drops[0] - 1] - widths[drops[0]]) if drops else 0,
            wn_layers=sum(1 for k in sd if k.startswith("WN.0.in_layers.") and k.endswith(".weight")),
            wn_channels=first_in.shape[1],
            wn_kernel=first_in.shape[2],
            upsample_kernel=up.shape[2],
            # The stride is not stored in the weights; NVIDIA's WaveGlow always
            # upsamples with stride = kernel / 4 (1024 / 256 in the published file).
            hop_length=up.shape[2] // 4,
        ).checked()

    def checked(self) -> "WaveGlowDims":
        """These dimensions, or ValueError naming what no WaveGlow can run:
        every flow splits its channels in halves, a mel frame is a whole
        number of groups, and a dilated convolution keeps the length only
        with an odd kernel."""
        remaining = [self.n_group - self.n_early_size * (k // self.n_early_every) for k in range(self.n_flows)]
        if any(c <= 0 or c % 2 for c in remaining):
            raise ValueError(f"flows of {remaining} channels; each must be even and positive")
        if self.hop_length % self.n_group or self.upsample_kernel % 4:
            raise ValueError(f"an upsampler of kernel {self.upsample_kernel} (hop {self.hop_length}) does not "
                             f"give whole groups of {self.n_group} samples")
        if self.wn_kernel % 2 == 0:
            raise ValueError(f"wn_kernel is {self.wn_kernel}; WaveGlow's dilated convolutions need odd kernels")
        return self


class WN(nn.Module):
    """The affine coupling network of one flow (non-causal dilated convolutions)."""

    def __init__(self, n_in: int, n_cond: int, d: WaveGlowDims):
        super().__init__()
        c, layers = d.wn_channels, d.wn_layers
        self.channels = c
        self.start = nn.Conv1d(n_in, c, 1)
        self.end = nn.Conv1d(c, 2 * n_in, 1)
        self.cond_layer = nn.Conv1d(n_cond, 2 * c * layers, 1)
        self.in_layers = nn.ModuleList(
            nn.Conv1d(c, 2 * c, d.wn_kernel, dilation=2 ** i,
                      padding=(d.wn_kernel - 1) * 2 ** i // 2) for i in range(layers))
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(c, 2 * c if i < layers - 1 else c, 1) for i in range(layers))

    def forward(self, audio: Tensor, spect: Tensor, keep: Tensor) -> Tensor:
        # audio: (B, n_half, T); spect: (B, n_mel*n_group, T); keep: (B, 1, T)
        c = self.channels
        x = self.start(audio)
        cond = self.cond_layer(spect)                           # (B, 2*C*L, T)
        skip = None
        last = len(self.in_layers) - 1
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            z = in_layer(x * keep) + cond[:, 2 * c * i: 2 * c * (i + 1)]
            acts = torch.tanh(z[:, :c]) * torch.sigmoid(z[:, c:])
            rs = res_skip(acts)
            if i < last:
                x = x + rs[:, :c]
                rs = rs[:, c:]
            skip = rs if skip is None else skip + rs
        return self.end(skip)


class Invertible1x1Conv(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 1, bias=False)

    def inverse_weight(self) -> Tensor:
        """(C, C) float32 inverse, whatever dtype the weight is stored in."""
        return self.conv.weight.float().squeeze(2).inverse()


class WaveGlow(nn.Module):
    def __init__(self, d: WaveGlowDims):
        super().__init__()
        self.dims = d
        self.upsample = nn.ConvTranspose1d(d.n_mel, d.n_mel, d.upsample_kernel, stride=d.hop_length)
        self.WN = nn.ModuleList()
        self.convinv = nn.ModuleList()
        remaining = d.n_group
        for k in range(d.n_flows):
            if k % d.n_early_every == 0 and k > 0:
                remaining -= d.n_early_size
            self.convinv.append(Invertible1x1Conv(remaining))
            self.WN.append(WN(remaining // 2, d.n_mel * d.n_group, d))

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor]) -> "WaveGlow":
        model = cls(WaveGlowDims.from_state_dict(sd))
        model.load_state_dict(sd)
        return model.eval()

    def upsample_mel(self, mel: Tensor) -> Tensor:
        """(B, n_mel, F) -> grouped conditioning (B, n_mel*n_group, F*hop/n_group)."""
        d = self.dims
        spect = self.upsample(mel)[:, :, : mel.shape[2] * d.hop_length]
        b, _, samples = spect.shape
        # (B, n_mel, T, group) -> (B, T, n_mel, group) -> (B, n_mel*group, T)
        spect = spect.unfold(2, d.n_group, d.n_group).permute(0, 2, 1, 3)
        return spect.reshape(b, samples // d.n_group, -1).transpose(1, 2)

    def inverse_weights(self) -> list[Tensor]:
        return [conv.inverse_weight() for conv in self.convinv]

    def infer(self, mel: Tensor, frames: Tensor, seeds: Tensor, sigma: float,
              inverse_weights: list[Tensor] | None = None) -> Tensor:
        """mel: (B, n_mel, F), zero past each row's ``frames``; seeds: (B,) int64.
        Returns float32 audio (B, F*hop); samples past frames*hop are garbage."""
        d = self.dims
        w_inv = inverse_weights or self.inverse_weights()
        spect = self.upsample_mel(mel)
        b, _, steps = spect.shape
        valid_steps = frames * (d.hop_length // d.n_group)
        keep = (torch.arange(steps, device=mel.device)[None, :] < valid_steps[:, None])
        keep = keep.unsqueeze(1)                                   # (B, 1, T)
        keep_model = keep.to(mel.dtype)
        n_final = self.convinv[-1].conv.weight.shape[0]
        audio = sigma * randomness.normal(seeds, randomness.NOISE_STREAM, n_final, steps)
        for k in reversed(range(d.n_flows)):
            n_half = audio.shape[1] // 2
            a0, a1 = audio[:, :n_half], audio[:, n_half:]
            out = self.WN[k](a0.to(mel.dtype), spect, keep_model).float()
            b_shift, log_s = out[:, :n_half], out[:, n_half:]
            a1 = (a1 - b_shift) / torch.exp(log_s)
            audio = torch.einsum("oc,bct->bot", w_inv[k], torch.cat((a0, a1), 1))
            if k % d.n_early_every == 0 and k > 0:
                stream = randomness.NOISE_STREAM + 16 * k
                z = sigma * randomness.normal(seeds, stream, d.n_early_size, steps)
                audio = torch.cat((z, audio), 1)
        audio = audio * keep
        return audio.permute(0, 2, 1).reshape(b, -1)


class Denoiser(nn.Module):
    """Subtracts WaveGlow's own bias spectrum (its output for a silent mel at
    sigma 0), scaled by a strength, from each item's magnitude spectrum.

    The STFT (1024/256/1024, Hann, reflect-padded, centred) runs per item on
    that item's own samples, so padding never leaks into the reflection.
    ``forward`` takes one item; ``batch`` gives each item of a padded batch
    the same result with the same transforms for all of them.
    """
    n_fft, hop, win = 1024, 256, 1024
    # ``batch`` transforms this many frames at a time, the last group padded
    # with zeros (one transform shape whatever the batch); None: all of a
    # batch's frames in one transform. The engine sets it on CUDA.
    fft_rows: int | None = None

    def __init__(self, bias_magnitude: Tensor):
        super().__init__()
        self.register_buffer("bias_magnitude", bias_magnitude)   # (n_fft//2+1, 1) float32
        self.register_buffer("window", torch.hann_window(self.win, device=bias_magnitude.device))

    @classmethod
    @torch.inference_mode()
    def for_model(cls, waveglow: WaveGlow, dtype: torch.dtype, frames: int = 88) -> "Denoiser":
        device = waveglow.upsample.weight.device
        mel = torch.zeros(1, waveglow.dims.n_mel, frames, device=device, dtype=dtype)
        lengths = torch.full((1,), frames, device=device)
        seeds = torch.zeros(1, dtype=torch.long, device=device)
        bias_audio = waveglow.infer(mel, lengths, seeds, sigma=0.0)
        spec = cls._stft(bias_audio[0], torch.hann_window(cls.win, device=device))
        return cls(spec.abs()[:, :1].float())

    @classmethod
    def _stft(cls, audio: Tensor, window: Tensor) -> Tensor:
        return torch.stft(audio, cls.n_fft, cls.hop, cls.win, window, center=True,
                          pad_mode="reflect", return_complex=True)

    def forward(self, audio: Tensor, strength: float) -> Tensor:
        """audio: (N,) float32, one item. Returns (N,) float32."""
        if strength <= 0 or audio.shape[0] < self.n_fft // 2 + 1:
            return audio  # reflect padding needs more samples than half a window
        spec = self._stft(audio, self.window)
        return torch.istft(self._subtract(spec, strength), self.n_fft, self.hop, self.win, self.window,
                           center=True, length=audio.shape[0])

    def _subtract(self, spec: Tensor, strength: float, bias: Tensor | None = None) -> Tensor:
        """``spec`` (..., n_fft//2+1, frames), or with ``bias`` shaped to match, any layout."""
        bias = self.bias_magnitude if bias is None else bias
        magnitude = (spec.abs() - bias * strength).clamp(min=0.0)
        return torch.polar(magnitude, spec.angle())

    def _in_fixed_rows(self, transform, rows: Tensor, width: int, dtype: torch.dtype) -> Tensor:
        """``transform`` (an FFT along the last dimension) over ``rows`` (R, n)
        in groups of ``fft_rows``, the last group zero-padded: (R, width)."""
        r = rows.shape[0]
        group = self.fft_rows or r
        out = torch.empty(r, width, dtype=dtype, device=rows.device)
        whole = r - r % group
        for i in range(0, whole, group):
            transform(rows[i: i + group], out=out[i: i + group])
        if whole < r:
            tail = rows.new_zeros(group, rows.shape[1])
            tail[: r - whole] = rows[whole:]
            out[whole:] = transform(tail)[: r - whole]
        return out

    def batch(self, audio: Tensor, lengths: Tensor, strength: float) -> Tensor:
        """audio (B, N) float32, item b's samples ``audio[b, :lengths[b]]``.
        Returns (B, N): each item as ``forward`` gives it (an item too short
        for the reflect padding unchanged), zeros past its length.

        What ``forward`` does per item, for all at once: each item is
        reflect-padded at its own ends (a gather), framed and transformed in
        one STFT; frames past an item's own last frame are dropped; the
        inverse overlap-adds each item's frames and divides by the sum of
        squared windows over that item's frames alone, as ``istft`` does for
        one item."""
        b, n = audio.shape
        half = self.n_fft // 2
        given = lengths.to(audio.device)
        too_short = given <= half        # forward leaves these as they are
        lengths = given.clamp(min=half + 1)
        # reflect padding: padded position p reads sample |p - half| mirrored at the item's end
        p = torch.arange(n + 2 * half, device=audio.device)[None, :] - half
        last = (lengths - 1)[:, None]
        source = p.abs()
        source = torch.where(source > last, 2 * last - source, source).clamp(min=0, max=n - 1)
        padded = torch.gather(audio, 1, source)
        # torch.stft(center=False), one row per frame: (B*T, n_fft) -> (B*T, bins)
        windowed = (padded.unfold(1, self.n_fft, self.hop) * self.window).reshape(-1, self.n_fft)
        frames = windowed.shape[0] // b
        bins = self.n_fft // 2 + 1
        spec = self._in_fixed_rows(torch.fft.rfft, windowed, bins, torch.complex64)
        spec = self._subtract(spec, strength, self.bias_magnitude[:, 0])
        pieces = self._in_fixed_rows(lambda x, out=None: torch.fft.irfft(x, n=self.n_fft, out=out),
                                     spec, self.n_fft, torch.float32)
        own = torch.arange(frames, device=audio.device)[None, :] <= (lengths // self.hop)[:, None]
        pieces = (pieces.view(b, frames, self.n_fft) * self.window * own[:, :, None]).transpose(1, 2)
        fold = dict(output_size=(1, n + 2 * half), kernel_size=(1, self.n_fft), stride=(1, self.hop))
        summed = F.fold(pieces, **fold)[:, 0, 0]
        envelope = F.fold((self.window ** 2)[None, :, None] * own[:, None, :].to(audio.dtype), **fold)[:, 0, 0]
        out = (summed / envelope.clamp(min=1e-11))[:, half: half + n]
        out = torch.where(too_short[:, None], audio, out)
        return out * (torch.arange(n, device=audio.device)[None, :] < given[:, None])


# The shapes of NVIDIA's published waveglow_256channels_universal_v5.pt.
PUBLISHED_DIMS = WaveGlowDims(n_mel=80, n_flows=12, n_group=8, n_early_every=4, n_early_size=2,
                              wn_layers=8, wn_channels=256, wn_kernel=3, upsample_kernel=1024,
                              hop_length=256)
