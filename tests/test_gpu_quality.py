"""GPU-only: the fast paths on trained weights (marked requires_cuda).

Random weights drive no gate where a trained voice does, so an
approximation can pass every random-weights test and still cost a voice
its words. Here the kernels run on the demo voice (its Tacotron2 and its
constructed WaveGlow), on the trained WaveGlow the demo-voice recipe keeps
in snapshot/, and on the published WaveGlow shape with its gates held
mostly shut as trained voices hold theirs. Each fast path in fp16 and bf16
must be at least as close to the eager model in fp32 as the eager model in
the same dtype is (SNR over real mels from the demo voice's Tacotron2);
the measured figures are printed (-s) and BENCHMARKS.md records them.
"""
import copy
import statistics
from pathlib import Path

import pytest
import torch

from tts_cli import text as frontend
from tts_cli.bench import random_models
from tts_cli.checkpoints import load_waveglow
from tts_cli.config import Settings
from tts_cli.engine import Engine, Job
from tts_cli.kernels import waveglow as wg_kernels
from tts_cli.loading import load_models
from tts_cli.quality import snr_db, voice_mels, waveglow_fidelity
from tts_cli.voice import demo_voice
from tts_cli.waveglow import WaveGlow
from tiny_models import engine_settings, force_lengths

pytestmark = pytest.mark.requires_cuda

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT_WAVEGLOW = ROOT / "recipes" / "demo-voice" / "snapshot" / "demo_waveglow.pt"
HALF = [torch.float16, torch.bfloat16]
# 64 LJSpeech transcripts the demo voice speaks (the published shape gets
# the first 16 of their mels: it is 60 times the demo WaveGlow's work)
TEXTS = [line.split("|")[1] for line in
         (ROOT / "tts_cli" / "data" / "ljspeech_2000.psv").read_text().splitlines()[200:264]]


@pytest.fixture(scope="module")
def demo():
    tacotron2, waveglow = load_models(Settings(device="cuda"), demo_voice())
    return tacotron2, waveglow, voice_mels(tacotron2, TEXTS, torch.device("cuda"))


def gates_held_shut(waveglow: WaveGlow, seed: int = 5) -> WaveGlow:
    """``waveglow`` with each layer's sigmoid half biased to about -6 (spread
    3): most gates nearly closed, where sigmoid's value is small and its
    relative accuracy is what counts, as in trained voices (the demo
    voice's gate inputs have median -6.8; a tenth lie below -10.7)."""
    g = torch.Generator().manual_seed(seed)
    for wn in waveglow.WN:
        for layer in wn.in_layers:
            c = layer.bias.shape[0] // 2
            layer.bias.data[c:] += -6 + 3 * torch.randn(c, generator=g)
    return waveglow


def waveglows(demo_waveglow):
    yield "demo voice", demo_waveglow, None
    sd, _ = load_waveglow(SNAPSHOT_WAVEGLOW)
    yield "trained (recipe snapshot)", WaveGlow.from_state_dict(sd), None
    yield "published shape, gates held shut", gates_held_shut(random_models(torch.device("cuda"))[1]), 16


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_the_fast_waveglow_is_as_close_to_fp32_as_the_eager_model_in_its_dtype_on_trained_weights(demo, dtype):
    _, demo_waveglow, (mel, frames, seeds) = demo
    for name, waveglow, lines in waveglows(demo_waveglow):
        fidelity = waveglow_fidelity(waveglow, mel[:lines], frames[:lines], seeds[:lines], dtype)
        print(f"{dtype} {name}: fast {fidelity.fast:.1f} dB, eager {fidelity.eager:.1f} dB against fp32")
        assert fidelity.margin >= 0, (name, fidelity)


def distinct_counts(jobs: list[Job]) -> list[Job]:
    """The jobs, each symbol count's first one only."""
    first = {}
    for job in jobs:
        first.setdefault(len(job.ids), job)
    return list(first.values())


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_the_graphed_decoders_error_is_at_most_twice_the_eager_decoders_on_the_demo_voice(demo, dtype):
    """Tacotron2 decoding the same lines to the same lengths (fp32's), the
    same dropout: each line's mel SNR against eager fp32, and the median over
    the lines. The decoder feeds back its own frames, so a rounding can grow
    along a line until its attention takes another path, in either path and
    on different lines (pooled over the lines, one such line decides the
    figure: eager fp16 gave 22.3 dB on one set of lines and 27.3 on
    another). The median line is robust to those: the fast decoder's error
    energy there is at most twice eager's (3 dB), where a decoder that loses
    its way loses tens of dB. (fp16: the graphed decoder's median line sits
    about 2 dB below eager's, at about 50 dB; bf16: about 3 dB above.)
    The lengths are forced by a stop rule, which reads a line's symbol
    count, so the lines are those of distinct counts (49 of the 64), in one
    batch."""
    tacotron2, waveglow, (_, fp32_frames, _) = demo
    settings = engine_settings()
    every = [Job(frontend.text_to_sequence(t), seed=i) for i, t in enumerate(TEXTS)]
    jobs = distinct_counts(every)
    frames = fp32_frames[[job.seed for job in jobs]]
    n_mel = tacotron2.dims.n_mel
    as_rows = lambda mel: mel.float().transpose(1, 2).reshape(mel.shape[0], -1)

    def forced(engine):
        force_lengths(engine.tacotron2, {len(job.ids): int(f) for job, f in zip(jobs, frames.tolist())})
        return engine
    reference = as_rows(forced(Engine(copy.deepcopy(tacotron2), copy.deepcopy(waveglow), torch.device("cuda"),
                                      torch.float32, settings, fast=False)).decode_only(jobs).mel)
    fast = forced(Engine(copy.deepcopy(tacotron2), copy.deepcopy(waveglow), torch.device("cuda"), dtype, settings))

    def median_snr(engine):
        mel = as_rows(engine.decode_only(jobs).mel)
        return statistics.median(snr_db(mel[i: i + 1], reference[i: i + 1], frames[i: i + 1] * n_mel)
                                 for i in range(len(jobs)))
    snr = {"fast": median_snr(fast), "eager": median_snr(fast.eager())}
    print(f"{dtype}: decoder mels, median line: fast {snr['fast']:.1f} dB, eager {snr['eager']:.1f} dB "
          f"against fp32")
    assert snr["fast"] >= snr["eager"] - 3.0, snr


@torch.inference_mode()
@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
def test_the_kernels_gate_keeps_its_relative_accuracy_where_gates_are_nearly_shut(dtype):
    """The taps+cond+gate kernel's activations against tanh(a) sigmoid(s) in
    float64, for a in [-2.25, 2.25] and s in [-17, 1]: within three
    roundings of the 16-bit output, relative to the value (plus the output's
    smallest step; the tanh instruction's error is about one, the output's
    rounding at most one),
    even where sigmoid(s) is 1e-7. The product is arranged so that z = x's
    channel, exactly: tanh column j reads a = x_j, sigmoid column j reads
    s = 4 x_j - 8 (middle tap, weight 1 and 4; bias 0 and -8)."""
    c, win, phases = 128, 64, 4
    rows = wg_kernels.PhaseRows(items=2, frames=256, phases=phases)
    g = torch.Generator().manual_seed(3)
    x = ((torch.rand(rows.n_rows, c, generator=g) * 4.5 - 2.25).cuda().to(dtype))
    keep = torch.ones(rows.n_rows, device="cuda", dtype=dtype)
    windows = torch.zeros(rows.item_rows, win, device="cuda", dtype=dtype)
    w_cond = torch.zeros(win, phases, 2 * c, device="cuda", dtype=dtype)
    scale = torch.zeros(c, 2 * c)
    scale[:, :c], scale[:, c:] = torch.eye(c), 4 * torch.eye(c)
    w_taps = torch.zeros(3 * c, 2 * c)
    w_taps[c: 2 * c] = scale
    w_taps = wg_kernels.paired_gate_columns(w_taps, c).cuda().to(dtype)
    bias = wg_kernels.paired_gate_columns(torch.cat([torch.zeros(c), torch.full((c,), -8.0)]), c)
    acts = wg_kernels.taps_cond_gate(x, keep, windows, w_cond, bias.cuda().to(dtype), w_taps, rows, 1,
                                     torch.empty_like(x), fast_tanh=True)
    a = x.double()
    exact = torch.tanh(a) * torch.sigmoid(4 * a - 8)
    eps = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[dtype]
    smallest = {torch.float16: 2.0 ** -24, torch.bfloat16: 2.0 ** -133}[dtype]
    error = (acts.double() - exact).abs()
    worst = (error / (exact.abs() * eps + smallest)).max().item()
    print(f"{dtype}: gate error at most {worst:.2f} roundings of the value")
    assert worst <= 3.0
