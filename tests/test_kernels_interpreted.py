"""The Triton kernels against plain torch, on the CPU, through Triton's
interpreter: WaveGlow's two fused products (kernels.waveglow) alone and in
FastWaveGlow's whole inverse, for narrow models padded to the kernels' width
too; Tacotron2's decoder kernels (kernels.decoder: the attention step, the
prenet, the LSTM cell, the projection and gate) alone and in the graph
decoder's loop.

TRITON_INTERPRET must be set before Triton is imported, so the checks run in a
fresh Python process: this file run as a script. Skipped where Triton is not
installed (CI); tests/test_gpu.py checks the same paths on a GPU.

The interpreter's tl.dot multiplies bfloat16 operands as their raw bits
(numpy has no bfloat16), so bfloat16 is checked on the GPU only; prenet_step
(and lstm_cell) has no tl.dot and is checked in bfloat16 here too, but the interpreter
truncates float32 to bfloat16 where a GPU rounds (one ulp). Autotuning
needs a GPU too: here every launch uses one fixed config
(kernels.waveglow._FIXED_CONFIG).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = [  # each tiles the kernels' 64-wide channels and windows; BLOCK_M divides 128
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},
]


def worst(got, expected) -> float:
    """Max abs difference; NaN anywhere counts as infinitely wrong."""
    return (got.float() - expected).abs().nan_to_num(nan=float("inf")).max().item()


def rel(a, b) -> float:
    """Relative error of a against b (2-norms); NaN counts as infinitely wrong."""
    return ((a.float() - b.float()).norm() / b.float().norm()).nan_to_num(nan=float("inf")).item()


def waveglow_kernel_errors(dtype_name: str) -> dict:
    """kernels.waveglow.taps_cond_gate and residual_update against torch, per
    config and layer: 3 items of 5 frames (valid 5, 3 and 1), 4 phases, so
    60 rows in blocks of 128 (dummy rows after them), C = 64, a 64-wide
    window, dilations 1, 2, 4 and 8 (taps reach across frames, phases and
    past items' lengths); x past each item's length is NaN, so reading it
    would show. Max abs errors, and whether every real row of the output
    was written."""
    import torch
    from tts_cli.kernels import waveglow as wk
    from tts_cli.waveglow_fast import shifted_taps
    dtype = getattr(torch, dtype_name)
    items, frames, phases, c, win = 3, 5, 4, 64, 64
    steps = frames * phases
    lengths = torch.tensor([5, 3, 1]) * phases
    rows = wk.PhaseRows(items=items, frames=frames, phases=phases)
    errors = {"taps_cond_gate": 0.0, "residual_update": 0.0, "all_rows_written": True}
    for config in CONFIGS:
        wk._FIXED_CONFIG = config
        torch.manual_seed(0)
        keep = (torch.arange(steps)[None] < lengths[:, None]).to(dtype)            # (B, T)
        x = torch.randn(items, steps, c).to(dtype)
        x[keep == 0] = float("nan")                                               # past a length: never read
        windows = torch.randn(items * frames, win).to(dtype)
        x_rows = rows.gather(x).contiguous()
        keep_rows = rows.gather(keep[..., None]).view(-1).contiguous()
        for i, d in enumerate((1, 2, 4, 8)):
            w_taps = (torch.randn(3 * c, 2 * c) / (3 * c) ** 0.5).to(dtype)
            w_cond = (torch.randn(win, phases, 2 * c) / win ** 0.5).to(dtype)
            b_cond = torch.randn(2 * c).to(dtype)
            out = torch.full((rows.n_rows, c), float("nan"), dtype=dtype)
            wk.taps_cond_gate(x_rows, keep_rows, windows, w_cond, b_cond, w_taps, rows, d, out)
            kept = torch.where(keep[..., None] > 0, x.float(), 0.0)
            cond = (windows.float() @ w_cond.float().view(win, -1)).view(items, steps, 2 * c)
            z = shifted_taps(kept, d) @ w_taps.float() + cond + b_cond.float()
            gated = torch.tanh(z[..., 0::2]) * torch.sigmoid(z[..., 1::2])       # (B, T, C)
            got = rows.scatter(out)
            valid = keep > 0
            errors["taps_cond_gate"] = max(errors["taps_cond_gate"], worst(got[valid], gated[valid]))
            errors["all_rows_written"] &= bool(got.isfinite().all())
            w_res, b_res = (torch.randn(c, c) / c ** 0.5).to(dtype), torch.randn(c).to(dtype)
            acts = torch.where(out.isfinite(), out, 0.0)
            updated = x_rows.float() + acts.float() @ w_res.float() + b_res.float()
            x_new = x_rows.clone()
            wk.residual_update(acts, w_res, b_res, x_new)
            real = rows.gather(valid[..., None].expand(-1, -1, c)).bool()
            errors["residual_update"] = max(errors["residual_update"], worst(x_new[real], updated[real]))
    return errors


INVERSE_SHAPES = {   # the kernels' width multiple (64) exactly, and narrower ones padded to it
    "wn_channels 64, 3 layers": {"wn_channels": 64, "wn_layers": 3},
    "wn_channels 8": {},
    "the demo voice's: 80 channels, 2 flows, no early outputs": {
        "wn_channels": 80, "n_flows": 2, "n_early_size": 0, "n_early_every": 2},
}


def waveglow_inverse_errors(dtype_name: str) -> dict:
    """FastWaveGlow through the kernels (one fixed config) against the plain
    torch FastWaveGlow in the same dtype and the float32 model, per shape of
    INVERSE_SHAPES: items of 5, 8 and 2 frames in one batch, and the last
    item alone against the batch."""
    import torch
    from tts_cli.kernels import waveglow as wk
    from tts_cli.waveglow_fast import FastWaveGlow
    from tiny_models import random_waveglow
    dtype = getattr(torch, dtype_name)
    # the interpreter runs one program at a time: the fewest, largest tiles
    wk._FIXED_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    result = {}
    for name, shape in INVERSE_SHAPES.items():
        model = random_waveglow(seed=4, **shape)
        frames = torch.tensor([5, 8, 2])
        mel = torch.randn(3, model.dims.n_mel, 8) * (torch.arange(8)[None, None, :] < frames[:, None, None])
        seeds = torch.tensor([5, 6, 7])
        with torch.inference_mode():
            reference = model.infer(mel, frames, seeds, sigma=0.666)
            plain = FastWaveGlow(model, dtype, use_kernels=False).infer(mel, frames, seeds, 0.666)
            fast = FastWaveGlow(model, dtype, use_kernels=True)
            got = fast.infer(mel, frames, seeds, 0.666)
            # the item whose rows sit after both others' in every phase block
            alone = worst(got[2, : frames[2] * 256], fast.infer(mel[2:, :, : frames[2]], frames[2:], seeds[2:], 0.666)[0])
        result[name] = {"kernels_vs_plain": rel(got, plain), "alone_vs_batched": alone,
                        "kernels_vs_fp32_model": rel(got, reference), "plain_vs_fp32_model": rel(plain, reference),
                        "finite": bool(got.isfinite().all())}
        print(name, result[name], file=sys.stderr)
    return result


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
    from tts_cli.kernels import decoder as kernels
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
    from tts_cli.kernels import decoder as kernels
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
    from tts_cli.kernels import decoder as kernels
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
    from tts_cli.kernels import decoder as kernels
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
    from tts_cli.kernels import decoder as kernels
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
        mel, frames, truncated, path = graphed.decode(ids, lengths, seeds)
        ref_mel, ref_frames, ref_truncated, ref_path = decode(model, ids, lengths, seeds, cfg)
    return {"frames": frames.tolist(), "expected_frames": ref_frames.tolist(),
            "same_stops": frames.tolist() == ref_frames.tolist()
            and truncated.tolist() == ref_truncated.tolist() and mel.shape == ref_mel.shape,
            "mel": worst(mel, ref_mel) if mel.shape == ref_mel.shape else float("inf")}


def decoder_kernels_errors(dtype_name: str) -> dict:
    """_graph_decoder_errors with the kernels a batch of 3 runs: the fused
    attention and prenet (the few-row kernels wait for graphs of one row)."""
    assert dtype_name == "float32"

    def plug(decoder_graph, model, cfg):
        return decoder_graph.GraphedDecoder(model, cfg, steps_per_graph=8, use_kernels=True)
    return _graph_decoder_errors(plug)


def few_row_kernels_decoder_errors(dtype_name: str) -> dict:
    """_graph_decoder_errors with every kernel: the few-row ones (both LSTM
    cells, the projection and gate, the split attention) let into the batch
    of 3."""
    assert dtype_name == "float32"

    def plug(decoder_graph, model, cfg):
        graphed = decoder_graph.GraphedDecoder(model, cfg, steps_per_graph=8, use_kernels=True)
        graphed.few_rows_max_batch = 64
        return graphed
    _few_programs()
    return _graph_decoder_errors(plug)


def fused_rnn_batch_limit_calls(dtype_name: str) -> dict:
    """How many kernels.lstm_cell and output_step launches the graph decoder
    makes for a batch of 3 and for one line, at the default few-row limit
    (1 row), with the kernels in place as on CUDA."""
    import torch
    from tts_cli import decoder_graph
    from tts_cli.kernels import decoder as kernels
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
                                           use_kernels=True)
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
    from tts_cli.kernels import decoder as kernels
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


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_waveglow_kernels_equal_torch_under_the_interpreter(dtype, tol):
    pytest.importorskip("triton")
    errors = interpreted("waveglow_kernel_errors", dtype)
    # float16: one rounding of values up to ~8 (half an ulp: 4e-3)
    assert errors["taps_cond_gate"] < tol and errors["residual_update"] < tol
    assert errors["all_rows_written"]


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_fast_waveglow_through_the_kernels_equals_the_plain_path_for_every_width_under_the_interpreter(
        dtype, tol):
    pytest.importorskip("triton")
    result = interpreted("waveglow_inverse_errors", dtype)
    for name, errors in result.items():
        assert errors["finite"] and errors["kernels_vs_plain"] < tol, name
        # a line's audio does not depend on the lines beside it in the rows
        assert errors["alone_vs_batched"] < tol / 10, name
        # float32 accumulation with one rounding: no less accurate than plain torch
        assert errors["kernels_vs_fp32_model"] < 1.5 * errors["plain_vs_fp32_model"] + 1e-5, name


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


@pytest.mark.parametrize("check", ["decoder_kernels_errors", "few_row_kernels_decoder_errors"],
                         ids=["batch-kernels", "every-kernel"])
def test_graph_decoder_with_its_kernels_equals_the_eager_one_under_the_interpreter(check):
    """The graph decoder's loop with the kernels a batch runs, and with the
    few-row kernels too: the eager decoder's stops, mel within 1e-4."""
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
    keep cuBLAS's products (GraphedDecoder.few_rows_max_batch, 1)."""
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
