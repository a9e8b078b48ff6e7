"""Train the demo voice's WaveGlow (mel -> audio) on the WAVs of make_data.py.

The network is ``tts_cli.waveglow.WaveGlow`` itself (only smaller), so the
export loads through ``tts_cli.checkpoints``. That module only runs the flow
backwards (noise -> audio); the forward flow that training needs is written
here from its submodules, following NVIDIA/waveglow's ``glow.py``:

* the mel is upsampled to audio rate, both are grouped ``n_group`` samples to
  a step;
* each flow: (every ``n_early_every`` flows, ``n_early_size`` channels leave
  as output), the invertible 1x1 convolution (log-determinant
  ``batch * steps * log|det W|``), then the affine coupling: WN reads the
  first half and the mel and gives (b, log s); the second half becomes
  ``exp(log s) * x + b``;
* loss (``WaveGlowLoss``): ``sum(z^2) / (2 sigma^2) - sum(log s) - sum(log det
  W)``, divided by the number of elements of z; sigma = 1.0.

As in the reference: WN's convolutions (start, conditioning, dilated, res/skip)
are weight-normalised, its end convolution starts at zero (each coupling starts
as the identity), the 1x1 convolutions start as random rotations with
determinant +1; training reads random segments of the audio (zero-padded when
shorter) with the mel of each segment; Adam. The 1x1 convolutions and the
log-determinants run in fp32; WN runs under autocast.

Objective (``--objective``):

* ``spectral`` trains the flow the way it is used: the inverse pass turns
  noise at the inference sigma (0.666) and a segment's mel into audio, and
  the loss is a multi-resolution STFT distance to the segment's own audio
  (spectral convergence plus log-magnitude L1 at three FFT sizes, as Parallel
  WaveGAN's). It matches spectra
  four times sooner than the likelihood, but what it learnt by 10,870 steps
  is to shape its noise into the envelope, unvoiced, and its words are worse
  (recipe README, Limits).
* ``mle`` is the reference's likelihood (``WaveGlowLoss``), a new run's
  default.
  A resumed run keeps the objective (and the model size) it was trained
  with unless ``--objective`` says otherwise.
* ``hybrid`` is the sum of both (``--spectral-weight``), not measured yet:
  the likelihood makes each coupling predict real audio from real audio,
  voicing included, and the spectral term is meant to shape what sampling
  at 0.666 makes of that.

Every objective trains the same weights (the inverse pass inverts the 1x1
convolutions by Newton-Schulz, ``inverse_1x1``), so a run may change
objective and keep its weights and optimizer state. The export is a
WaveGlow either way, read and run by the same code.

Departure, for size: the upsampler (80 x 80 x 1024, 6.6 M weights, 13.1 MB
even in fp16 -- the loader reads the hop from its kernel, so it cannot be
smaller) is not trained. It is fixed to linear interpolation between
consecutive frames, each mel band feeding only itself (so, zero off its
diagonal, it deflates to almost nothing in the exported file); the
conditioning layers learn the mixing. Training it would triple the resume
checkpoint for little gain on a voice this regular.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

import common
from mel import MelExtractor, MelSettings, read_filelist, read_wav
from tts_cli.waveglow import WaveGlow, WaveGlowDims

# 8 flows of 6 layers x 40 channels: about 3.1 M trained parameters (6.2 MB in
# fp16), plus the fixed upsampler (13.1 MB). The published model has 12 flows
# of 8 x 256; the group of 8 samples, early outputs every 4 flows and kernel 3
# stay as published.
DEMO_DIMS = WaveGlowDims(n_mel=80, n_flows=8, n_group=8, n_early_every=4, n_early_size=2,
                         wn_layers=6, wn_channels=40, wn_kernel=3, upsample_kernel=1024,
                         hop_length=256)
SIGMA = 1.0
SEGMENT = 16384   # samples per training segment (the reference uses 16000); a multiple of hop and group


# --------------------------------------------------------------------------
# Model set-up


def interpolating_upsampler(d: WaveGlowDims) -> Tensor:
    """ConvTranspose1d weight (n_mel, n_mel, kernel) that interpolates each band
    linearly between consecutive frames: frame f reaches samples f*hop ..
    f*hop + 2*hop with a triangle peaking at f*hop + hop, so every sample is a
    convex mix of two frames (the triangles overlapping by half sum to 1)."""
    k = torch.arange(d.upsample_kernel, dtype=torch.float32)
    triangle = (1.0 - (k - d.hop_length).abs() / d.hop_length).clamp(min=0.0)
    return torch.eye(d.n_mel)[:, :, None] * triangle[None, None, :]


def build(dims: WaveGlowDims, seed: int) -> WaveGlow:
    torch.manual_seed(seed)
    model = WaveGlow(dims)
    with torch.no_grad():
        model.upsample.weight.copy_(interpolating_upsampler(dims))
        model.upsample.bias.zero_()
    model.upsample.requires_grad_(False)
    for wn in model.WN:
        for conv in [wn.start, wn.cond_layer, *wn.in_layers, *wn.res_skip_layers]:
            weight_norm(conv)   # as the reference trains; g and v are what is exported
        with torch.no_grad():
            wn.end.weight.zero_()
            wn.end.bias.zero_()
    for inv in model.convinv:
        c = inv.conv.weight.shape[0]
        q, _ = torch.linalg.qr(torch.randn(c, c))
        if torch.det(q) < 0:
            q[:, 0] = -q[:, 0]   # a rotation: log|det| = 0 and no reflection
        with torch.no_grad():
            inv.conv.weight.copy_(q[:, :, None])
    return model


def trainable(model: WaveGlow) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def trained_state(model: WaveGlow) -> dict[str, Tensor]:
    """The weights a resume needs: all but the fixed upsampler (26 MB in fp32),
    which build() makes again."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("upsample.")}


def load_trained(model: WaveGlow, state: dict[str, Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("upsample.") for k in missing):
        raise ValueError(f"checkpoint does not fit the model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")


# --------------------------------------------------------------------------
# Forward flow and loss


def flow_forward(model: WaveGlow, audio: Tensor, mel: Tensor, precision: str
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """audio (B, S) with S a multiple of n_group, mel (B, n_mel, F) with
    F*hop >= S. Returns z (B, n_group, S/n_group) fp32, sum of log s, sum of
    log det W."""
    d = model.dims
    b, samples = audio.shape
    steps = samples // d.n_group
    device = audio.device.type
    with common.autocast(device, precision):
        spect = model.upsample_mel(mel)[:, :, :steps]
    x = audio.float().unfold(1, d.n_group, d.n_group).permute(0, 2, 1)   # (B, group, steps)
    keep = torch.ones(b, 1, steps, device=audio.device, dtype=spect.dtype)
    weights = [inv.conv.weight.float().squeeze(2) for inv in model.convinv]
    log_det_total = b * steps * total_log_abs_det(weights)
    early, log_s_total = [], x.new_zeros(())
    for k in range(d.n_flows):
        if k % d.n_early_every == 0 and k > 0:
            early.append(x[:, : d.n_early_size])
            x = x[:, d.n_early_size:]
        w = weights[k]
        x = torch.einsum("oc,bct->bot", w, x)
        half = x.shape[1] // 2
        x0, x1 = x[:, :half], x[:, half:]
        with common.autocast(device, precision):
            out = model.WN[k](x0, spect, keep).float()
        shift, log_s = out[:, :half], out[:, half:]
        x = torch.cat((x0, torch.exp(log_s) * x1 + shift), 1)
        log_s_total = log_s_total + log_s.sum()
    return torch.cat(early + [x], 1), log_s_total, log_det_total


def total_log_abs_det(weights: list[Tensor]) -> Tensor:
    """Sum of log|det W| over the flows' 1x1 convolutions (the reference's
    torch.logdet: the same while det > 0, which training keeps, as it starts
    from rotations and det cannot cross 0 with a finite loss).

    Plain tensor operations instead of a cuSOLVER factorisation, so a CUDA
    graph can hold it: log|det W| is half the log-determinant of W^T W, i.e.
    the sum of the logs of its Cholesky factor's diagonal; matrices of one
    size go through together (8 x 8 and 6 x 6 here, a few dozen kernels)."""
    by_size: dict[int, list[Tensor]] = {}
    for w in weights:
        by_size.setdefault(w.shape[0], []).append(w)
    return sum(_cholesky_log_diagonal(torch.stack(ws)).sum() for ws in by_size.values())


def _cholesky_log_diagonal(w: Tensor) -> Tensor:
    """(k, n, n) -> (k,): sum of log diag(L) where L L^T = w^T w."""
    a = w.transpose(1, 2) @ w
    n = a.shape[1]
    rows = torch.arange(n, device=a.device)
    columns: list[Tensor] = []
    total = a.new_zeros(a.shape[0])
    for j in range(n):
        v = a[:, :, j]                                           # (k, n)
        if columns:
            done = torch.stack(columns, 2)                       # (k, n, j)
            v = v - (done @ done[:, j, :, None]).squeeze(2)
        diagonal = v[:, j].sqrt()
        columns.append(v / diagonal[:, None] * (rows >= j))
        total = total + diagonal.log()
    return total


def waveglow_loss(z: Tensor, log_s_total: Tensor, log_det_total: Tensor, sigma: float = SIGMA) -> Tensor:
    return ((z * z).sum() / (2 * sigma * sigma) - log_s_total - log_det_total) / z.numel()


# --------------------------------------------------------------------------
# Inverse flow and spectral loss (--objective spectral / hybrid)

INFERENCE_SIGMA = 0.666   # tts-batch's default noise scale, which the spectral objective trains for
# (FFT size, hop, window) of the multi-resolution STFT loss: Parallel WaveGAN's three.
SPECTRAL_RESOLUTIONS = ((1024, 120, 600), (2048, 240, 1200), (512, 50, 240))
MAGNITUDE_FLOOR = 1e-7    # added to |X|^2 before the root and the log: espeak-ng's silences are exact zeros
NEWTON_SCHULZ_STEPS = 40


def inverse_1x1(weights: list[Tensor]) -> list[Tensor]:
    """Each flow's W^-1, differentiably and in plain tensor operations (a
    cuSOLVER inverse cannot run inside a captured CUDA graph): Newton-Schulz,
    V <- V (2I - W V) from V = W^T / ||W||_F^2, which converges for any
    invertible W (every eigenvalue of I - W V starts in [0, 1) and is squared
    by each step). 40 steps reach float32 precision up to a condition number
    of about 10^4 (the trained ones are 1.2-40); matrices of one size go
    through together."""
    by_size: dict[int, list[int]] = {}
    for i, w in enumerate(weights):
        by_size.setdefault(w.shape[0], []).append(i)
    out: list[Tensor | None] = [None] * len(weights)
    for n, members in by_size.items():
        w = torch.stack([weights[i].float() for i in members])
        eye = torch.eye(n, device=w.device)
        v = w.transpose(1, 2) / w.square().sum((1, 2), keepdim=True)
        for _ in range(NEWTON_SCHULZ_STEPS):
            v = v @ (2 * eye - w @ v)
        for i, inverse in zip(members, v):
            out[i] = inverse
    return out


def flow_inverse(model: WaveGlow, inverse_weights: list[Tensor], mel: Tensor, noise: Tensor,
                 precision: str) -> Tensor:
    """What ``WaveGlow.infer`` computes, differentiably and with the noise
    given: noise (B, n_group, steps), already scaled by sigma, its first
    channels the last flow's input and then n_early_size channels for each
    early output from the last flow back; mel (B, n_mel, F) with F*hop >=
    steps*n_group. Returns audio (B, steps*n_group), fp32."""
    d = model.dims
    b, _, steps = noise.shape
    device = mel.device.type
    with common.autocast(device, precision):
        spect = model.upsample_mel(mel)[:, :, :steps]
    keep = torch.ones(b, 1, steps, device=mel.device, dtype=spect.dtype)
    n_final = inverse_weights[-1].shape[0]
    audio, unused = noise[:, :n_final], noise[:, n_final:]
    for k in reversed(range(d.n_flows)):
        half = audio.shape[1] // 2
        a0, a1 = audio[:, :half], audio[:, half:]
        with common.autocast(device, precision):
            out = model.WN[k](a0, spect, keep).float()
        shift, log_s = out[:, :half], out[:, half:]
        a1 = (a1 - shift) * torch.exp(-log_s)
        audio = torch.einsum("oc,bct->bot", inverse_weights[k], torch.cat((a0, a1), 1))
        if k % d.n_early_every == 0 and k > 0:
            audio = torch.cat((unused[:, : d.n_early_size], audio), 1)
            unused = unused[:, d.n_early_size:]
    return audio.permute(0, 2, 1).reshape(b, -1)


def spectral_loss(audio: Tensor, target: Tensor, windows: dict[int, Tensor]) -> Tensor:
    """Mean over SPECTRAL_RESOLUTIONS of spectral convergence (|| |Y| - |X| ||
    / || |X| ||, over the batch) plus the mean |log |Y| - log |X||; audio and
    target (B, S) fp32; ``windows``: Hann windows by length (spectral_windows)."""
    total = audio.new_zeros(())
    for n_fft, hop, window in SPECTRAL_RESOLUTIONS:
        ours = _stft_magnitude(audio, n_fft, hop, windows[window])
        theirs = _stft_magnitude(target, n_fft, hop, windows[window])
        convergence = torch.linalg.vector_norm(theirs - ours) / torch.linalg.vector_norm(theirs)
        total = total + convergence + (ours.log() - theirs.log()).abs().mean()
    return total / len(SPECTRAL_RESOLUTIONS)


def spectral_windows(device) -> dict[int, Tensor]:
    return {w: torch.hann_window(w, device=device) for _, _, w in SPECTRAL_RESOLUTIONS}


def _stft_magnitude(x: Tensor, n_fft: int, hop: int, window: Tensor) -> Tensor:
    spec = torch.stft(x, n_fft, hop, window.shape[0], window, return_complex=True)
    return (spec.real.square() + spec.imag.square() + MAGNITUDE_FLOOR).sqrt()


# --------------------------------------------------------------------------
# Data


class AudioSegments:
    """All training audio in memory as int16 (3 hours is ~0.5 GB); each step
    draws random segments and computes their mels on the device."""

    def __init__(self, data: Path, device: str):
        self.clips = self.read_clips(data)
        self.device = device
        self.mel = MelExtractor(MelSettings()).to(device)

    @staticmethod
    def read_clips(data: Path) -> list[Tensor]:
        """The training clips, read once into data/audio.pt: every later run
        (one per 10-minute piece) then loads one file in seconds instead of
        thousands of WAVs. gpu_run.sh makes the file before two WaveGlows
        start side by side (each making it took 190 s, not 25)."""
        uids = [uid for uid, _ in read_filelist(data / "train.psv")]
        cache = data / "audio.pt"
        if cache.exists():
            saved = torch.load(cache, map_location="cpu")
            if saved["ids"] == uids:
                return list(saved["audio"].split(saved["lengths"]))
        # A few reader threads (soundfile releases the GIL): one at a time,
        # 12,400 WAVs took 134 s on an H200 machine, a third of a call.
        with ThreadPoolExecutor(8) as pool:
            clips = list(pool.map(lambda uid: (read_wav(data / "wavs" / f"{uid}.wav") * 32768).round().short(),
                                  uids))
        common.save_checkpoint(cache, ids=uids, audio=torch.cat(clips),
                               lengths=[len(c) for c in clips])
        return clips

    def __len__(self) -> int:
        return len(self.clips)

    def batch(self, size: int, segment: int, g: torch.Generator, dither: float = 0.0
              ) -> tuple[Tensor, Tensor, Tensor]:
        """``size`` random segments of ``segment`` samples, float in [-1, 1),
        their mels, and the same segments without the dither. ``dither``:
        uniform noise of that many int16 steps (peak to peak) added to the
        audio after its mel is taken. espeak-ng's
        silences are exact zeros, and a flow's likelihood of an exact value
        has no bound: trained on them, WaveGlow's first coupling scaled
        silence by up to exp(89) (step 44,473), past float32's range, and its
        loss went NaN. With the noise the best scale of a silence is finite
        (about 2^15 / dither). The mel (the conditioning) stays that of the
        clean audio, as Tacotron2 learns it."""
        picks = torch.randint(len(self.clips), (size,), generator=g).tolist()
        audio = torch.zeros(size, segment, dtype=torch.int16)
        for row, i in enumerate(picks):
            clip = self.clips[i]
            if len(clip) >= segment:
                start = int(torch.randint(len(clip) - segment + 1, (1,), generator=g))
                audio[row] = clip[start:start + segment]
            else:
                audio[row, : len(clip)] = clip   # zero-padded, as the reference
        clean = audio.to(self.device).float() / 32768.0
        with torch.no_grad():
            mel = self.mel(clean)
        audio = clean
        if dither > 0:   # drawn on the device, from a generator seeded by g (resumable)
            noise_g = torch.Generator(self.device).manual_seed(int(torch.randint(2 ** 62, (1,), generator=g)))
            noise = torch.rand(size, segment, generator=noise_g, device=self.device) - 0.5
            audio = clean + noise * (dither / 32768.0)
        return audio, mel, clean


# --------------------------------------------------------------------------
# Progress check


class HeldOutCheck:
    """A few held-out clips through the inverse flow from their own mels (copy
    synthesis, sigma 0.666 as at inference): the mean absolute difference of
    the log-mel of what comes out from what went in. The training loss (a
    likelihood) keeps falling slowly; this says how close the audio is."""

    def __init__(self, data_folder: Path, device: str, lines: int = 4, seconds: float = 3.0):
        self.mel = MelExtractor(MelSettings()).to(device)
        samples = int(seconds * 22050) // 256 * 256
        clips = []
        for uid, _ in read_filelist(data_folder / "heldout.psv")[:lines]:
            audio = read_wav(data_folder / "wavs" / f"{uid}.wav")[:samples]
            clips.append(torch.nn.functional.pad(audio, (0, samples - len(audio))))
        self.audio = torch.stack(clips).to(device)

    @torch.no_grad()
    def __call__(self, model: WaveGlow) -> dict[str, float]:
        mel = self.mel(self.audio)
        frames = torch.full((len(mel),), mel.shape[2] - 1, device=mel.device)
        seeds = torch.arange(len(mel), device=mel.device)
        model.eval()
        try:
            audio = model.infer(mel[:, :, :-1], frames, seeds, 0.666)
        finally:
            model.train()
        again = self.mel(audio.float().clamp(-1, 1))[:, :, : mel.shape[2] - 1]
        return {"heldout_mel_l1": float((again - mel[:, :, :-1]).abs().mean())}


# --------------------------------------------------------------------------
# Export


def _weight_norm_state(model: WaveGlow) -> "OrderedDict[str, Tensor]":
    """The model's weights in NVIDIA's weight-norm names (weight_g, weight_v);
    the parametrised convolutions hold g and v as original0 / original1."""
    out = OrderedDict()
    for key, value in model.state_dict().items():
        key = key.replace(".parametrizations.weight.original0", ".weight_g")
        key = key.replace(".parametrizations.weight.original1", ".weight_v")
        out[key] = value.detach()
    return out


def _per_layer_cond(state: "OrderedDict[str, Tensor]", dims: WaveGlowDims) -> "OrderedDict[str, Tensor]":
    """DeepLearningExamples keeps one conditioning convolution per WN layer:
    split the fused one's rows (2*C per layer, layer order). Weight norm is
    per output row, so g and v split the same way."""
    rows = 2 * dims.wn_channels
    out = OrderedDict()
    for key, value in state.items():
        head, sep, what = key.partition(".cond_layer.")
        if not sep:
            out[key] = value
            continue
        for i in range(dims.wn_layers):
            out[f"{head}.cond_layers.{i}.{what}"] = value[i * rows:(i + 1) * rows].clone()
    return out


def weights_from_export(path: Path) -> tuple[dict[str, Tensor], int, dict]:
    """An export (``export``'s layout) back into the trained weights
    (``trained_state``'s names, fp32), with its step and config: a training
    run can start from a snapshot that lost its optimizer state."""
    exported, step, config = common.read_export(path)
    per_layer: dict[tuple[str, str], dict[int, Tensor]] = {}
    state: dict[str, Tensor] = {}
    for key, value in exported.items():
        if key.startswith("upsample."):
            continue   # fixed; build() makes it
        key = key.replace(".weight_g", ".parametrizations.weight.original0")
        key = key.replace(".weight_v", ".parametrizations.weight.original1")
        head, sep, rest = key.partition(".cond_layers.")
        if sep:
            layer, what = rest.split(".", 1)
            per_layer.setdefault((head, what), {})[int(layer)] = value
        else:
            state[key] = value.float()
    for (head, what), layers in per_layer.items():
        state[f"{head}.cond_layer.{what}"] = torch.cat([layers[i] for i in sorted(layers)]).float()
    return state, step, config


def export(model: WaveGlow, path: Path, step: int, objective: str) -> None:
    """DeepLearningExamples / NGC layout, fp16: {'epoch', 'config', 'state_dict'}
    with 'module.' names, weight norm as weight_g / weight_v and per-layer
    cond_layers; tts_cli.checkpoints folds and fuses them back. It carries the
    demo voice's settings (``common.DEMO_VOICE``)."""
    d = model.dims
    state = _per_layer_cond(_weight_norm_state(model), d)
    state = OrderedDict(("module." + k, v.half()) for k, v in state.items())
    config = {**common.waveglow_config(d), "sigma": SIGMA, "demo_voice_step": step,
              "demo_voice_objective": objective}
    common.save_checkpoint(path, compressed=True, epoch=step, config=config, state_dict=state,
                           **common.DEMO_VOICE)


# --------------------------------------------------------------------------
# Training loop


def train(args) -> dict:
    out: Path = args.out
    log = common.Log(out)
    budget = common.Budget(args.minutes)
    saved = common.load_checkpoint(out / "checkpoint.pt")
    dims = common.run_dims(DEMO_DIMS, args.dims, saved)
    data = AudioSegments(args.data, args.device)
    log.write(event="audio loaded", clips=len(data), seconds=round(budget.elapsed(), 1))
    model = build(dims, args.seed).to(args.device).train()
    captured = common.use_graphs(args)
    scaler = common.grad_scaler(args.device, args.precision)
    step, saved_optimizer = 0, None
    # The objective: --objective, else the one the run (or the export it
    # starts from) trained with, else the likelihood.
    if saved is not None:
        load_trained(model, saved["model"])
        scaler.load_state_dict(saved["scaler"])
        step, saved_optimizer = saved["step"], saved["optimizer"]
        objective_name = args.objective or saved.get("objective", "mle")
        log.write(event="resumed", step=step, objective=objective_name)
    elif args.init_from is not None:
        state, step, config = weights_from_export(args.init_from)
        load_trained(model, state)
        objective_name = args.objective or config.get("demo_voice_objective", "mle")
        log.write(event="started from export", path=str(args.init_from), step=step, optimizer="fresh",
                  objective=objective_name)
    else:
        objective_name = args.objective or "mle"
        log.write(event="start", trained_parameters=sum(p.numel() for p in trainable(model)),
                  utterances=len(data), objective=objective_name)
    spectral = objective_name in ("spectral", "hybrid")
    parameters = trainable(model)   # the same for every objective
    optimizer = torch.optim.Adam(parameters, lr=args.lr, capturable=captured)
    if saved_optimizer is not None:
        common.restore_optimizer(optimizer, saved_optimizer, captured, args.lr)
    # Only the likelihood needs the dither (see AudioSegments.batch); the
    # spectral objective compares spectra of the clean audio.
    dither = 0.0 if objective_name == "spectral" else args.dither
    last_save = budget.elapsed()

    check = HeldOutCheck(args.data, args.device) if args.check else None

    def save() -> None:
        common.require_few_skipped(skipped_in_a_row, args.max_skipped, step, out / "checkpoint.pt")
        common.require_finite(parameters, step, out / "checkpoint.pt")
        common.save_checkpoint(out / "checkpoint.pt", model=trained_state(model),
                               optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                               step=step, dims=asdict(dims), objective=objective_name)
        if check is not None:
            log.write(step=step, seconds=round(budget.elapsed(), 1), **check(model),
                      **common.gpu_memory(args.device))

    def batch(at_step: int) -> dict[str, Tensor]:
        # Segments (and noise) are a function of (seed, step): a resumed run continues the sequence.
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + at_step)
        audio, mel, clean = data.batch(args.batch_size, args.segment, g, dither)
        inputs = {"audio": audio, "mel": mel}
        if spectral:
            inputs["clean_audio"] = clean
            noise_g = torch.Generator(args.device).manual_seed(int(torch.randint(2 ** 62, (1,), generator=g)))
            inputs["noise"] = INFERENCE_SIGMA * torch.randn(
                args.batch_size, dims.n_group, args.segment // dims.n_group, generator=noise_g,
                device=args.device)
        return inputs

    windows = spectral_windows(args.device)

    def objective(inputs: dict[str, Tensor]) -> Tensor:
        loss = torch.zeros((), device=args.device)
        if objective_name in ("mle", "hybrid"):
            z, log_s, log_det = flow_forward(model, inputs["audio"], inputs["mel"], args.precision)
            loss = loss + waveglow_loss(z, log_s, log_det)
        if spectral:
            w_inverse = inverse_1x1([inv.conv.weight.squeeze(2) for inv in model.convinv])
            audio = flow_inverse(model, w_inverse, inputs["mel"], inputs["noise"], args.precision)
            weight = args.spectral_weight if objective_name == "hybrid" else 1.0
            loss = loss + weight * spectral_loss(audio, inputs["clean_audio"], windows)
        return loss

    # Steps whose gradient was not finite (skipped): in a row, and in all this run.
    skipped_in_a_row, skipped_in_all = (torch.zeros((), dtype=torch.long, device=args.device)
                                        for _ in range(2))

    def graph_step(inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        loss = objective(inputs)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, args.clip)
        common.skip_if_not_finite(parameters, grad_norm, skipped_in_a_row, skipped_in_all)
        optimizer.step()
        return {"loss": loss, "grad_norm": grad_norm}

    loss = torch.tensor(float("nan"))
    captured_step = None
    if captured and not budget.spent():
        # Every step has the same shapes, so one graph serves the whole run;
        # the two warm-up steps train on the batches of steps -2 and -1.
        warm_up = iter([batch(-2), batch(-1)])

        def eager_graph_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            graph_step(next(warm_up))
        common.warm_up_before_capture(eager_graph_step)
        try:
            captured_step = common.CapturedStep(graph_step, {k: v.clone() for k, v in batch(step).items()},
                                                optimizer)
        except common.CAPTURE_ERRORS as e:   # a capture this machine cannot do: go on eagerly
            log.write(event="graphs off", error=common.capture_failure(e))
        log.write(event="step captured" if captured_step else "eager", seconds=round(budget.elapsed(), 1))
    while step < args.max_steps and not budget.spent():
        inputs = batch(step)
        if captured_step is not None:
            for name, value in inputs.items():
                captured_step.inputs[name].copy_(value)
            outputs = captured_step.replay()
            loss, grad_norm = outputs["loss"], outputs["grad_norm"]
        else:
            loss = objective(inputs)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, args.clip)
            common.skip_if_not_finite(parameters, grad_norm, skipped_in_a_row, skipped_in_all)
            scaler.step(optimizer)
            scaler.update()
        step += 1
        if step % args.log_every == 0 or step == 1:
            log.write(step=step, seconds=round(budget.elapsed(), 1), loss=float(loss.detach()),
                      grad_norm=float(grad_norm), skipped=int(skipped_in_all))
            common.require_few_skipped(skipped_in_a_row, args.max_skipped, step, out / "checkpoint.pt")
            if not torch.isfinite(loss):
                common.require_finite(parameters, step, out / "checkpoint.pt")
        if budget.elapsed() - last_save > args.save_every_minutes * 60:
            save()
            last_save = budget.elapsed()
    save()
    model.eval()
    export(model, out / "demo_waveglow.pt", step, objective_name)
    log.write(event="saved", step=step, seconds=round(budget.elapsed(), 1))
    return {"step": step, "loss": float(loss.detach())}


def parse_args(argv: list[str] | None):
    p = common.training_arguments(__doc__.split("\n\n")[0], "folder made by make_data.py",
                                  {"max_steps": 10_000_000, "batch_size": 32, "lr": 2e-4, "log_every": 200})
    p.add_argument("--segment", type=int, default=SEGMENT)
    p.add_argument("--objective", choices=("spectral", "mle", "hybrid"), default=None,
                   help="mle: the reference's likelihood (a new run's default); spectral: the inverse "
                        "flow from noise at sigma 0.666 to audio, scored by a multi-resolution STFT "
                        "distance; hybrid: the likelihood plus --spectral-weight times the spectral "
                        "loss. A resumed run keeps its own unless this is given")
    p.add_argument("--spectral-weight", type=float, default=0.1,
                   help="hybrid objective: weight of the spectral loss beside the likelihood (at 0.1 "
                        "their gradients start about equal: 26.2 and 2.96 for a fresh model)")
    p.add_argument("--clip", type=float, default=100.0,
                   help="gradient-norm clip; only catches rare spikes (the reference has none)")
    p.add_argument("--dither", type=float, default=1.0,
                   help="uniform noise added to the training audio, in int16 steps peak to peak (0: none); "
                        "espeak-ng's silences are exact zeros, which the flow's likelihood rewards without bound")
    p.add_argument("--max-skipped", type=int, default=50,
                   help="stop as diverged after this many steps in a row without a finite gradient "
                        "(each is skipped)")
    p.add_argument("--dims", type=common.parse_dims, default=None,
                   help="override DEMO_DIMS, e.g. 'n_flows=4,wn_channels=8' (tests)")
    return common.finish_arguments(p, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return common.run_training(train, args, "train_waveglow.py")


if __name__ == "__main__":
    sys.exit(main())
