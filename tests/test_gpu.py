"""GPU-only checks (marked requires_cuda; CI has no GPU and skips them).

Full-size random models in the published shapes: every precision gives finite
output close to fp32, and batched output equals batch-of-one on the GPU too.
The measured errors are printed (run with -s) and recorded in the README.
"""
import pytest
import torch

from tts_cli.bench import random_models
from tts_cli.engine import Engine, Job, SynthesisSettings
from tts_cli.tacotron2 import DecodeSettings
from tts_cli import text as frontend

pytestmark = pytest.mark.requires_cuda

LINES = ["Printing, in the only sense with which we are at present concerned,",
         "differs from most if not from all the arts and crafts represented in the Exhibition.",
         "Hi."]


def engine(dtype):
    settings = SynthesisSettings(decode=DecodeSettings(prenet_dropout=0.5))
    return Engine(*random_models(), torch.device("cuda"), dtype, settings)


def jobs():
    return [Job(frontend.text_to_sequence(t), seed=i, frames=round(5.7 * len(t)))
            for i, t in enumerate(LINES)]


def rel(a, b):
    return float(((torch.as_tensor(a) - torch.as_tensor(b)).norm() / torch.as_tensor(b).norm()))


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_batched_equals_alone_on_the_gpu(dtype):
    e = engine(dtype)
    together = e.synthesize(jobs())
    for job, r in zip(jobs(), together):
        alone = e.synthesize([job])[0]
        err = rel(r.audio, alone.audio)
        print(f"{dtype}: batched vs alone audio rel err {err:.2e}")
        assert err < (1e-4 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)])
def test_fast_path_equals_the_plain_eager_path(dtype, tol):
    fast = engine(dtype)
    plain = fast.eager()
    for r, ref in zip(fast.synthesize(jobs()), plain.synthesize(jobs())):
        assert r.frames == ref.frames
        mel_err, audio_err = rel(r.mel, ref.mel), rel(r.audio, ref.audio)
        print(f"{dtype}: fast vs eager mel rel err {mel_err:.2e}, audio rel err {audio_err:.2e}")
        assert mel_err < tol and audio_err < tol


def test_graphed_decoder_stops_like_the_eager_one():
    from tts_cli.tacotron2 import decode
    e = engine(torch.float32)
    e.graphed.cfg = DecodeSettings(max_decoder_steps=37)   # gate-driven, random weights
    lines = [frontend.text_to_sequence(t) for t in LINES]
    from tts_cli.batching import pad_sequences
    ids, lengths = pad_sequences(lines, device="cuda")
    seeds = torch.tensor([1, 2, 3], device="cuda")
    g_mel, g_frames, g_trunc = e.graphed.decode(ids, lengths, seeds)
    mel, frames, trunc = decode(e.tacotron2, ids, lengths, seeds, DecodeSettings(max_decoder_steps=37))
    assert g_frames.tolist() == frames.tolist() and g_trunc.tolist() == trunc.tolist()
    assert rel(g_mel.cpu(), mel.cpu()) < 1e-4


def test_fused_kernels_equal_the_plain_torch_coupling(monkeypatch):
    from tts_cli import kernels
    from tts_cli.waveglow_fast import FastWaveGlow
    _, waveglow = random_models()
    fast = FastWaveGlow(waveglow.cuda(), torch.float32)
    frames = torch.tensor([40, 13, 27], device="cuda")
    mel = torch.randn(3, 80, 40, device="cuda") * (torch.arange(40, device="cuda")[None, None] < frames[:, None, None])
    seeds = torch.tensor([1, 2, 3], device="cuda")
    with torch.inference_mode():
        fused = fast.infer(mel, frames, seeds, 0.666)
        monkeypatch.setattr(kernels, "available", lambda: False)
        plain = fast.infer(mel, frames, seeds, 0.666)
    err = rel(fused.cpu(), plain.cpu())
    print(f"fused kernels vs plain torch coupling, fp32: rel err {err:.2e}")
    assert err < 1e-4


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)])
def test_matmul_fused_kernels_equal_the_plain_eager_path(dtype, tol):
    """FastWaveGlow's kernels_mode "matmul" (taps and gate, residual update
    fused into Triton products), same tolerances as the elementwise kernels."""
    from tts_cli import kernels
    assert kernels.available()
    fast = engine(dtype)
    plain = fast.eager()
    fast.fast_waveglow = fast.fast_waveglow.with_kernels("matmul")
    for r, ref in zip(fast.synthesize(jobs()), plain.synthesize(jobs())):
        assert r.frames == ref.frames and torch.isfinite(torch.as_tensor(r.audio)).all()
        audio_err = rel(r.audio, ref.audio)
        print(f"{dtype}: matmul-fused kernels vs eager audio rel err {audio_err:.2e}")
        assert audio_err < tol


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_graphed_decoder_with_the_fused_attention_equals_the_eager_decode(dtype, tol):
    """GraphedDecoder(fused_attention=True): each step's attention in one
    Triton launch (kernels.attention_step); same stops as the eager decode,
    gate-driven (37 steps at most) and at forced lengths, mels within the
    fast-vs-eager tolerance; each line alone as in the batch (within the
    batched-vs-alone tolerance: the other kernels are cuBLAS's)."""
    from tts_cli import kernels
    from tts_cli.batching import pad_sequences
    from tts_cli.decoder_graph import GraphedDecoder
    from tts_cli.tacotron2 import decode
    assert kernels.available()
    e = engine(dtype)
    ids, lengths = pad_sequences([frontend.text_to_sequence(t) for t in LINES], device="cuda")
    seeds = torch.tensor([1, 2, 3], device="cuda")
    forced = torch.tensor([j.frames for j in jobs()], device="cuda")
    for cfg, override in [(DecodeSettings(max_decoder_steps=37), None), (DecodeSettings(), forced)]:
        fused = GraphedDecoder(e.tacotron2, cfg, fused_attention=True)
        assert fused.attention is not None
        mel, frames, truncated = fused.decode(ids, lengths, seeds, override)
        ref_mel, ref_frames, ref_truncated = decode(e.tacotron2, ids, lengths, seeds, cfg, override)
        assert frames.tolist() == ref_frames.tolist() and truncated.tolist() == ref_truncated.tolist()
        err = rel(mel.float().cpu(), ref_mel.float().cpu())
        print(f"{dtype}: fused attention vs eager, {frames.tolist()} frames: mel rel err {err:.2e}")
        assert err < tol
        for i in range(3):   # each line alone: its own (smaller) batch and memory buckets
            n = int(lengths[i])
            alone, _, _ = fused.decode(ids[i: i + 1, :n], lengths[i: i + 1], seeds[i: i + 1],
                                       None if override is None else override[i: i + 1])
            alone_err = rel(mel[i, :, : alone.shape[2]].float().cpu(), alone[0].float().cpu())
            assert alone_err < (1e-4 if dtype == torch.float32 else 5e-2)
