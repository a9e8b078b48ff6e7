"""Per-line random numbers: a pure function of (seed, stream, step, unit)."""
import torch

from tts_cli import randomness
from tts_cli.planning import line_seed


def test_uniforms_depend_only_on_their_own_key():
    seeds = torch.tensor([1, 2, 3])
    steps = torch.tensor([0, 5, 9])
    together = randomness.uniform(seeds, 1, steps, 64)
    for i in range(3):
        alone = randomness.uniform(seeds[i:i + 1], 1, steps[i:i + 1], 64)
        assert torch.equal(together[i], alone[0])
    assert ((together > 0) & (together < 1)).all()


def test_dropout_keeps_about_one_minus_p_scaled():
    seeds = torch.arange(200)
    keep = randomness.dropout_keep(seeds, torch.zeros(200, dtype=torch.long), 1, 256, p=0.5)
    assert set(keep.unique().tolist()) == {0.0, 2.0}
    assert abs((keep > 0).float().mean().item() - 0.5) < 0.01


def test_normals_look_standard_and_do_not_depend_on_length():
    z = randomness.normal(torch.tensor([3, 4]), randomness.NOISE_STREAM, 4, 20000)
    assert abs(z.mean().item()) < 0.02 and abs(z.std().item() - 1) < 0.02
    short = randomness.normal(torch.tensor([4]), randomness.NOISE_STREAM, 4, 100)
    assert torch.equal(short[0], z[1, :, :100])


def test_line_seed_depends_on_run_seed_and_id():
    assert line_seed(1, "a") == line_seed(1, "a")
    assert len({line_seed(s, i) for s in (1, 2) for i in ("a", "b")}) == 4
