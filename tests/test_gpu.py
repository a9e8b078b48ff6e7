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
from tts_cli.waveglow_fast import FastWaveGlow
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


@pytest.mark.parametrize("mode", FastWaveGlow.KERNELS_MODES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)])
def test_every_waveglow_kernels_mode_equals_the_plain_eager_path(mode, dtype, tol):
    """Each FastWaveGlow kernels_mode (whichever the engine runs by default):
    the fused elementwise passes, the matmul-fused products, those with
    the gate's columns paired, those over item-padded rows loaded by the
    tensor memory accelerator, and the paired product from persistent
    programs, against the plain eager path."""
    from tts_cli import kernels
    assert kernels.available()
    fast = engine(dtype)
    plain = fast.eager()
    fast.fast_waveglow = fast.fast_waveglow.with_kernels(mode)
    for r, ref in zip(fast.synthesize(jobs()), plain.synthesize(jobs())):
        assert r.frames == ref.frames and torch.isfinite(torch.as_tensor(r.audio)).all()
        audio_err = rel(r.audio, ref.audio)
        print(f"{dtype}: {mode} kernels vs eager audio rel err {audio_err:.2e}")
        assert audio_err < tol


def check_graphed_decoder_against_the_eager_decode(dtype, tol, alone_tol, split_attention=False, **fusions):
    """GraphedDecoder(**fusions) against the eager decode: same stops,
    gate-driven (37 steps at most) and at forced lengths, mels within
    ``tol``; each line alone as in the batch (within ``alone_tol``: the
    other kernels are cuBLAS's). With ``split_attention`` (and the fused
    attention), every graph takes the few-row path's split attention."""
    from tts_cli import kernels
    from tts_cli.batching import pad_sequences
    from tts_cli.decoder_graph import GraphedDecoder, _FusedAttention
    from tts_cli.tacotron2 import decode
    assert kernels.available()
    e = engine(dtype)
    ids, lengths = pad_sequences([frontend.text_to_sequence(t) for t in LINES], device="cuda")
    seeds = torch.tensor([1, 2, 3], device="cuda")
    forced = torch.tensor([j.frames for j in jobs()], device="cuda")
    for cfg, override in [(DecodeSettings(max_decoder_steps=37), None), (DecodeSettings(), forced)]:
        fused = GraphedDecoder(e.tacotron2, cfg, **fusions)
        assert (fused.attention is not None) == fusions.get("fused_attention", False)
        if split_attention:
            fused.attention = _FusedAttention(e.tacotron2.decoder.attention_layer, split_query=True)
        assert (fused.prenet is not None) == fusions.get("fused_prenet", False)
        assert (fused.output is not None) == fusions.get("fused_output", False)
        assert (fused.few_rows is not None) == fusions.get("fused_rnn", False)
        if fused.few_rows is not None:   # the split attention comes with the fused attention
            assert (fused.few_rows.attention is not None) == fusions.get("fused_attention", False)
        mel, frames, truncated = fused.decode(ids, lengths, seeds, override)
        ref_mel, ref_frames, ref_truncated = decode(e.tacotron2, ids, lengths, seeds, cfg, override)
        assert frames.tolist() == ref_frames.tolist() and truncated.tolist() == ref_truncated.tolist()
        err = rel(mel.float().cpu(), ref_mel.float().cpu())
        print(f"{dtype}: {sorted(fusions)} vs eager, {frames.tolist()} frames: mel rel err {err:.2e}")
        assert err < tol
        for i in range(3):   # each line alone: its own (smaller) batch and memory buckets
            n = int(lengths[i])
            alone, _, _ = fused.decode(ids[i: i + 1, :n], lengths[i: i + 1], seeds[i: i + 1],
                                       None if override is None else override[i: i + 1])
            alone_err = rel(mel[i, :, : alone.shape[2]].float().cpu(), alone[0].float().cpu())
            print(f"  line {i} alone vs batched: mel rel err {alone_err:.2e}")
            assert alone_err < alone_tol


@pytest.mark.parametrize("split_attention", [False, True], ids=["one-launch", "split-query"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_graphed_decoder_with_the_fused_attention_equals_the_eager_decode(dtype, tol, split_attention):
    """GraphedDecoder(fused_attention=True): each step's attention in one
    Triton launch (kernels.attention_step); with split_attention, the
    few-row path's split attention, its query product in a launch of its own
    first (kernels.query_product), in the batch of 3 too."""
    check_graphed_decoder_against_the_eager_decode(
        dtype, tol, 1e-4 if dtype == torch.float32 else 5e-2, split_attention=split_attention,
        fused_attention=True)


@pytest.mark.parametrize("dtype, tol, alone_tol", [
    (torch.float32, 1e-4, 1e-4), (torch.float16, 2e-2, 5e-2), (torch.bfloat16, 1e-1, 5e-2)])
def test_graphed_decoder_with_the_fused_lstm_cells_equals_the_eager_decode(dtype, tol, alone_tol):
    """GraphedDecoder(fused_rnn=True): each of the two LSTM cells in one
    Triton launch (kernels.lstm_cell). bfloat16: the kernel keeps the gates
    in float32 where the module rounds both products to bfloat16."""
    check_graphed_decoder_against_the_eager_decode(dtype, tol, alone_tol, fused_rnn=True,
                                                   fused_rnn_max_batch=64)   # in the batch of 3 too


@pytest.mark.parametrize("dtype, tol, alone_tol", [
    (torch.float32, 1e-4, 1e-4), (torch.float16, 2e-2, 5e-2), (torch.bfloat16, 1e-1, 5e-2)])
def test_graphed_decoder_with_every_fusion_equals_the_eager_decode(dtype, tol, alone_tol):
    """Every decoder fusion on: the attention, the prenet and each LSTM
    cell in one Triton launch (kernels.attention_step, kernels.prenet_step,
    kernels.lstm_cell), the projection and the gate as one product.
    bfloat16: the fused kernels keep float32 where the modules round to
    bfloat16 between products."""
    check_graphed_decoder_against_the_eager_decode(
        dtype, tol, alone_tol, fused_attention=True, fused_prenet=True, fused_output=True,
        fused_rnn=True, fused_rnn_max_batch=64)


def test_the_fused_prenet_kernel_equals_the_prenet_module_on_the_gpu():
    """kernels.prenet_step on the GPU, all three precisions, published widths,
    with and without dropout masks: within one output rounding of the float32
    module on the same rounded weights; each row alone bitwise as in a batch."""
    from tts_cli import kernels
    from tts_cli.tacotron2 import PUBLISHED_DIMS, Prenet
    assert kernels.available()
    for dtype, tol in [(torch.float32, 1e-5), (torch.float16, 5e-3), (torch.bfloat16, 2e-2)]:
        torch.manual_seed(0)
        module = Prenet(PUBLISHED_DIMS).cuda().eval().to(dtype).float()
        w1, w2 = (layer.linear_layer.weight.detach().to(dtype).contiguous() for layer in module.layers)
        frame = torch.randn(5, 81, device="cuda").to(dtype)[:, :80]   # row stride 81
        masks = [((torch.rand(5, 256, device="cuda") > 0.5) * 2.0).to(dtype) for _ in range(2)]
        for keep in (masks, None):
            out = torch.empty(5, 256, device="cuda", dtype=dtype)
            kernels.prenet_step(frame, w1, w2, keep, out)
            with torch.no_grad():
                expected = module(frame.float(), None if keep is None else [m.float() for m in keep])
            err = (out.float() - expected).abs().max().item()
            print(f"{dtype}: prenet_step vs module, masks {keep is not None}: max abs err {err:.2e}")
            assert err < tol
            for i in range(5):
                alone = torch.empty(1, 256, device="cuda", dtype=dtype)
                kernels.prenet_step(frame[i: i + 1], w1, w2,
                                    None if keep is None else [m[i: i + 1] for m in keep], alone)
                assert torch.equal(alone[0], out[i])


def test_the_fused_lstm_cell_kernel_equals_nn_lstmcell_on_the_gpu():
    """kernels.lstm_cell on the GPU, all three precisions, both published
    cells (attention LSTM 256 + 512 -> 1024, decoder LSTM 1024 + 512 ->
    1024), inputs read through a wider row stride: within one output
    rounding of the float32 nn.LSTMCell on the same rounded weights and
    inputs; each row alone bitwise as in a batch."""
    from tts_cli import kernels
    assert kernels.available()
    for dtype, tol in [(torch.float32, 1e-5), (torch.float16, 5e-3), (torch.bfloat16, 3e-2)]:
        for in_a, in_b, hidden in [(256, 512, 1024), (1024, 512, 1024)]:
            torch.manual_seed(0)
            cell = torch.nn.LSTMCell(in_a + in_b, hidden).cuda().to(dtype).float()
            weight, bias = kernels.fuse_lstm_weights(cell.weight_ih.to(dtype), cell.weight_hh.to(dtype),
                                                     cell.bias_ih.to(dtype), cell.bias_hh.to(dtype))
            wide = torch.randn(5, in_a + in_b + 8, device="cuda").to(dtype)
            a, b = wide[:, :in_a], wide[:, in_a + 8:]        # row stride I_a + I_b + 8
            h = torch.randn(5, hidden, device="cuda").to(dtype)
            c = torch.randn(5, hidden, device="cuda").to(dtype)
            out = kernels.lstm_cell(a, b, h, c, weight, bias, torch.empty_like(h), torch.empty_like(c))
            with torch.no_grad():
                expected = cell(torch.cat((a, b), 1).float(), (h.float(), c.float()))
            for name, x, y in zip("hc", out, expected):
                err = (x.float() - y).abs().max().item()
                print(f"{dtype}: lstm_cell vs nn.LSTMCell, {in_a}+{in_b} -> {hidden}: {name}' max abs err {err:.2e}")
                assert err < tol
            for i in range(5):
                alone = kernels.lstm_cell(a[i: i + 1], b[i: i + 1], h[i: i + 1], c[i: i + 1], weight, bias,
                                          torch.empty_like(h[:1]), torch.empty_like(c[:1]))
                assert torch.equal(alone[0][0], out[0][i]) and torch.equal(alone[1][0], out[1][i])


@torch.inference_mode()
@pytest.mark.parametrize("gate", ["tanh_approx", "tanh_approx_pairs"])
@pytest.mark.parametrize("dtype, audio_tol", [(torch.float16, 2e-2), (torch.bfloat16, 5e-2)])
def test_each_approximate_gate_stays_within_a_half_precision_rounding_of_the_exact_one(gate, dtype, audio_tol):
    """The taps+gate kernel's gated activations with the GPU's tanh against
    the exact gate (|acts| <= 1, so a float16 ulp is at most 2^-11 and a
    bfloat16 one 2^-8), then the whole fast path's audio against the eager one."""
    from tts_cli import kernels
    g = torch.Generator().manual_seed(11)
    n, c, t = 4 * 1000, 256, 1000
    x = torch.randn(n, c, generator=g).cuda().to(dtype)
    keep = (torch.arange(n) % t < 900).cuda().to(dtype)
    cond = (torch.randn(n, 2 * c * 8, generator=g) * 2).cuda().to(dtype)
    w = kernels.pair_gate_columns((torch.randn(3 * c, 2 * c, generator=g) / 16).cuda().to(dtype))
    exact, approx = (kernels.taps_gate(x, keep, cond, 5, w, t, 16, torch.empty(n, c, device="cuda", dtype=dtype),
                                       paired=True, gate=form) for form in ("exact", gate))
    worst = (approx.float() - exact.float()).abs().max().item()
    ulp = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
    print(f"{dtype}: gate {gate} vs exact, max abs diff {worst:.2e} ({worst / ulp:.1f} ulp at 1)")
    assert worst <= 4 * ulp
    fast = engine(dtype)
    fast.fast_waveglow = fast.fast_waveglow.with_kernels(gate=gate)
    for r, ref in zip(fast.synthesize(jobs()), fast.eager().synthesize(jobs())):
        assert rel(r.audio, ref.audio) < audio_tol


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
    e.overlap_batches = False
    plain = list(e.synthesize_all(batches))
    e.overlap_batches = True
    early = list(e.synthesize_all(batches))
    for (jobs_a, out_a), (jobs_b, out_b) in zip(plain, early, strict=True):
        assert jobs_a == jobs_b
        for a, b in zip(out_a, out_b, strict=True):
            assert a.frames == b.frames and rel(a.audio, b.audio) < 1e-3 and rel(a.mel, b.mel) < 1e-3
