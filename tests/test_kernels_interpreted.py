"""The matmul-fused Triton kernels (kernels.taps_gate, kernels.residual_update
and FastWaveGlow's "matmul" coupling) and Tacotron2's fused attention step
(kernels.attention_step, alone and in the graph decoder's loop) and fused
prenet (kernels.prenet_step, alone and in the loop with every fusion on)
and fused LSTM cell (kernels.lstm_cell, alone, in the loop on its own and
with every fusion on) against plain torch, on the CPU, through Triton's
interpreter.

TRITON_INTERPRET must be set before Triton is imported, so the checks run in a
fresh Python process: this file run as a script. Skipped where Triton is not
installed (CI); tests/test_gpu.py checks the same path on a GPU.

The interpreter's tl.dot multiplies bfloat16 operands as their raw bits
(numpy has no bfloat16), so bfloat16 is checked on the GPU only; prenet_step
(and lstm_cell) has no tl.dot and is checked in bfloat16 here too, but the interpreter
truncates float32 to bfloat16 where a GPU rounds (one ulp). Autotuning
needs a GPU too: here every launch uses one fixed config (kernels._FIXED_CONFIG).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = [  # rows (111 and 672) are a multiple of neither BLOCK_M
    {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2},
]


def worst(got, expected) -> float:
    """Max abs difference; NaN anywhere counts as infinitely wrong."""
    return (got.float() - expected).abs().nan_to_num(nan=float("inf")).max().item()


def kernel_errors(dtype_name: str) -> dict:
    """Max abs errors of both kernels against torch, per config and layer, on
    B=3 items of T=37 steps (valid lengths 37, 20, 5), C=32, L=3, d=1, 2, 4."""
    import torch
    from tts_cli import kernels
    from tts_cli.waveglow_fast import shifted_taps
    dtype = getattr(torch, dtype_name)
    errors = {"taps_gate": 0.0, "residual_update": 0.0, "paired_vs_unpaired": 0.0, "persistent_vs_paired": 0.0}
    for config in CONFIGS:
        kernels._FIXED_CONFIG = config
        torch.manual_seed(0)
        b, t, c, layers = 3, 37, 32, 3
        keep = (torch.arange(t)[None] < torch.tensor([37, 20, 5])[:, None]).to(dtype)
        x = torch.randn(b, t, c).to(dtype)
        x[1, 25:] = float("nan")      # past an item's length nothing may be read
        cond = torch.randn(b * t, 2 * c * layers).to(dtype)
        acts = torch.full((b * t, layers * c), float("nan"), dtype=dtype)
        for i in range(layers):
            d, cols = 2 ** i, slice(c * i, c * (i + 1))
            w_taps = (torch.randn(3 * c, 2 * c) / (3 * c) ** 0.5).to(dtype)
            kernels.taps_gate(x.view(-1, c), keep.view(-1), cond, i, w_taps, t, d, out=acts[:, cols])
            kept = torch.where(keep[..., None] > 0, x.float(), 0.0)
            z = shifted_taps(kept, d).view(-1, 3 * c) @ w_taps.float() + cond[:, 2 * c * i: 2 * c * (i + 1)].float()
            gated = torch.tanh(z[:, :c]) * torch.sigmoid(z[:, c:])
            errors["taps_gate"] = max(errors["taps_gate"], worst(acts[:, cols], gated))
            paired = torch.full((b * t, c), float("nan"), dtype=dtype)
            kernels.taps_gate(x.view(-1, c), keep.view(-1), cond, i, kernels.pair_gate_columns(w_taps), t, d,
                              out=paired, paired=True)
            errors["paired_vs_unpaired"] = max(errors["paired_vs_unpaired"], worst(paired, acts[:, cols].float()))
            persistent = torch.full((b * t, c), float("nan"), dtype=dtype)   # 3 programs, several tiles each
            kernels.taps_gate(x.view(-1, c), keep.view(-1), cond, i, kernels.pair_gate_columns(w_taps), t, d,
                              out=persistent, paired=True, persistent=True)
            errors["persistent_vs_paired"] = max(errors["persistent_vs_paired"], worst(persistent, paired.float()))
            # the GPU's tanh instruction does not exist here: the exact gate runs instead of failing
            approx = torch.full((b * t, c), float("nan"), dtype=dtype)
            kernels.taps_gate(x.view(-1, c), keep.view(-1), cond, i, kernels.pair_gate_columns(w_taps), t, d,
                              out=approx, paired=True, gate="tanh_approx_pairs")
            errors["approx_gate_vs_exact_on_cpu"] = max(errors.get("approx_gate_vs_exact_on_cpu", 0.0),
                                                        worst(approx, paired.float()))
            w_res, b_res = (torch.randn(c, c) / c ** 0.5).to(dtype), torch.randn(c).to(dtype)
            updated = x.view(-1, c).float() + acts[:, cols].float() @ w_res.float() + b_res.float()
            kernels.residual_update(acts[:, cols], w_res, b_res, x.view(-1, c))
            ok = ~updated.isnan()
            assert torch.equal(x.view(-1, c).isnan(), ~ok)
            errors["residual_update"] = max(errors["residual_update"], worst(x.view(-1, c)[ok], updated[ok]))
    return errors


def _coupling_test_model(seed: int):
    """A small random WaveGlow (C = 32, 3 layers, rotations for the 1x1
    convolutions), float32, eval mode, drawn after torch.manual_seed(seed)."""
    import dataclasses
    import torch
    from tts_cli.waveglow import WaveGlow
    from tiny_models import WAVEGLOW_DIMS
    torch.manual_seed(seed)
    model = WaveGlow(dataclasses.replace(WAVEGLOW_DIMS, wn_layers=3, wn_channels=32))
    for p in model.parameters():
        p.data.normal_(0.0, 0.05)
    for conv in model.convinv:
        q, _ = torch.linalg.qr(torch.randn(conv.conv.weight.shape[0], conv.conv.weight.shape[0]))
        conv.conv.weight.data = q[:, :, None]
    return model.eval()


def rel(a, b) -> float:
    """Relative error of a against b (2-norms)."""
    return ((a - b).norm() / b.norm()).item()


def _inverse_case(dtype_name: str, seed: int, frames: list[int]):
    """The set-up the whole-inverse checks share: one fixed kernel config, a
    _coupling_test_model, a batch of mels zero past each item's length, its
    float32 inverse, and the plain torch FastWaveGlow in the dtype. Returns
    (dtype, model, mel, frames, seeds, reference, plain)."""
    import torch
    from tts_cli import kernels
    from tts_cli.waveglow_fast import FastWaveGlow
    from tiny_models import N_MEL
    dtype = getattr(torch, dtype_name)
    kernels._FIXED_CONFIG = CONFIGS[1]
    model = _coupling_test_model(seed=seed)
    frames = torch.tensor(frames)
    longest = int(frames.max())
    mel = torch.randn(len(frames), N_MEL, longest) * (torch.arange(longest)[None, None, :] < frames[:, None, None])
    seeds = torch.arange(5, 5 + len(frames))
    with torch.inference_mode():
        reference = model.infer(mel, frames, seeds, sigma=0.666)
        plain = FastWaveGlow(model, dtype)
    return dtype, model, mel, frames, seeds, reference, plain


def coupling_errors(dtype_name: str) -> dict:
    """Relative errors (C=32, L=3, 4 flows; items of 4, 7 and 2 frames, so
    T = 224 steps) of each flow's coupling output, the matmul-fused form
    against the plain torch one in the same dtype, and of whole WaveGlow
    inverses: the matmul-fused against the plain one, and each against the
    float32 model."""
    import torch
    from tts_cli.waveglow_fast import FastWaveGlow
    dtype, model, mel, frames, seeds, reference, plain = _inverse_case(dtype_name, seed=3, frames=[4, 7, 2])
    with torch.inference_mode():
        matmul = FastWaveGlow(model, dtype, kernels_mode="matmul")
        matmul._fused_coupling = lambda x: matmul._coupling_fused_matmul   # CPU, interpreted
        paired = matmul.with_kernels("matmul_paired")
        paired._fused_coupling = lambda x: paired._coupling_fused_matmul
        persistent = matmul.with_kernels("matmul_persistent")
        persistent._fused_coupling = lambda x: persistent._coupling_fused_matmul
        padded = matmul.with_kernels("matmul_padded")
        padded._fused_coupling = lambda x: padded._coupling_fused_padded
        got_plain = plain.infer(mel, frames, seeds, 0.666)
        got_matmul = matmul.infer(mel, frames, seeds, 0.666)
        got_paired = paired.infer(mel, frames, seeds, 0.666)
        got_padded = padded.infer(mel, frames, seeds, 0.666)
        got_persistent = persistent.infer(mel, frames, seeds, 0.666)
        windows = plain.frame_windows(mel)
        keep = (torch.arange(7 * 32)[None, :] < frames[:, None] * 32)[..., None].to(dtype)
        coupling = 0.0
        for w in plain.flows:
            a0 = torch.randn(3, 7 * 32, w.start.shape[0])
            expected = plain.coupling(w, a0, windows, keep).float()
            coupling = max(coupling, rel(matmul.coupling(w, a0, windows, keep).float(), expected))
        # every row of the padded form's coupling (past each length too) against the plain one
        coupling_padded = max(rel(padded.coupling(wp, a0, windows, keep).float(), plain.coupling(w, a0, windows, keep).float())
                              for w, wp in zip(plain.flows, padded.flows)
                              for a0 in [torch.randn(3, 7 * 32, w.start.shape[0])])
    assert got_matmul.isfinite().all()
    return {"coupling_matmul_vs_plain": coupling, "matmul_vs_plain": rel(got_matmul, got_plain),
            "paired_vs_matmul": (got_paired - got_matmul).abs().max().item(),
            "padded_vs_paired": (got_padded - got_paired).abs().max().item(),
            "persistent_vs_paired": (got_persistent - got_paired).abs().max().item(),
            "coupling_padded_vs_plain": coupling_padded, "matmul_vs_fp32_model": rel(got_matmul, reference),
            "plain_vs_fp32_model": rel(got_plain, reference)}


def fused_cond_errors(dtype_name: str) -> dict:
    """FastWaveGlow "matmul_fused_cond" (the conditioning inside the taps+gate
    product, rows phase-major) against the plain torch path and the float32
    model: the whole inverse, every flow's coupling, and each item alone
    against the batch (3 items, 8 frames, C = 32, 3 layers, dilations to 4,
    so taps cross frames and phases and reach past items' lengths)."""
    import torch
    dtype, model, mel, frames, seeds, reference, plain = _inverse_case(dtype_name, seed=4, frames=[5, 8, 2])
    with torch.inference_mode():
        fused = plain.with_kernels("matmul_fused_cond")
        fused._fused_coupling = lambda x: fused._coupling_fused_cond   # CPU, interpreted
        got_plain = plain.infer(mel, frames, seeds, 0.666)
        got_fused = fused.infer(mel, frames, seeds, 0.666)
        alone = max((got_fused[i, : frames[i] * 256] - fused.infer(mel[i:i + 1, :, : frames[i]], frames[i:i + 1],
                                                                     seeds[i:i + 1], 0.666)[0]).abs().max().item()
                    for i in range(3))
        windows = plain.frame_windows(mel)
        keep = (torch.arange(8 * 32)[None, :] < frames[:, None] * 32)[..., None].to(dtype)
        coupling = 0.0
        for w, wf in zip(plain.flows, fused.flows):
            a0 = torch.randn(3, 8 * 32, w.start.shape[0])
            valid = keep.bool().expand(-1, -1, 2 * w.start.shape[0])   # rows past a length are not compared
            expected = plain.coupling(w, a0, windows, keep).float()[valid]
            coupling = max(coupling, rel(fused.coupling(wf, a0, windows, keep).float()[valid], expected))
    assert got_fused.isfinite().all()
    return {"fused_cond_vs_plain": rel(got_fused, got_plain), "coupling_fused_cond_vs_plain": coupling,
            "alone_vs_batched": alone, "fused_cond_vs_fp32_model": rel(got_fused, reference),
            "plain_vs_fp32_model": rel(got_plain, reference)}


ATTENTION_SIZES = {  # R, A, F, K, E, T; rows valid for T, 20 and 5 positions
    "tiny": (32, 16, 4, 7, 24, 37),
    "published_widths": (1024, 128, 32, 31, 512, 70),
}


def attention_errors(dtype_name: str) -> dict:
    """kernels.attention_step against the module path (Attention.forward and
    the cumulative add, in float32 on the same rounded inputs): max abs
    errors per output and size; and the largest difference between a row
    computed in a batch of 3 and alone (B=1), and alone with its memory cut
    to a shorter padded length (32 positions; zeros past its 20 valid ones,
    as the decoder keeps them), which must both be 0."""
    import dataclasses
    import torch
    from tts_cli import kernels
    from tts_cli.tacotron2 import PUBLISHED_DIMS, Attention
    dtype = getattr(torch, dtype_name)
    errors = {"context": 0.0, "weights": 0.0, "weights_cum": 0.0,
              "batched_vs_alone": 0.0, "cropped_vs_alone": 0.0}
    for name, (r, a, f, k, e, t) in ATTENTION_SIZES.items():
        torch.manual_seed(1)
        dims = dataclasses.replace(PUBLISHED_DIMS, attention_rnn_dim=r, attention_dim=a,
                                   location_filters=f, location_kernel=k, embedding_dim=e)
        # float32 module on the weights as rounded to dtype: the reference
        module = Attention(dims).eval().to(dtype).float()
        lengths = torch.tensor([t, 20, 5])
        invalid = torch.arange(t)[None] >= lengths[:, None]
        valid = (~invalid).float()
        ah = torch.randn(3, r).to(dtype)
        memory = (torch.randn(3, t, e) * valid[..., None]).to(dtype)
        with torch.no_grad():
            processed = module.memory_layer(memory.float()).to(dtype)
        weights = torch.softmax(torch.randn(3, t) * 2 - 30 * invalid, 1) * valid
        weights, cum = weights.to(dtype), (weights * 5 * torch.rand(3, t)).to(dtype)
        loc = module.location_layer
        w_location = kernels.fold_location_weight(loc.location_conv.conv.weight,
                                                  loc.location_dense.linear_layer.weight).to(dtype)
        w_query = module.query_layer.linear_layer.weight.detach().to(dtype)
        v = module.v.linear_layer.weight.detach().reshape(-1).to(dtype)

        def fused(rows, length=t, split_query=False):
            out = (torch.full((len(rows), e), float("nan"), dtype=dtype),
                   torch.full((len(rows), length), float("nan"), dtype=dtype),
                   torch.full((len(rows), length), float("nan"), dtype=dtype))
            query = None
            if split_query:
                query = kernels.query_product(ah[rows], w_query, torch.full((len(rows), a), float("nan")))
            kernels.attention_step(ah[rows], w_query, w_location, weights[rows, :length].contiguous(),
                                   cum[rows, :length].contiguous(), processed[rows, :length].contiguous(),
                                   v, invalid[rows, :length].contiguous(), memory[rows, :length].contiguous(),
                                   *out, query=query)
            return out

        got = fused([0, 1, 2])
        with torch.no_grad():
            context, new_weights = module(ah.float(), memory.float(), processed.float(),
                                          torch.stack((weights, cum), 1).float(), invalid)
        expected = (context, new_weights, cum.float() + new_weights)
        for key, x, y in zip(("context", "weights", "weights_cum"), got, expected):
            errors[key] = max(errors[key], worst(x, y))
        for i in range(3):
            alone = fused([i])
            errors["batched_vs_alone"] = max(errors["batched_vs_alone"], *(
                worst(x[i: i + 1], y.float()) for x, y in zip(got, alone)))
        cropped, alone = fused([1], 32), fused([1])
        errors["cropped_vs_alone"] = max(errors["cropped_vs_alone"], worst(cropped[0], alone[0].float()),
                                         worst(cropped[1], alone[1][:, :32].float()),
                                         worst(cropped[2], alone[2][:, :32].float()))
        split = fused([0, 1, 2], split_query=True)
        errors["split_query_vs_one_launch"] = max(errors.get("split_query_vs_one_launch", 0.0),
                                                  *(worst(x, y.float()) for x, y in zip(split, got)))
        print(name, errors, file=sys.stderr)
    return errors


PRENET_SIZES = {  # K (n_mel), H1, H2
    "tiny": (16, 24, 40),
    "published_widths": (80, 256, 256),
}


def prenet_errors(dtype_name: str) -> dict:
    """kernels.prenet_step against the Prenet module (in float32 on the same
    rounded inputs), with dropout masks and without, the frame read through
    a row stride wider than its width (as the fused output leaves it), in
    two launch shapes (default, and 16 outputs per program: several
    programs per row, the last one partly past H2): max abs errors; and the
    largest difference between a row computed in a batch of 3 and alone,
    which must be 0."""
    import dataclasses
    import torch
    from tts_cli import kernels
    from tts_cli.tacotron2 import PUBLISHED_DIMS, Prenet, prenet_keep_masks
    dtype = getattr(torch, dtype_name)
    errors = {"out": 0.0, "out_no_masks": 0.0, "batched_vs_alone": 0.0}
    default_block = kernels._PRENET_BLOCK_O
    for name, (k, h1, h2) in PRENET_SIZES.items():
        torch.manual_seed(2)
        dims = dataclasses.replace(PUBLISHED_DIMS, n_mel=k, prenet_dims=(h1, h2))
        module = Prenet(dims).eval().to(dtype).float()   # the reference, on the rounded weights
        w1, w2 = (layer.linear_layer.weight.detach().to(dtype).contiguous() for layer in module.layers)
        frame = torch.randn(3, k + 3).to(dtype)[:, :k]  # row stride k + 3
        masks = [((torch.rand(3, h) > 0.5) * 2.0).to(dtype) for h in (h1, h2)]

        def fused(rows, keep):
            out = torch.full((len(rows), h2), float("nan"), dtype=dtype)
            return kernels.prenet_step(frame[rows], w1, w2,
                                       [m[rows].contiguous() for m in masks] if keep else None, out)

        for block in (default_block, 16):
            kernels._PRENET_BLOCK_O = block
            with torch.no_grad():
                expected = module(frame.float(), [m.float() for m in masks])
                expected_plain = module(frame.float(), None)
            got = fused([0, 1, 2], True)
            errors["out"] = max(errors["out"], worst(got, expected))
            errors["out_no_masks"] = max(errors["out_no_masks"], worst(fused([0, 1, 2], False), expected_plain))
            for i in range(3):
                errors["batched_vs_alone"] = max(errors["batched_vs_alone"],
                                                 worst(got[i: i + 1], fused([i], True).float()))
        kernels._PRENET_BLOCK_O = default_block
        # masks drawn in the kernel from (seed, step): the masks
        # prenet_keep_masks draws, so the same output bitwise
        seeds, steps = torch.tensor([4, 2 ** 31 - 1, 77]), torch.tensor([9, 9, 9])
        drawn = prenet_keep_masks(seeds, steps, dims, 0.5, dtype)
        out = torch.full((3, h2), float("nan"), dtype=dtype)
        kernels.prenet_step(frame, w1, w2, kernels.StepDropout(seeds, torch.tensor([5]), 4, 0.5), out)
        given = kernels.prenet_step(frame, w1, w2, drawn, torch.empty(3, h2, dtype=dtype))
        errors["drawn_vs_given_masks"] = max(errors.get("drawn_vs_given_masks", 0.0), worst(out, given))
        print(name, errors, file=sys.stderr)
    return errors


LSTM_SIZES = {  # I_a, I_b, H, batch, launch shapes (BLOCK_J, BLOCK_K); None: the default
    # H = 52 is a multiple of neither BLOCK_J: the last program of a row is
    # partly past H; BLOCK_K = 16 splits every input into several blocks
    "tiny": (24, 40, 52, 5, [None, (16, 16)]),
    # the attention LSTM's widths, in wide blocks (the interpreter runs one
    # program at a time); tests/test_gpu.py checks the default shape there
    "published_widths": (256, 512, 1024, 2, [(64, 256)]),
}


def _lstm_case(in_a: int, in_b: int, hidden: int, rows: int, dtype):
    """A random LSTM cell and inputs for kernels.lstm_cell: the
    reference (a float32 cell on the weights as rounded to dtype), its fused
    weight and bias, and (a, b, h, c) in dtype, a and b read through a row
    stride of I_a + I_b + 7."""
    import torch
    from tts_cli import kernels
    torch.manual_seed(4)
    cell = torch.nn.LSTMCell(in_a + in_b, hidden).to(dtype).float()
    weight, bias = kernels.fuse_lstm_weights(cell.weight_ih.to(dtype), cell.weight_hh.to(dtype),
                                             cell.bias_ih.to(dtype), cell.bias_hh.to(dtype))
    assert bias.dtype == torch.float32 and weight.dtype == dtype
    wide = torch.randn(rows, in_a + in_b + 7).to(dtype)
    a, b = wide[:, :in_a], wide[:, in_a + 7:]
    h, c = torch.randn(rows, hidden).to(dtype), (2 * torch.randn(rows, hidden)).to(dtype)
    return cell, weight, bias, (a, b, h, c)


def lstm_errors(dtype_name: str) -> dict:
    """kernels.lstm_cell against nn.LSTMCell on cat((a, b), 1) (in float32
    on the same rounded weights and inputs), a and b read through row
    strides wider than their widths, in the launch shapes of LSTM_SIZES: max
    abs errors of h' and c'; and the largest difference between a row
    computed in the batch and alone, which must be 0."""
    import torch
    from tts_cli import kernels
    dtype = getattr(torch, dtype_name)
    errors = {"h": 0.0, "c": 0.0, "batched_vs_alone": 0.0}
    defaults = kernels._LSTM_BLOCK_J, kernels._LSTM_BLOCK_K
    for name, (in_a, in_b, hidden, rows, shapes) in LSTM_SIZES.items():
        cell, weight, bias, (a, b, h, c) = _lstm_case(in_a, in_b, hidden, rows, dtype)

        def fused(i):
            h_out, c_out = (torch.full((len(i), hidden), float("nan"), dtype=dtype) for _ in range(2))
            return kernels.lstm_cell(a[i], b[i], h[i], c[i], weight, bias, h_out, c_out)

        with torch.no_grad():
            expected = cell(torch.cat((a, b), 1).float(), (h.float(), c.float()))
        for shape in shapes:
            kernels._LSTM_BLOCK_J, kernels._LSTM_BLOCK_K = shape or defaults
            got = fused(list(range(rows)))
            errors["h"] = max(errors["h"], worst(got[0], expected[0]))
            errors["c"] = max(errors["c"], worst(got[1], expected[1]))
            for i in range(rows):
                alone = fused([i])
                errors["batched_vs_alone"] = max(errors["batched_vs_alone"], *(
                    worst(x[i: i + 1], y.float()) for x, y in zip(got, alone)))
        kernels._LSTM_BLOCK_J, kernels._LSTM_BLOCK_K = defaults
        print(name, errors, file=sys.stderr)
    return errors


def _few_programs() -> None:
    """Wide LSTM cell programs: the interpreter runs programs one at a time,
    and the default (one unit per program) made each decoder check take
    minutes; lstm_errors checks the default shape itself."""
    from tts_cli import kernels
    kernels._LSTM_BLOCK_J = 64


def _graph_decoder_errors(plug) -> dict:
    """The graph decoder's static-buffer loop, its fused parts put in place
    by ``plug(graphed, model)`` (GraphedDecoder takes the Triton ones on CUDA
    only), against the eager decoder, on a tiny float32 model whose rows
    stop at different steps inside graphs: whether the frame counts and
    truncation flags agree, and the mel's max abs difference."""
    import torch
    from tts_cli import decoder_graph
    from tts_cli.batching import pad_sequences
    from tts_cli.tacotron2 import DecodeSettings, decode
    from tiny_models import tiny_tacotron2
    model = tiny_tacotron2(seed=1)
    gate = model.decoder.gate_layer.linear_layer
    gate.weight.data *= 10.0
    gate.bias.data.fill_(-1.0)
    g = torch.Generator().manual_seed(3)
    ids, lengths = pad_sequences([torch.randint(12, 64, (n,), generator=g).tolist() for n in (7, 45, 3)])
    seeds, cfg = torch.tensor([4, 5, 6]), DecodeSettings(max_decoder_steps=40)
    with torch.inference_mode():
        graphed = plug(decoder_graph, model, cfg)
        mel, frames, truncated = graphed.decode(ids, lengths, seeds)
        ref_mel, ref_frames, ref_truncated = decode(model, ids, lengths, seeds, cfg)
    return {"frames": frames.tolist(), "expected_frames": ref_frames.tolist(),
            "same_stops": frames.tolist() == ref_frames.tolist()
            and truncated.tolist() == ref_truncated.tolist() and mel.shape == ref_mel.shape,
            "mel": worst(mel, ref_mel) if mel.shape == ref_mel.shape else float("inf")}


def fused_attention_decoder_errors(dtype_name: str) -> dict:
    """_graph_decoder_errors with the fused attention kernel."""
    return _fused_attention_decoder_errors(dtype_name, split_query=False)


def split_query_decoder_errors(dtype_name: str) -> dict:
    """_graph_decoder_errors with the few-row path's split attention (the
    fused attention kernel given its query product from
    kernels.query_product) put in every graph: the batch of 3 too."""
    return _fused_attention_decoder_errors(dtype_name, split_query=True)


def _fused_attention_decoder_errors(dtype_name: str, split_query: bool) -> dict:
    assert dtype_name == "float32"

    def plug(decoder_graph, model, cfg):
        graphed = decoder_graph.GraphedDecoder(model, cfg, steps_per_graph=8, fused_attention=True)
        assert graphed.attention is None           # not on CUDA: the module path
        graphed.attention = decoder_graph._FusedAttention(model.decoder.attention_layer,
                                                          split_query=split_query)
        return graphed
    return _graph_decoder_errors(plug)


def fused_rnn_decoder_errors(dtype_name: str) -> dict:
    """_graph_decoder_errors with the fused LSTM cell kernel for both cells."""
    assert dtype_name == "float32"

    def plug(decoder_graph, model, cfg):
        # a batch of 3: the fused cells' batch limit raised so they run in it
        graphed = decoder_graph.GraphedDecoder(model, cfg, steps_per_graph=8, fused_rnn=True,
                                               fused_rnn_max_batch=64)
        assert graphed.few_rows is None   # not on CUDA
        graphed.few_rows = decoder_graph.FewRowKernels.for_decoder(model.decoder, split_attention=False)
        return graphed
    _few_programs()
    return _graph_decoder_errors(plug)


def fused_rnn_batch_limit_calls(dtype_name: str) -> dict:
    """How many kernels.lstm_cell launches the graph decoder makes for a
    batch of 3 and for one line, with fused_rnn on and the default batch
    limit (1 row), the fused cells put in place as on CUDA."""
    import torch
    from tts_cli import decoder_graph, kernels
    from tts_cli.batching import pad_sequences
    from tts_cli.tacotron2 import DecodeSettings
    from tiny_models import tiny_tacotron2
    assert dtype_name == "float32"
    _few_programs()
    calls, outputs = [], []
    launch, launch_output = kernels.lstm_cell, kernels.output_step
    kernels.lstm_cell = lambda *args: calls.append(1) or launch(*args)
    kernels.output_step = lambda *args: outputs.append(1) or launch_output(*args)
    model = tiny_tacotron2(seed=6)
    graphed = decoder_graph.GraphedDecoder(model, DecodeSettings(max_decoder_steps=8), steps_per_graph=8,
                                           fused_rnn=True)
    graphed.few_rows = decoder_graph.FewRowKernels.for_decoder(model.decoder, split_attention=False)
    ids, lengths = pad_sequences([[12, 13, 14], [15, 16], [17, 18, 19, 20]])
    counts = {}
    with torch.inference_mode():
        graphed.decode(ids, lengths, torch.tensor([1, 2, 3]))
        counts["batch_of_3"], counts["outputs_batch_of_3"] = len(calls), len(outputs)
        graphed.decode(ids[:1, :3], lengths[:1], torch.tensor([1]))
        counts["one_line"] = len(calls) - counts["batch_of_3"]
        counts["outputs_one_line"] = len(outputs) - counts["outputs_batch_of_3"]
    return counts


def output_errors(dtype_name: str) -> dict:
    """kernels.output_step against the projection and gate layers on
    cat(decoder hidden, context) (in float32 on the same rounded weights and
    inputs), its inputs read through row strides wider than their widths and
    its outputs written into views of wider buffers (as the graph decoder
    keeps them), with 16 outputs per program too (the last program partly
    past the gate row): max abs errors of frame and gate; and the largest
    difference between a row computed in a batch of 3 and alone, which must
    be 0."""
    import dataclasses
    import torch
    from tts_cli import kernels
    from tts_cli.decoder_graph import _FusedOutput
    from tts_cli.tacotron2 import PUBLISHED_DIMS, Decoder
    dtype = getattr(torch, dtype_name)
    errors = {"frame": 0.0, "gate": 0.0, "batched_vs_alone": 0.0}
    default_block = kernels._OUTPUT_BLOCK_O
    for n_mel, d, e in ((5, 24, 40), (80, 1024, 512)):
        torch.manual_seed(5)
        dims = dataclasses.replace(PUBLISHED_DIMS, n_mel=n_mel, decoder_rnn_dim=d, embedding_dim=e)
        decoder = Decoder(dims).eval().to(dtype)
        stacked = _FusedOutput(decoder)
        wide = torch.randn(3, d + e + 5).to(dtype)
        hidden, context = wide[:, :d], wide[:, d + 5:]
        projection, gate_layer = decoder.linear_projection.linear_layer, decoder.gate_layer.linear_layer
        with torch.no_grad():
            x = torch.cat((hidden, context), 1).float()
            frame_ref = x @ projection.weight.float().t() + projection.bias.float()
            gate_ref = (x @ gate_layer.weight.float().t() + gate_layer.bias.float())[:, 0]

        def fused(rows):
            frames = torch.full((2, len(rows), n_mel + 3), float("nan"), dtype=dtype)[1, :, :n_mel]
            gates = torch.full((len(rows), 2), float("nan"), dtype=dtype)[:, 1]
            return kernels.output_step(hidden[rows], context[rows], stacked.weight, stacked.bias,
                                       frames, gates)

        for block in (default_block, 16):
            kernels._OUTPUT_BLOCK_O = block
            frame, gate = fused([0, 1, 2])
            errors["frame"] = max(errors["frame"], worst(frame, frame_ref))
            errors["gate"] = max(errors["gate"], worst(gate, gate_ref))
            for i in range(3):
                alone = fused([i])
                errors["batched_vs_alone"] = max(errors["batched_vs_alone"], worst(frame[i], alone[0][0]),
                                                 worst(gate[i], alone[1][0]))
        kernels._OUTPUT_BLOCK_O = default_block
        print(n_mel, errors, file=sys.stderr)
    return errors


def fused_step_decoder_errors(dtype_name: str) -> dict:
    """_graph_decoder_errors with every fusion on: the fused attention,
    prenet and LSTM cell kernels, and the projection and gate as one product
    (which GraphedDecoder takes on any device)."""
    assert dtype_name == "float32"

    def plug(decoder_graph, model, cfg):
        graphed = decoder_graph.GraphedDecoder(model, cfg, steps_per_graph=8, fused_attention=True,
                                               fused_prenet=True, fused_output=True, fused_rnn=True,
                                               fused_rnn_max_batch=64)
        assert graphed.attention is None and graphed.prenet is None and graphed.output is not None
        assert graphed.few_rows is None
        graphed.attention = decoder_graph._FusedAttention(model.decoder.attention_layer)
        graphed.prenet = decoder_graph._FusedPrenet(model.decoder.prenet)
        graphed.few_rows = decoder_graph.FewRowKernels.for_decoder(model.decoder, split_attention=True)
        return graphed
    _few_programs()
    return _graph_decoder_errors(plug)


def interpreted(check: str, dtype: str) -> dict:
    """``check(dtype)`` run in a fresh process under Triton's interpreter."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, check, dtype], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{check} {dtype}: {result}")
    return result


def same_sums_retiled(error: float, tol: float) -> bool:
    """Whether a layout that moves columns or rows to other places in the tiles
    gave the same sums. On the GPU they are bitwise equal; under the
    interpreter tl.dot is numpy's matmul, whose BLAS may add up a column in
    another order where it sits elsewhere in the tile: one float32 rounding
    (up to 3.6e-7 with numpy 2.4.6, OpenBLAS 0.3.31, triton 3.9). A wrongly
    placed column or row is off by ~1."""
    return error <= tol / 10


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_matmul_kernels_equal_torch_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("kernel_errors", dtype)
    # float16: one rounding of values up to ~8 (half an ulp: 4e-3)
    assert errors["taps_gate"] < tol and errors["residual_update"] < tol
    # the paired layout changes where columns sit, not the sums; taking the
    # tiles in a loop changes nothing: bitwise equal
    assert same_sums_retiled(errors["paired_vs_unpaired"], tol) and errors["persistent_vs_paired"] == 0.0
    assert errors["approx_gate_vs_exact_on_cpu"] == 0.0


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_matmul_coupling_equals_the_plain_coupling_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("coupling_errors", dtype)
    assert errors["coupling_matmul_vs_plain"] < tol and errors["matmul_vs_plain"] < tol
    assert same_sums_retiled(errors["paired_vs_matmul"], tol)   # "matmul_paired": the same sums
    assert errors["persistent_vs_paired"] == 0.0   # "matmul_persistent": the same tiles in a loop
    # "matmul_padded": the paired sums again over item-padded rows; x's rows
    # past each length are zeros instead of unread values, which changes
    # nothing any row reads
    assert same_sums_retiled(errors["padded_vs_paired"], tol) and errors["coupling_padded_vs_plain"] < tol
    # fp32 accumulation with one rounding: no less accurate than cuBLAS's products
    assert errors["matmul_vs_fp32_model"] < 1.5 * errors["plain_vs_fp32_model"] + 1e-5


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_the_conditioning_inside_the_taps_product_equals_the_plain_coupling_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("fused_cond_errors", dtype)
    assert errors["fused_cond_vs_plain"] < tol and errors["coupling_fused_cond_vs_plain"] < tol
    # a line's audio does not depend on the lines beside it in the rows
    assert errors["alone_vs_batched"] < tol / 10
    # the conditioning accumulated in float32 with the taps, one rounding:
    # no less accurate than storing it in the model dtype first
    assert errors["fused_cond_vs_fp32_model"] < 1.5 * errors["plain_vs_fp32_model"] + 1e-5


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 5e-3)])
def test_fused_attention_step_equals_the_attention_module_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("attention_errors", dtype)
    # float16: the folded location weight, the inputs of the location product
    # and the outputs are rounded once each; the rest runs in float32
    assert errors["context"] < tol and errors["weights"] < tol and errors["weights_cum"] < 4 * tol
    # one program per row, blocks in a fixed order: bitwise batched == alone
    assert errors["batched_vs_alone"] == 0.0 and errors["cropped_vs_alone"] == 0.0
    # the query product in a launch of its own: the same sums, bitwise
    assert errors["split_query_vs_one_launch"] == 0.0


@pytest.mark.parametrize("check", ["fused_attention_decoder_errors", "split_query_decoder_errors",
                                   "fused_rnn_decoder_errors", "fused_step_decoder_errors"],
                         ids=["fused-attention", "split-query", "fused-lstm-cells", "every-fusion"])
def test_graph_decoder_with_fused_parts_equals_the_eager_one_under_the_interpreter(check):
    """The graph decoder's loop with the fused attention, the fused LSTM
    cells, or every fusion: the eager decoder's stops, mel within 1e-4."""
    pytest.importorskip("triton")
    result = interpreted(check, "float32")
    assert result["same_stops"] and len(set(result["frames"])) > 1, result
    assert result["mel"] < 1e-4


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 5e-3), ("bfloat16", 2e-2)])
def test_fused_prenet_step_equals_the_prenet_module_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("prenet_errors", dtype)
    # 16-bit: one rounding of outputs up to ~2 (float16: half an ulp, 1e-3;
    # bfloat16: the interpreter truncates, one ulp, 1.6e-2)
    assert errors["out"] < tol and errors["out_no_masks"] < tol
    # each row on its own, in a fixed order: bitwise batched == alone
    assert errors["batched_vs_alone"] == 0.0
    # masks drawn in the kernel are prenet_keep_masks' own, bit for bit
    assert errors["drawn_vs_given_masks"] == 0.0


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 5e-3), ("bfloat16", 4e-2)])
def test_fused_lstm_cell_equals_nn_lstmcell_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("lstm_errors", dtype)
    # 16-bit: one rounding of outputs (|h'| < 1, |c'| up to ~8; float16: half
    # an ulp, 4e-3 at 8; bfloat16: the interpreter truncates, one ulp, 3e-2 at 4-8)
    assert errors["h"] < tol and errors["c"] < tol
    # each row on its own, in a fixed order: bitwise batched == alone
    assert errors["batched_vs_alone"] == 0.0


def test_the_fused_lstm_cells_and_output_run_only_in_graphs_of_one_row_by_default():
    """Their programs read all the weights for every row, so larger batches
    keep cuBLAS's products (fused_rnn_max_batch, default 1)."""
    pytest.importorskip("triton")
    result = interpreted("fused_rnn_batch_limit_calls", "float32")
    assert result["batch_of_3"] == 0 and result["outputs_batch_of_3"] == 0
    assert result["one_line"] == 2 * 8   # two cells, 8 steps (one graph's worth)
    assert result["outputs_one_line"] == 8


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_fused_output_step_equals_the_projection_and_gate_layers_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("output_errors", dtype)
    # float16: one rounding of outputs up to ~4 (half an ulp: 2e-3)
    assert errors["frame"] < tol and errors["gate"] < tol
    # each row on its own, in a fixed order: bitwise batched == alone
    assert errors["batched_vs_alone"] == 0.0


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    print(json.dumps(globals()[sys.argv[1]](sys.argv[2])))
