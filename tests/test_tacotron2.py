"""Tacotron2: dimensions from weights, the reference's stop rule, batch independence."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tts_cli.batching import pad_sequences
from tts_cli.tacotron2 import PUBLISHED_DIMS as PUBLISHED, DecodeSettings, Tacotron2, Tacotron2Dims, decode
from tiny_models import TACOTRON2_DIMS, canonical, force_lengths, tiny_tacotron2

ROOT = Path(__file__).resolve().parent.parent


def test_a_program_that_embeds_the_models_does_not_load_the_commands_io():
    # The models need torch only: importing them must not pull in the
    # recipes' YAML parser, the WAV writer or the command line's parser.
    code = ("import sys, tts_cli.tacotron2, tts_cli.waveglow\n"
            "print(*(m for m in ('yaml', 'soundfile', 'click') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == []


def lines(*lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(12, 64, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("dims", [TACOTRON2_DIMS, PUBLISHED], ids=["tiny", "published"])
def test_dimensions_are_read_from_the_weights(dims):
    with torch.device("meta"):
        sd = Tacotron2(dims).state_dict()
    assert Tacotron2Dims.from_state_dict(sd) == dims


def test_weights_that_do_not_fit_are_refused():
    sd = canonical(tiny_tacotron2())
    del sd["decoder.gate_layer.linear_layer.bias"]
    with pytest.raises(ValueError, match="gate_layer"):
        Tacotron2.from_state_dict(sd)


def run(model, seqs, seeds=None, **settings):
    ids, lengths = pad_sequences(seqs)
    seeds = torch.tensor(seeds or list(range(len(seqs))))
    cfg = DecodeSettings(**{"max_decoder_steps": 40, **settings})
    return decode(model, ids, lengths, seeds, cfg)


def test_a_line_stops_at_the_first_gate_above_threshold_and_keeps_that_frame():
    _, frames, truncated, _ = run(tiny_tacotron2(gate_bias=10.0), lines(5, 9))
    assert frames.tolist() == [1, 1]
    assert not truncated.any()


def test_threshold_is_strict_and_a_line_that_never_stops_is_truncated():
    # A gate logit of exactly 0 gives sigmoid 0.5, which is not > 0.5.
    mel, frames, truncated, _ = run(tiny_tacotron2(gate_bias=0.0), lines(5, 9), max_decoder_steps=23)
    assert frames.tolist() == [23, 23]
    assert truncated.all()
    assert mel.shape[2] == 23


def test_batched_output_equals_one_line_at_a_time():
    model = force_lengths(tiny_tacotron2(seed=3), {3: 9, 61: 40, 17: 25, 8: 3})
    seqs = lines(3, 61, 17, 8, seed=1)
    seeds = [11, 12, 13, 14]
    ids, lengths = pad_sequences(seqs)
    cfg = DecodeSettings(max_decoder_steps=40)
    mel, frames, _, _ = decode(model, ids, lengths, torch.tensor(seeds), cfg)
    assert frames.tolist() == [9, 40, 25, 3]
    for i, seq in enumerate(seqs):
        one_ids, one_len = pad_sequences([seq])
        alone, n, _, _ = decode(model, one_ids, one_len, torch.tensor(seeds[i:i + 1]), cfg)
        assert torch.allclose(mel[i, :, : int(n)], alone[0], atol=1e-5), f"line {i} differs in a batch"
        assert mel[i, :, int(n):].abs().max() == 0 if mel.shape[2] > n else True


def test_gate_driven_stops_match_between_batch_and_alone():
    model = tiny_tacotron2(seed=5)
    seqs = lines(4, 30, 12, seed=2)
    _, frames, truncated, _ = run(model, seqs, seeds=[1, 2, 3])
    for i, seq in enumerate(seqs):
        _, n, t, _ = run(model, [seq], seeds=[i + 1])
        assert (int(n), bool(t)) == (int(frames[i]), bool(truncated[i]))


def test_prenet_dropout_follows_the_line_seed():
    model = tiny_tacotron2(seed=1, gate_bias=-10.0)
    seq = lines(12)
    a, _, _, _ = run(model, seq, seeds=[7], max_decoder_steps=10)
    b, _, _, _ = run(model, seq, seeds=[7], max_decoder_steps=10)
    c, _, _, _ = run(model, seq, seeds=[8], max_decoder_steps=10)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    d, _, _, _ = run(model, seq, seeds=[7], max_decoder_steps=10, prenet_dropout=0.0)
    e, _, _, _ = run(model, seq, seeds=[8], max_decoder_steps=10, prenet_dropout=0.0)
    assert torch.equal(d, e), "without dropout the seed must not matter"
