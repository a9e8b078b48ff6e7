"""The graph decoder's static-buffer loop (run without capture off CUDA) gives
exactly what the eager decoder gives: same frames, same stops, same padding.
Off CUDA its Triton kernels do not run (the modules run instead);
tests/test_kernels_interpreted.py runs them under Triton's interpreter and
tests/test_gpu.py on a GPU."""
import pytest
import torch

from tts_cli.batching import pad_sequences
from tts_cli.decoder_graph import GraphedDecoder
from tts_cli.kernels import decoder as kernels
from tts_cli.decode_rules import gate_stops
from tts_cli.tacotron2 import DecodeSettings, decode
from tiny_models import force_lengths, tiny_tacotron2


def lines(*lengths):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(12, 64, (n,), generator=g).tolist() for n in lengths]


def sharp_gate(seed: int, scale: float, bias: float):
    """A tiny model whose gate swings enough to fire at different steps per
    row (random tiny weights alone stop every row at the first step)."""
    model = tiny_tacotron2(seed=seed)
    gate = model.decoder.gate_layer.linear_layer
    gate.weight.data *= scale
    gate.bias.data.fill_(bias)
    return model


@pytest.mark.parametrize("model", [
    lambda: tiny_tacotron2(seed=6),                         # every row stops at the first step
    lambda: sharp_gate(1, 10.0, -1.0),                      # stops at 19, 16, 9: inside graphs
    lambda: sharp_gate(0, 10.0, -2.0),                      # 13 and two rows to the limit
    lambda: force_lengths(tiny_tacotron2(seed=6), {7: 5, 45: 40, 3: 17}),
], ids=["gate-at-once", "gate-mid-graph", "gate-and-limit", "forced-lengths"])
def test_static_buffer_decoder_equals_the_eager_one(model):
    model = model()
    cfg = DecodeSettings(max_decoder_steps=40)
    ids, lengths = pad_sequences(lines(7, 45, 3))        # 3 rows -> a bucket of 4; 45 -> 64 symbols
    seeds = torch.tensor([4, 5, 6])
    decoder = GraphedDecoder(model, cfg, steps_per_graph=8)
    assert decoder.attention is None and decoder.prenet is None and decoder.few_rows is None   # off CUDA
    with torch.inference_mode():
        graphed = decoder.decode(ids, lengths, seeds)
        eager = decode(model, ids, lengths, seeds, cfg)
    assert graphed[1].tolist() == eager[1].tolist()
    assert graphed[2].tolist() == eager[2].tolist()
    assert graphed[0].shape == eager[0].shape
    assert torch.allclose(graphed[0], eager[0], atol=1e-5)


def test_a_batch_that_never_stops_runs_to_the_step_limit_and_is_truncated():
    model = tiny_tacotron2(seed=1, gate_bias=-20.0)
    cfg = DecodeSettings(max_decoder_steps=21)          # not a multiple of the 8 steps per graph
    ids, lengths = pad_sequences(lines(4, 9))
    with torch.inference_mode():
        mel, frames, truncated, _ = GraphedDecoder(model, cfg, steps_per_graph=8).decode(
            ids, lengths, torch.tensor([1, 2]))
    assert frames.tolist() == [21, 21] and truncated.all()
    assert mel.shape[2] == 21


def test_decoding_stops_one_graph_after_the_last_real_line_stops():
    # Rows stop at frames 5, 8 and 3; the padding row (3 rows -> bucket of 4)
    # never fires its gate, so only the bookkeeping can end the loop early.
    model = force_lengths(tiny_tacotron2(seed=2, gate_bias=-20.0), {6: 5, 7: 8, 8: 3})
    decoder = GraphedDecoder(model, DecodeSettings(max_decoder_steps=40), steps_per_graph=8)
    ids, lengths = pad_sequences(lines(6, 7, 8))
    with torch.inference_mode():
        _, frames, _, _ = decoder.decode(ids, lengths, torch.tensor([1, 2, 3]))
    assert frames.tolist() == [5, 8, 3]
    (graph,) = decoder.graphs.values()
    # all done after the first 8 steps; the flag is read one replay late
    assert int(graph.step) == 16


def test_swapping_the_stop_rule_is_all_it_takes_to_force_lengths():
    # A gate that never fires: both decoders stop each row where the rule
    # says (a length past the limit at the limit, not truncated), and a
    # rule swapped in after a graph was captured gets a graph of its own.
    model = tiny_tacotron2(seed=1, gate_bias=-20.0)
    cfg = DecodeSettings(max_decoder_steps=21)
    ids, lengths = pad_sequences(lines(4, 9, 2))
    seeds = torch.tensor([1, 2, 3])
    decoder = GraphedDecoder(model, cfg, steps_per_graph=8)
    with torch.inference_mode():
        assert decoder.decode(ids, lengths, seeds).frames.tolist() == [21, 21, 21]
        force_lengths(model, {4: 6, 9: 30, 2: 13})
        for decoded in (decoder.decode(ids, lengths, seeds), decode(model, ids, lengths, seeds, cfg)):
            assert decoded.frames.tolist() == [6, 21, 13] and not decoded.truncated.any()
            assert decoded.mel.shape[2] == 21
    assert len(decoder.graphs) == 2


def test_the_default_stop_rule_is_the_gate_s():
    model = sharp_gate(1, 10.0, -1.0)
    assert model.decoder.stop_rule is gate_stops
    cfg = DecodeSettings(max_decoder_steps=40)
    ids, lengths = pad_sequences(lines(7, 45, 3))
    seeds = torch.tensor([4, 5, 6])
    with torch.inference_mode():
        for decoded in (GraphedDecoder(model, cfg, steps_per_graph=8).decode(ids, lengths, seeds),
                        decode(model, ids, lengths, seeds, cfg)):
            assert decoded.frames.tolist() == [19, 16, 9] and not decoded.truncated.any()


def test_the_fused_lstm_weights_are_the_cell_s_products_and_biases():
    """kernels.fuse_lstm_weights (plain torch): [W_ih | W_hh] times cat(a, b,
    h) plus the float32 bias b_ih + b_hh, then the cell update, is
    nn.LSTMCell on (cat(a, b), (h, c)), to float32 rounding."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(24 + 40, 52)
    weight, bias = kernels.fuse_lstm_weights(cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    assert weight.shape == (4 * 52, 24 + 40 + 52) and weight.is_contiguous()
    assert bias.dtype == torch.float32 and bias.shape == (4 * 52,)
    a, b, h, c = torch.randn(5, 24), torch.randn(5, 40), torch.randn(5, 52), torch.randn(5, 52)
    with torch.no_grad():
        i, f, g, o = (torch.cat((a, b, h), 1) @ weight.t() + bias).chunk(4, 1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        ref_h, ref_c = cell(torch.cat((a, b), 1), (h, c))
    assert torch.allclose(h_new, ref_h, atol=1e-6) and torch.allclose(c_new, ref_c, atol=1e-6)
    no_bias = torch.nn.LSTMCell(8, 4, bias=False)
    assert torch.equal(kernels.fuse_lstm_weights(no_bias.weight_ih, no_bias.weight_hh, None, None)[1],
                       torch.zeros(16))
