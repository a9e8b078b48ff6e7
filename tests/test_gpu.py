"""GPU-only checks (marked requires_cuda; CI has no GPU and skips them).

The fast paths against the plain eager path over a matrix of model shapes,
narrow and odd ones included, in fp32, fp16 and bf16, with batches of mixed
lengths: WaveGlow through the kernels (kernels.waveglow), Tacotron2's decoder
replayed from CUDA graphs through its kernels (kernels.decoder). Then the
shipped demo voice end to end on the GPU against the same command on the CPU,
and the README's main command. The measured errors are printed (run with -s);
the README states the bounds asserted here.
"""
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tts_cli import text as frontend
from tts_cli.batching import pad_sequences
from tts_cli.bench import force_lengths, random_models
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.engine import Engine, Job
from tts_cli.kernels import decoder as decoder_kernels
from tts_cli.tacotron2 import PUBLISHED_DIMS as TACOTRON2_PUBLISHED, DecodeSettings, Tacotron2, decode
from tts_cli.waveglow import PUBLISHED_DIMS as WAVEGLOW_PUBLISHED, WaveGlow, WaveGlowDims
from tts_cli.waveglow_fast import FastWaveGlow
from tiny_models import engine_settings

pytestmark = pytest.mark.requires_cuda

ROOT = Path(__file__).resolve().parent.parent
LINES = ["Printing, in the only sense with which we are at present concerned,",
         "differs from most if not from all the arts and crafts represented in the Exhibition.",
         "Hi."]
# Relative error (2-norms) of the fast path against the eager one in the
# same precision: fp32 to rounding; in fp16 and bf16 both paths round, in
# other places (the README states these bounds).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def exact_fp32():
    # fp32 means fp32 on the eager side too: cuDNN would run its convolutions in TF32
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def rel(a, b) -> float:
    a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
    return float(((a - b).norm() / b.norm()).nan_to_num(nan=float("inf")))


def random_waveglow(dims: WaveGlowDims, seed: int = 0) -> WaveGlow:
    """PyTorch's default initialisation (the ``end`` layers non-zero), the
    1x1 convolutions random rotations, on the GPU in float32."""
    torch.manual_seed(seed)
    model = WaveGlow(dims).eval()
    for conv in model.convinv:
        c = conv.conv.weight.shape[0]
        conv.conv.weight.data = torch.linalg.qr(torch.randn(c, c))[0][:, :, None]
    return model.cuda()


BASE = WaveGlowDims(n_mel=80, n_flows=4, n_group=8, n_early_every=2, n_early_size=2, wn_layers=2,
                    wn_channels=256, wn_kernel=3, upsample_kernel=1024, hop_length=256)
WAVEGLOW_SHAPES = {   # BASE changed by these; every width, narrow, odd and wide
    **{f"C{c}": {"wn_channels": c} for c in (8, 32, 80, 96, 192, 256)},
    "C32, n_mel 16": {"wn_channels": 32, "n_mel": 16},
    "C32, 8 layers": {"wn_channels": 32, "wn_layers": 8},
    "C32, 12 flows, early every 4": {"wn_channels": 32, "n_flows": 12, "n_early_every": 4},
    "C48, n_group 4, no early outputs": {"wn_channels": 48, "n_group": 4, "n_early_size": 0,
                                         "n_early_every": 4},
    "the demo voice's (C80, 2 flows, no early outputs)": {"wn_channels": 80, "n_flows": 2,
                                                          "n_early_size": 0},
    "C512, 12 flows, early every 4": {"wn_channels": 512, "n_flows": 12, "n_early_every": 4},
    "published": dataclasses.asdict(WAVEGLOW_PUBLISHED),
}


@torch.inference_mode()
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", WAVEGLOW_SHAPES.values(), ids=WAVEGLOW_SHAPES.keys())
def test_fast_waveglow_equals_the_eager_model_for_every_shape(shape, dtype):
    """FastWaveGlow through the kernels against WaveGlow.infer in the same
    dtype: three lines of 40, 31 and 17 frames in one batch, sigma 0.5;
    every sample finite; each line alone as in the batch."""
    model = random_waveglow(dataclasses.replace(BASE, **shape))
    fast = FastWaveGlow(model, dtype)                       # folded from the float32 weights
    assert fast.use_kernels and fast.channels % 64 == 0
    inverse = model.inverse_weights()
    eager = copy.deepcopy(model).to(dtype)
    frames = torch.tensor([40, 31, 17], device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    mel = (torch.randn(3, model.dims.n_mel, 40, device="cuda", generator=g)
           * (torch.arange(40, device="cuda")[None, None] < frames[:, None, None])).to(dtype)
    seeds = torch.tensor([3, 4, 5], device="cuda")
    expected = eager.infer(mel, frames, seeds, 0.5, inverse)
    got = fast.infer(mel, frames, seeds, 0.5)
    err = rel(got, expected)
    print(f"{dtype}: FastWaveGlow vs eager, {fast.channels} channels run: audio rel err {err:.2e}")
    assert bool(got.isfinite().all()) and err < TOLERANCE[dtype]
    for i in range(3):
        n = int(frames[i])
        alone = fast.infer(mel[i:i + 1, :, :n], frames[i:i + 1], seeds[i:i + 1], 0.5)
        assert rel(alone[0], got[i, : n * 256]) < TOLERANCE[dtype] / 10


def random_tacotron2(dims, seed: int = 0) -> Tacotron2:
    torch.manual_seed(seed)
    return Tacotron2(dims).eval().cuda()


TACOTRON2_SHAPES = {
    "published": TACOTRON2_PUBLISHED,
    "small odd widths": dataclasses.replace(
        TACOTRON2_PUBLISHED, embedding_dim=34, encoder_convs=2, n_mel=13, prenet_dims=(23, 29),
        attention_rnn_dim=37, decoder_rnn_dim=41, attention_dim=19, location_filters=5, location_kernel=7,
        postnet_convs=3, postnet_dim=17),
    "the demo voice's": dataclasses.replace(
        TACOTRON2_PUBLISHED, embedding_dim=192, attention_rnn_dim=384, decoder_rnn_dim=384, location_filters=32,
        postnet_dim=128),
    "three prenet layers": dataclasses.replace(TACOTRON2_PUBLISHED, prenet_dims=(256, 200, 128)),
}


@torch.inference_mode()
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("dims", TACOTRON2_SHAPES.values(), ids=TACOTRON2_SHAPES.keys())
def test_graphed_decoder_with_its_kernels_equals_the_eager_decode_for_every_shape(dims, dtype):
    """GraphedDecoder (CUDA graphs and kernels.decoder) against the eager
    decode in the same dtype: gate-driven stops (37 steps at most, fp32,
    where rounding cannot move a stop) and forced lengths (the bench's
    stop rule, ``bench.force_lengths``); the same frame counts, mels within
    TOLERANCE; each line alone (graphs of one row, which run the few-row
    kernels) as in the batch."""
    model = random_tacotron2(dims).to(dtype)
    ids, lengths = pad_sequences([frontend.text_to_sequence(t) for t in LINES], device="cuda")
    seeds = torch.tensor([1, 2, 3], device="cuda")
    cases = [(DecodeSettings(), True)]
    if dtype == torch.float32:
        cases.insert(0, (DecodeSettings(max_decoder_steps=37), False))
    for cfg, forced in cases:
        if forced:
            force_lengths(model)
        graphed = GraphedDecoder(model, cfg)
        assert graphed.attention is not None and graphed.few_rows is not None
        assert (graphed.prenet is not None) == (len(dims.prenet_dims) == 2)
        mel, frames, truncated, path = graphed.decode(ids, lengths, seeds)
        ref_mel, ref_frames, ref_truncated, ref_path = decode(model, ids, lengths, seeds, cfg)
        assert frames.tolist() == ref_frames.tolist() and truncated.tolist() == ref_truncated.tolist()
        err = rel(mel, ref_mel)
        print(f"{dtype}: graphed decoder vs eager, {frames.tolist()} frames: mel rel err {err:.2e}")
        assert err < TOLERANCE[dtype]
        # the attention's path: its peaks alike; its positions where no two
        # symbols tie (random weights spread the attention thinly)
        width = int(frames.max())
        live = torch.arange(width, device="cuda")[None, :] < frames[:, None]
        same = (path.positions[:, :width] == ref_path.positions[:, :width])[live].float().mean().item()
        peak_err = (path.peaks[:, :width].float() - ref_path.peaks[:, :width].float())[live].abs().max().item()
        print(f"{dtype}: attention path: {same:.1%} of positions equal, peaks within {peak_err:.1e}")
        assert same > (0.95 if dtype == torch.float32 else 0.8) and peak_err < 10 * TOLERANCE[dtype]
        for i in range(3):
            n = int(lengths[i])
            alone, _, _, _ = graphed.decode(ids[i: i + 1, :n], lengths[i: i + 1], seeds[i: i + 1])
            assert rel(alone[0], mel[i, :, : alone.shape[2]]) < TOLERANCE[dtype]


@torch.inference_mode()
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_the_graphed_decoders_alignment_measures_are_the_eager_decoders(dtype):
    """On models whose attention is sharp by construction (aligned_models.py),
    from CUDA graphs and kernels as from the eager decode: in fp32 the same
    frames and measures; in every dtype the same verdicts (a model's stay
    or move turns on near-equal energies, which half precision can tip a
    frame either way)."""
    from aligned_models import aligned_tacotron2
    from tts_cli.config import Settings
    from tts_cli.engine import measured
    from tts_cli.tacotron2 import alignment_measures
    thresholds = Settings()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(1, 140, (n,), generator=g).tolist() for n in (7, 25, 60, 3, 41)]
    ids, lengths = pad_sequences(seqs, device="cuda")
    seeds = torch.arange(5, device="cuda")
    cfg = DecodeSettings(max_decoder_steps=600)

    def verdicts(d):
        return [bool(health.failures(thresholds)) for health in measured(d, lengths, ids.shape[1])]
    kinds = [dict(), dict(frames_per_symbol=6), dict(repeat=True), dict(jump=2)]
    if dtype == torch.float32:   # its gate fires where the prenet's sum crosses a line: rounding moves it
        kinds.append(dict(flaky=True))
    for kind in kinds:
        model = aligned_tacotron2(**kind).cuda().to(dtype)
        graphed = GraphedDecoder(model, cfg).decode(ids, lengths, seeds)
        eager = decode(model, ids, lengths, seeds, cfg)
        ours, theirs = (alignment_measures(d.attention, d.frames, lengths, ids.shape[1]) for d in (graphed, eager))
        assert verdicts(graphed) == verdicts(eager), kind
        if dtype == torch.float32 and "jump" not in kind:
            assert graphed.frames.tolist() == eager.frames.tolist(), kind
            for name in ours:
                assert torch.allclose(ours[name].float(), theirs[name].float(), atol=1e-4), (kind, name)


def engine(dtype, device=torch.device("cuda")):
    """An engine on random_models(), its lines' lengths forced as the bench forces them."""
    settings = engine_settings(prenet_dropout=0.5)
    e = Engine(*random_models(device), device, dtype, settings)
    force_lengths(e.tacotron2)
    return e


def jobs():
    return [Job(frontend.text_to_sequence(t), seed=i) for i, t in enumerate(LINES)]


@pytest.fixture(scope="module")
def fp32_results():
    return engine(torch.float32).synthesize(jobs())


@pytest.mark.parametrize("dtype, mel_tol, audio_tol", [
    (torch.float16, 0.05, 0.2), (torch.bfloat16, 0.2, 0.5)])
def test_half_precisions_are_finite_and_close_to_fp32(fp32_results, dtype, mel_tol, audio_tol):
    results = engine(dtype).synthesize(jobs())
    for r, ref in zip(results, fp32_results):
        assert torch.isfinite(torch.as_tensor(r.audio)).all()
        mel_err, audio_err = rel(r.mel, ref.mel), rel(r.audio, ref.audio)
        print(f"{dtype}: frames {r.frames} mel rel err {mel_err:.2e}, audio rel err {audio_err:.2e}")
        assert mel_err < mel_tol and audio_err < audio_tol


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_the_published_shapes_fast_engine_equals_the_eager_one_and_a_line_alone_equals_it_batched(dtype):
    fast = engine(dtype)
    together = fast.synthesize(jobs())
    for r, ref in zip(together, fast.eager().synthesize(jobs())):
        assert r.frames == ref.frames
        mel_err, audio_err = rel(r.mel, ref.mel), rel(r.audio, ref.audio)
        print(f"{dtype}: engine fast vs eager mel rel err {mel_err:.2e}, audio rel err {audio_err:.2e}")
        assert mel_err < TOLERANCE[dtype] and audio_err < TOLERANCE[dtype]
    for job, r in zip(jobs(), together):
        alone = fast.synthesize([job])[0]
        err = rel(r.audio, alone.audio)
        print(f"{dtype}: batched vs alone audio rel err {err:.2e}")
        assert err < TOLERANCE[dtype]


def test_the_prenet_and_lstm_kernels_equal_their_modules_at_the_published_widths():
    """kernels.decoder.prenet_step and lstm_cell on the GPU, all three
    precisions, inputs read through wider row strides: within one output
    rounding of the float32 module on the same rounded weights; each row
    alone bitwise as in a batch."""
    from tts_cli.tacotron2 import Prenet
    for dtype, tol in [(torch.float32, 1e-5), (torch.float16, 5e-3), (torch.bfloat16, 3e-2)]:
        torch.manual_seed(0)
        module = Prenet(TACOTRON2_PUBLISHED).cuda().eval().to(dtype).float()
        w1, w2 = (layer.linear_layer.weight.detach().to(dtype).contiguous() for layer in module.layers)
        frame = torch.randn(5, 81, device="cuda").to(dtype)[:, :80]   # row stride 81
        masks = [((torch.rand(5, 256, device="cuda") > 0.5) * 2.0).to(dtype) for _ in range(2)]
        out = decoder_kernels.prenet_step(frame, w1, w2, masks, torch.empty(5, 256, device="cuda", dtype=dtype))
        with torch.no_grad():
            expected = module(frame.float(), [m.float() for m in masks])
        assert (out.float() - expected).abs().max().item() < tol
        for i in range(5):
            alone = decoder_kernels.prenet_step(frame[i: i + 1], w1, w2, [m[i: i + 1] for m in masks],
                                                torch.empty(1, 256, device="cuda", dtype=dtype))
            assert torch.equal(alone[0], out[i])
        for in_a, in_b, hidden in [(256, 512, 1024), (1024, 512, 1024)]:
            cell = torch.nn.LSTMCell(in_a + in_b, hidden).cuda().to(dtype).float()
            weight, bias = decoder_kernels.fuse_lstm_weights(cell.weight_ih.to(dtype), cell.weight_hh.to(dtype),
                                                             cell.bias_ih.to(dtype), cell.bias_hh.to(dtype))
            wide = torch.randn(5, in_a + in_b + 8, device="cuda").to(dtype)
            a, b = wide[:, :in_a], wide[:, in_a + 8:]        # row stride I_a + I_b + 8
            h, c = (torch.randn(5, hidden, device="cuda").to(dtype) for _ in range(2))
            got = decoder_kernels.lstm_cell(a, b, h, c, weight, bias, torch.empty_like(h), torch.empty_like(c))
            with torch.no_grad():
                ref = cell(torch.cat((a, b), 1).float(), (h.float(), c.float()))
            for x, y in zip(got, ref):
                assert (x.float() - y).abs().max().item() < tol


@torch.inference_mode()
@pytest.mark.parametrize("fft_rows", [None, 4096, 16384])
def test_the_batched_denoiser_equals_the_item_by_item_one_on_the_gpu(fft_rows):
    from tts_cli.waveglow import Denoiser
    g = torch.Generator().manual_seed(5)
    denoiser = Denoiser(torch.rand(513, 1, generator=g).cuda())
    denoiser.fft_rows = fft_rows
    lengths = torch.tensor([513, 22050 * 3, 256 * 200 + 17, 4096])
    audio = torch.randn(len(lengths), int(lengths.max()), generator=g).cuda()
    batched = denoiser.batch(audio, lengths.cuda(), 0.3)
    worst = max((batched[i, :n] - denoiser(audio[i, :n].clone(), 0.3)).abs().max().item()
                for i, n in enumerate(lengths.tolist()))
    print(f"batched denoiser (FFT rows {fft_rows}) vs item by item on CUDA: max abs err {worst:.2e}")
    assert worst < 1e-4


def test_queueing_the_next_batch_early_gives_the_same_files_in_the_same_order_on_the_gpu():
    # pinned host buffers and asynchronous copies: a batch handed on before its
    # copies finished would show up here as another batch's (or stale) audio
    e = engine(torch.float16)
    batches = [[job] for job in jobs()] + [jobs()]
    early = list(e.synthesize_all(batches))
    assert [jobs_b for jobs_b, _ in early] == batches
    for batch, (_, out_b) in zip(batches, early, strict=True):
        for a, b in zip(e.synthesize(batch), out_b, strict=True):
            assert a.frames == b.frames and rel(a.audio, b.audio) < 1e-3 and rel(a.mel, b.mel) < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two visible CUDA devices")
def test_an_engine_on_the_second_gpu_captures_and_runs_there_alone():
    """--device cuda:1: the graphs, streams and kernels go to GPU 1 (each
    thread's current device is GPU 0 until set), nothing is allocated on
    GPU 0, and the audio is GPU 0's for the same lines."""
    torch.cuda.synchronize(0)
    on_first = torch.cuda.memory_allocated(0)
    second = torch.device("cuda:1")
    e = engine(torch.float16, second)
    [(_, made)] = list(e.synthesize_all([jobs()]))
    assert all(g.memory.device == second for g in e.graphed.graphs.values())
    assert torch.cuda.memory_allocated(0) == on_first
    assert torch.cuda.memory_allocated(1) > 0
    first = engine(torch.float16).synthesize(jobs())
    for a, b in zip(made, first, strict=True):
        assert a.frames == b.frames and rel(a.audio, b.audio) < 1e-3


def run_cli(*args, cwd: Path, **environment: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           **environment}
    return subprocess.run([sys.executable, "-m", "tts_cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_the_demo_voice_on_the_gpu_gives_the_cpu_s_frames_and_audio(tmp_path):
    """The shipped demo voice (WaveGlow of 80 channels, 2 flows) end to end
    on the GPU against the same command on the CPU, with the randomness off
    and fp32: the same frame counts, every WAV within 1e-4."""
    corpus = ROOT / "examples" / "corpus.txt"
    same = ["--prenet-dropout", "0", "--sigma", "0", "--precision", "fp32", "--sample-format", "float32",
            "--seed", "3", "-q"]
    for device in ("cuda", "cpu"):
        done = run_cli(corpus, "-o", tmp_path / device, "--device", device, *same, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    gpu, cpu = manifest(tmp_path / "cuda"), manifest(tmp_path / "cpu")
    assert [r["mel_frames"] for r in gpu] == [r["mel_frames"] for r in cpu]
    assert [r["status"] for r in gpu] == [r["status"] for r in cpu]
    worst = 0.0
    for a, b in zip(gpu, cpu):
        x, _ = sf.read(tmp_path / "cuda" / a["audio_filepath"], dtype="float32")
        y, _ = sf.read(tmp_path / "cpu" / b["audio_filepath"], dtype="float32")
        worst = max(worst, float(np.abs(x - y).max()))
    print(f"demo voice, GPU vs CPU fp32: frames {[r['mel_frames'] for r in gpu]}, max abs WAV diff {worst:.2e}")
    assert worst < 1e-4


def test_the_readme_s_main_command_runs_on_the_gpu_with_the_demo_voice(tmp_path):
    """``tts-batch examples/corpus.txt -o out/`` with no NVIDIA files: the
    demo voice in fp16, the CUDA default; every line ok."""
    done = run_cli(ROOT / "examples" / "corpus.txt", "-o", tmp_path / "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "demo voice" in done.stderr
    rows = manifest(tmp_path / "out")
    assert len(rows) == 5 and all(r["status"] == "ok" and r["duration"] > 0.5 for r in rows), rows
    for r in rows:
        audio, rate = sf.read(tmp_path / "out" / r["audio_filepath"], dtype="float32")
        assert rate == 22050 and np.isfinite(audio).all() and np.abs(audio).max() > 1e-3


def test_a_first_run_says_it_compiles_the_kernels_and_a_second_does_not(tmp_path):
    """With an empty Triton cache, the run says before it starts that it
    compiles the voice's kernels and where they are kept; the next run,
    with them cached, says nothing of it."""
    corpus = ROOT / "examples" / "corpus.txt"
    cache = tmp_path / "triton-cache"
    said = []
    for run in ("first", "second"):
        done = run_cli(corpus, "-o", tmp_path / run, cwd=tmp_path, TRITON_CACHE_DIR=str(cache))
        assert done.returncode == 0, done.stderr[-2000:]
        said.append([line for line in done.stderr.splitlines() if "compiling its GPU kernels" in line])
    assert len(said[0]) == 1 and str(cache) in said[0][0], said
    assert said[1] == []
