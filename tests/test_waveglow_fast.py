"""The matrix-product WaveGlow computes the same function as the plain model."""
import pytest
import torch

from tts_cli.waveglow_fast import FastWaveGlow, shifted_taps
from tiny_models import N_MEL, tiny_waveglow


def test_shifted_taps_are_zero_outside_the_sequence():
    x = torch.arange(1, 6, dtype=torch.float32).view(1, 5, 1)
    taps = shifted_taps(x, 2)[0]
    assert taps[:, 0].tolist() == [0, 0, 1, 2, 3]
    assert taps[:, 1].tolist() == [1, 2, 3, 4, 5]
    assert taps[:, 2].tolist() == [3, 4, 5, 0, 0]


@torch.inference_mode()
def test_fast_waveglow_equals_the_plain_model_on_a_padded_batch():
    model = tiny_waveglow(seed=7)
    fast = FastWaveGlow(model, torch.float32)
    frames = torch.tensor([4, 23, 9])
    mel = torch.randn(3, N_MEL, 23) * (torch.arange(23)[None, None, :] < frames[:, None, None])
    seeds = torch.tensor([5, 6, 7])
    expected = model.infer(mel, frames, seeds, sigma=0.666)
    got = fast.infer(mel, frames, seeds, sigma=0.666)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5 * expected.abs().max())


def test_the_gate_form_is_checked_and_float32_always_gets_the_exact_gate():
    model = tiny_waveglow(seed=7)
    with pytest.raises(ValueError, match="tanh_approx_pairs"):
        FastWaveGlow(model, torch.float16, gate="tanh")
    assert FastWaveGlow(model, torch.float32, gate="tanh_approx").gate == "exact"
    half = FastWaveGlow(model, torch.float16, gate="tanh_approx_pairs")
    exact = half.with_kernels(gate="exact")
    assert (half.gate, exact.gate) == ("tanh_approx_pairs", "exact")
    assert exact.flows[0].cond is half.flows[0].cond       # the same weights, not a copy


def test_the_waveglow_memory_budget_is_about_a_million_rows_at_15_gib_for_the_published_model():
    from tts_cli.waveglow import WaveGlowDims
    from tts_cli.waveglow_fast import waveglow_rows_within
    published = WaveGlowDims(n_mel=80, n_flows=12, n_group=8, n_early_every=4, n_early_size=2,
                             wn_layers=8, wn_channels=256, wn_kernel=3, upsample_kernel=1024, hop_length=256)
    rows = waveglow_rows_within(15 * 2 ** 30, published, torch.float16)
    assert 1.0e6 < rows < 1.1e6              # 30 values of 2 bytes per channel-row, ~15 KB a row
    assert waveglow_rows_within(30 * 2 ** 30, published, torch.float16) == pytest.approx(2 * rows, rel=1e-6)
    assert waveglow_rows_within(15 * 2 ** 30, published, torch.float32) == pytest.approx(rows / 2, rel=0.01)
    assert waveglow_rows_within(1, published, torch.float16) == 1


def test_on_a_gpu_kind_already_measured_only_its_best_config_is_compiled(monkeypatch):
    # A first run compiles every autotuning candidate: 13-14 s of a 19.3 s
    # start-up on an H200. Where the bench measured the winner, only it is.
    pytest.importorskip("triton")
    from tts_cli import kernels
    args = {"x_ptr": object(), "DOT_PRECISION": "tf32", "WIN": 320}
    for (kernel, capability, c), best in kernels.MEASURED_BEST.items():
        candidates = {"taps_gate_paired": kernels._TAPS_GATE_PAIRED_CONFIGS,
                      "taps_cond_gate": kernels._TAPS_GATE_PAIRED_CONFIGS,
                      "residual_update": kernels._RESIDUAL_CONFIGS}[kernel]
        prune = kernels._fitting_or_measured(
            kernel, kernels._fitting_phase_blocks if kernel == "taps_cond_gate" else kernels._fitting)
        monkeypatch.setattr(kernels, "_capability", lambda tensor: capability)
        chosen = prune(candidates, args, C=c)
        assert len(chosen) == 1 and kernels._same_config(chosen[0], best)
        assert prune(candidates, {**args, "DOT_PRECISION": "ieee"}, C=c) == [kernels._FLOAT32_CONFIG]
        assert len(prune(candidates, args, C=c // 2)) > 1, "another width: the autotuner chooses"
        monkeypatch.setattr(kernels, "_capability", lambda tensor: (8, 0))
        assert prune(candidates, args, C=c) == kernels._fitting(candidates, args, C=c), "another GPU kind"


def test_phase_major_rows_put_each_group_step_where_the_fused_conditioning_kernel_reads_it():
    from tts_cli.kernels import PHASE_ROWS_MULTIPLE, PhaseRows
    rows = PhaseRows(items=3, frames=5, phases=4)
    assert rows.phase_rows == PHASE_ROWS_MULTIPLE and rows.n_rows == 4 * PHASE_ROWS_MULTIPLE
    y = torch.randn(3, 5 * 4, 2)                        # (items, group steps, channels)
    laid = rows.gather(y)
    for b, t in [(0, 0), (1, 7), (2, 19)]:               # step t = 4q + p lies at row p R + (b F + q)
        q, p = divmod(t, 4)
        assert torch.equal(laid[p * rows.phase_rows + b * 5 + q], y[b, t])
    dummy = laid.view(4, rows.phase_rows, 2)[:, rows.item_rows:]
    assert dummy.numel() > 0 and not dummy.any()         # rows no step maps to hold zeros
    assert torch.equal(rows.scatter(laid), y)


@torch.inference_mode()
def test_where_the_fused_conditioning_kernel_cannot_run_its_mode_is_plain_torch_without_a_second_copy():
    model = tiny_waveglow(seed=7)
    fast = FastWaveGlow(model, torch.float32, kernels_mode="matmul_fused_cond")
    assert all(w.phase_cond is None for w in fast.flows)   # CPU: the kernel's weights are not built
    frames = torch.tensor([4, 9])
    mel = torch.randn(2, N_MEL, 9) * (torch.arange(9)[None, None, :] < frames[:, None, None])
    seeds = torch.tensor([5, 6])
    assert torch.equal(fast.infer(mel, frames, seeds, 0.666),
                       fast.with_kernels("elementwise").infer(mel, frames, seeds, 0.666))
