"""Recipes and overrides."""
import pytest

from tts_cli.config import ConfigError, Settings, builtin_recipes, load_settings


def test_the_default_recipe_holds_the_reference_settings():
    s = load_settings()
    assert (s.sigma, s.max_decoder_steps, s.gate_threshold, s.prenet_dropout) == (0.666, 1000, 0.5, 0.5)
    assert s.denoiser_strength is None, "unset: each voice's own (the reference's 0.01 for NVIDIA's)"
    assert s.sample_rate is None, "unset: each voice's own (22050 for NVIDIA's)"
    assert s.sample_format == "pcm16" and s.format == "plain"
    assert "ljspeech" in builtin_recipes()


def test_command_line_values_override_the_recipe_and_none_means_unset(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("sigma: 0.5\nbatch_size: 8\n")
    s = load_settings(str(recipe), {"batch_size": 3, "sigma": None})
    assert (s.sigma, s.batch_size) == (0.5, 3)


@pytest.mark.parametrize("data, message", [
    (b"sigmaa: 1\n", "unknown key"),
    (b"batch_size: many\n", "batch_size must be int"),
    (b"gate_threshold: 1.5\n", "gate_threshold must be between 0 and 1"),
    (b"format: csv\n", "format must be one of"),
    (b"sample_rate: 16\n", "sample_rate must be between 8000 and 192000 Hz"),
    (b"sample_rate: 700000\n", "sample_rate must be between 8000 and 192000 Hz"),
    (b"audio_format: flac\nsample_rate: 96001\n", "with flac, a sample_rate above 65535 Hz must be a whole "
                                                    "number of tens of Hz .*: 96000, say, not 96001"),
    (b"- just a list\n", "mapping"),
    (b"sigma: [\n", "not valid YAML"),
    (b"sigma: 0.5\nbatch_size: [8\n", r"line 3, column 1: not valid YAML \(expected ',' or ']'"),
    (b"save_mels: 1\n", "save_mels must be bool"),
    (b"sigma: 0.5\n\xff\n", "not UTF-8 text"),
    (b"1: 2\n", "unknown key.* 1;"),
])
def test_bad_recipes_fail_with_one_line_naming_the_file(tmp_path, data, message):
    recipe = tmp_path / "bad.yaml"
    recipe.write_bytes(data)
    with pytest.raises(ConfigError, match=message) as e:
        load_settings(str(recipe))
    assert str(recipe) in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_recipe_name_lists_the_built_in_ones():
    with pytest.raises(ConfigError, match="ljspeech"):
        load_settings("no-such-recipe")


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().sigma = 1.0


def test_defaults_live_in_settings_alone_and_help_shows_them():
    # The default recipe sets nothing, so what --help shows as a default
    # (Settings' own) is what a run gets; the decoder's rules take theirs
    # from the same place.
    from click.testing import CliRunner
    from tts_cli.cli import main
    from tts_cli.decode_rules import DecodeSettings
    assert load_settings() == Settings()
    decoder_side = DecodeSettings()
    assert (decoder_side.max_decoder_steps, decoder_side.gate_threshold, decoder_side.prenet_dropout) == (
        Settings().max_decoder_steps, Settings().gate_threshold, Settings().prenet_dropout)
    assert DecodeSettings.from_settings(Settings(max_decoder_steps=7, gate_threshold=0.25)) == DecodeSettings(
        max_decoder_steps=7, gate_threshold=0.25)
    shown = " ".join(CliRunner().invoke(main, ["synth", "--help"]).output.split())
    for option, name in [("--sigma", "sigma"), ("--max-decoder-steps", "max_decoder_steps"),
                         ("--piece-pause", "piece_pause"), ("--sample-format", "sample_format")]:
        assert f"[default: {getattr(Settings(), name)}]" in shown, option
    assert "[default: fp16 on CUDA, fp32 on CPU]" in shown


def test_every_synth_option_sets_the_settings_field_of_its_name():
    # A recipe key is its option's name with "_" for "-": --waveglow-memory
    # set waveglow_memory_gib, which a recipe had to spell otherwise.
    import click
    from tts_cli.cli import synth
    from tts_cli.config import FIELDS
    options = [p for p in synth.params if isinstance(p, click.Option) and p.name not in ("out_dir", "recipe")]
    assert len(options) >= 19
    for option in options:
        key = max(option.opts, key=len).removeprefix("--").replace("-", "_")
        assert key in FIELDS, option.opts
        assert option.name.rstrip("_") == key, option.opts   # format_: cli.py passes it on as format


def test_a_whole_number_for_a_float_setting_is_that_float(tmp_path):
    """`sigma: 1` in a recipe, sigma=1 in Python and --sigma 1 are one
    setting, so one resume key: a re-run with any of them keeps the audio."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("sigma: 1\ndenoiser_strength: 0\n")
    from_recipe, given = load_settings(str(recipe)), Settings(sigma=1.0, denoiser_strength=0.0)
    assert from_recipe == given and type(from_recipe.sigma) is float and type(from_recipe.denoiser_strength) is float
    with pytest.raises(ConfigError, match="batch_size must be int, got 3.0"):
        Settings(batch_size=3.0)


def test_a_recipe_s_switch_can_be_turned_off_on_the_command_line(tmp_path):
    from tts_cli.cli import synth
    recipe = tmp_path / "r.yaml"
    recipe.write_text("force: true\nquiet: true\nstrict: true\nprune: true\nsave_mels: true\n")
    context = synth.make_context("synth", ["c.txt", "-o", "out", "--no-force", "--no-quiet", "--no-strict",
                                           "--no-prune", "--no-save-mels"])
    options = {k: v for k, v in context.params.items() if k not in ("corpus", "out_dir", "recipe", "format_")}
    s = load_settings(str(recipe), options)
    assert not (s.force or s.quiet or s.strict or s.prune or s.save_mels)
