"""tts_cli.checkpoints: every published checkpoint layout loads to the same
canonical weights, and bad or hostile files fail with a one-line message."""
from __future__ import annotations

import builtins
import os
import sys
import types
import warnings

import pytest
import torch

import checkpoint_files as cf
from tts_cli.checkpoints import (VOICE_ENTRY, CheckpointError, VoiceInfo, load_tacotron2_weights,
                                 load_waveglow_weights, read_voice_info, voice_entry)

FP16_TOL = 2e-3  # relative; fp16 keeps ~11 bits


@pytest.fixture(scope="module")
def tacotron2_sd():
    return cf.random_tacotron2_state_dict(seed=1)


@pytest.fixture(scope="module")
def waveglow_sd():
    return cf.random_waveglow_state_dict(seed=2)


def assert_canonical(loaded: dict, expected: dict, rtol: float = 1e-5) -> None:
    assert sorted(loaded) == sorted(expected)
    for key, want in expected.items():
        got = loaded[key]
        assert got.dtype == torch.float32 and got.device.type == "cpu", key
        assert got.is_contiguous(), key
        assert got.shape == want.shape, key
        assert torch.allclose(got, want.float(), rtol=rtol, atol=rtol * 1e-2), key


def load_error(loader, path) -> str:
    with pytest.raises(CheckpointError) as info:
        loader(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    return message


# --------------------------------------------------------------------------
# Published layouts round-trip


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "pre-1.6"])
def test_nvidia_tacotron2_statedict_loads(tmp_path, tacotron2_sd, legacy):
    path = tmp_path / "tacotron2_statedict.pt"
    cf.write_nvidia_tacotron2(path, tacotron2_sd, legacy=legacy)
    # BatchNorm's num_batches_tracked is in the file but not in the result.
    assert_canonical(load_tacotron2_weights(path), tacotron2_sd)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_ngc_tacotron2_loads(tmp_path, tacotron2_sd, fp16):
    path = tmp_path / "nvidia_tacotron2pyt.pt"
    cf.write_ngc_tacotron2(path, tacotron2_sd, fp16=fp16)
    assert_canonical(load_tacotron2_weights(path), tacotron2_sd,
                     rtol=FP16_TOL if fp16 else 1e-5)


@pytest.mark.parametrize("per_layer_cond", [False, True], ids=["fused-cond", "per-layer-cond"])
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "pre-1.6"])
def test_pickled_waveglow_loads_without_glow(tmp_path, waveglow_sd, per_layer_cond, legacy):
    path = tmp_path / "waveglow_256channels_universal_v5.pt"
    cf.write_pickled_waveglow(path, waveglow_sd, per_layer_cond=per_layer_cond, legacy=legacy)
    assert "glow" not in sys.modules
    assert_canonical(load_waveglow_weights(path), waveglow_sd)
    assert "glow" not in sys.modules


def test_pickled_waveglow_never_imports_glow(tmp_path, monkeypatch, waveglow_sd):
    """Even with an importable glow.py around, the loader does not run it."""
    path = tmp_path / "waveglow.pt"
    cf.write_pickled_waveglow(path, waveglow_sd, legacy=True)
    trap = tmp_path / "trap"
    trap.mkdir()
    marker = tmp_path / "glow-was-imported"
    (trap / "glow.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(trap))
    assert_canonical(load_waveglow_weights(path), waveglow_sd)
    assert not marker.exists()
    assert "glow" not in sys.modules


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_ngc_waveglow_loads(tmp_path, waveglow_sd, fp16):
    path = tmp_path / "nvidia_waveglowpyt.pt"
    cf.write_ngc_waveglow(path, waveglow_sd, fp16=fp16)
    # fp16 g and v each round, and the fold multiplies them: allow a bit more.
    assert_canonical(load_waveglow_weights(path), waveglow_sd,
                     rtol=3 * FP16_TOL if fp16 else 1e-5)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "pre-1.6"])
def test_bare_state_dicts_load(tmp_path, tacotron2_sd, waveglow_sd, legacy):
    cf.write_bare_state_dict(tmp_path / "t.pt", tacotron2_sd, legacy=legacy)
    cf.write_bare_state_dict(tmp_path / "w.pt", waveglow_sd, legacy=legacy)
    assert_canonical(load_tacotron2_weights(tmp_path / "t.pt"), tacotron2_sd)
    assert_canonical(load_waveglow_weights(tmp_path / "w.pt"), waveglow_sd)


def test_state_dict_nested_under_model_loads(tmp_path, tacotron2_sd, waveglow_sd):
    cf.write_state_dict_under_model(tmp_path / "t.pt", tacotron2_sd)
    cf.write_state_dict_under_model(tmp_path / "w.pt", waveglow_sd)
    assert_canonical(load_tacotron2_weights(tmp_path / "t.pt"), tacotron2_sd)
    assert_canonical(load_waveglow_weights(tmp_path / "w.pt"), waveglow_sd)


def test_weight_norm_state_dicts_fold_like_torch(tmp_path, waveglow_sd):
    """The fold reproduces torch's own weight norm, in both of torch's spellings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.x deprecates the old spelling
        old_style = torch.nn.utils.weight_norm(torch.nn.Conv1d(3, 5, 3))
    modern = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(3, 5, 3))
    expected, state = dict(waveglow_sd), dict(waveglow_sd)
    for name, module in (("WN.0.start", old_style), ("WN.1.start", modern)):
        module(torch.zeros(1, 3, 8))  # the old spelling computes .weight on forward
        expected[f"{name}.weight"] = module.weight.detach().clone()
        expected[f"{name}.bias"] = module.bias.detach().clone()
        del state[f"{name}.weight"], state[f"{name}.bias"]
        state.update({f"{name}.{k}": v for k, v in module.state_dict().items()})
    assert "WN.0.start.weight_g" in state
    assert "WN.1.start.parametrizations.weight.original0" in state
    cf.write_bare_state_dict(tmp_path / "w.pt", state)
    assert_canonical(load_waveglow_weights(tmp_path / "w.pt"), expected)


def test_helper_weight_norm_pairs_match_torch():
    """The writers' (g, v) pairs mean the canonical weight to torch itself, so
    the round trips above check the loader against torch, not against us."""
    w = torch.randn(6, 4, 3)
    g, v = cf.weight_norm_pair(w)
    assert not torch.allclose(v, w)
    assert torch.allclose(torch._weight_norm(v, g, 0), w, atol=1e-6)


def test_non_weight_entries_are_dropped(tmp_path, waveglow_sd):
    noisy = dict(waveglow_sd)
    noisy["convinv.0.W_inverse"] = torch.eye(4)[..., None]
    noisy["WN.0.cond_layer.weight_scale"] = torch.ones(1)
    cf.write_bare_state_dict(tmp_path / "w.pt", noisy)
    assert_canonical(load_waveglow_weights(tmp_path / "w.pt"), waveglow_sd)


# --------------------------------------------------------------------------
# Wrong model, wrong content


@pytest.mark.parametrize("writer", ["pickled", "ngc"])
def test_waveglow_file_given_as_tacotron2(tmp_path, waveglow_sd, writer):
    path = tmp_path / "w.pt"
    if writer == "pickled":
        cf.write_pickled_waveglow(path, waveglow_sd, legacy=True)
    else:
        cf.write_ngc_waveglow(path, waveglow_sd)
    assert "pass it as --waveglow" in load_error(load_tacotron2_weights, path)


@pytest.mark.parametrize("writer", ["nvidia", "ngc"])
def test_tacotron2_file_given_as_waveglow(tmp_path, tacotron2_sd, writer):
    path = tmp_path / "t.pt"
    if writer == "nvidia":
        cf.write_nvidia_tacotron2(path, tacotron2_sd, legacy=True)
    else:
        cf.write_ngc_tacotron2(path, tacotron2_sd)
    assert "pass it as --tacotron2" in load_error(load_waveglow_weights, path)


def test_other_model_names_what_it_found(tmp_path):
    path = tmp_path / "fastpitch.pt"
    torch.save({"epoch": 3, "state_dict": {"module.encoder.word_emb.weight": torch.zeros(2)}},
               path)
    for loader in (load_tacotron2_weights, load_waveglow_weights):
        message = load_error(loader, path)
        assert "neither Tacotron2 nor WaveGlow" in message
        assert "epoch, state_dict" in message and "encoder.word_emb.weight" in message


def test_incomplete_tacotron2_names_missing_weights(tmp_path, tacotron2_sd):
    partial = {k: v for k, v in tacotron2_sd.items() if not k.startswith("postnet.")}
    cf.write_nvidia_tacotron2(tmp_path / "t.pt", partial)
    message = load_error(load_tacotron2_weights, tmp_path / "t.pt")
    assert "postnet.convolutions.0.0.conv.weight" in message


# --------------------------------------------------------------------------
# Hostile files


class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _RunsExec:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize("payload", [_RunsShell, _RunsExec], ids=["os.system", "exec"])
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "pre-1.6"])
def test_code_in_checkpoint_is_refused_not_run(tmp_path, payload, legacy):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"model": payload(marker), "iteration": 1}, path,
               _use_new_zipfile_serialization=not legacy)
    for loader in (load_tacotron2_weights, load_waveglow_weights):
        message = load_error(loader, path)
        assert "refused" in message
        assert ("system" if payload is _RunsShell else "exec") in message
    assert not marker.exists()


def save_model_of_foreign_class(path, module_name: str, class_name: str) -> None:
    """torch.save a module whose class lives in a module we never import."""
    cls = type(class_name, (torch.nn.Module,), {"__module__": module_name})
    fake = types.ModuleType(module_name)
    setattr(fake, class_name, cls)
    previous = sys.modules.get(module_name)
    sys.modules[module_name] = fake
    try:
        torch.save({"model": cls(), "iteration": 1}, path)
    finally:
        if previous is None:
            del sys.modules[module_name]
        else:
            sys.modules[module_name] = previous


def test_whole_pickled_tacotron2_names_the_class(tmp_path):
    """A model pickled with classes we don't know is refused by class name."""
    save_model_of_foreign_class(tmp_path / "t.pt", "model", "Tacotron2")
    assert "'model.Tacotron2'" in load_error(load_tacotron2_weights, tmp_path / "t.pt")


def test_early_glow_old_release_is_named(tmp_path):
    save_model_of_foreign_class(tmp_path / "w.pt", "glow_old", "WaveGlow")
    message = load_error(load_waveglow_weights, tmp_path / "w.pt")
    assert "early WaveGlow release" in message and "v5" in message


# --------------------------------------------------------------------------
# Unreadable files


@pytest.mark.parametrize("kind", ["tacotron2-pre-1.6", "tacotron2-ngc-zip",
                                  "waveglow-pickled-pre-1.6", "waveglow-pickled-zip"])
def test_truncated_file(tmp_path, tacotron2_sd, waveglow_sd, kind):
    path = tmp_path / "cut.pt"
    if kind == "tacotron2-pre-1.6":
        cf.write_nvidia_tacotron2(path, tacotron2_sd, legacy=True)
    elif kind == "tacotron2-ngc-zip":
        cf.write_ngc_tacotron2(path, tacotron2_sd)
    else:
        cf.write_pickled_waveglow(path, waveglow_sd, legacy=kind.endswith("pre-1.6"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    loader = load_tacotron2_weights if kind.startswith("tacotron2") else load_waveglow_weights
    assert "cut short or damaged" in load_error(loader, path)


def test_corrupted_bytes(tmp_path, tacotron2_sd):
    path = tmp_path / "t.pt"
    cf.write_nvidia_tacotron2(path, tacotron2_sd, legacy=True)
    data = bytearray(path.read_bytes())
    data[40:60] = b"\xff" * 20
    path.write_bytes(bytes(data))
    assert "cut short or damaged" in load_error(load_tacotron2_weights, path)


def test_a_file_saved_with_a_newer_pickle_protocol_loads_or_says_how_to_save_it_again(tmp_path, tacotron2_sd):
    """torch.save(..., pickle_protocol=4) is a whole file, not a damaged
    one; torch's safe loader may not read that protocol. Then the one line
    says so, and torch's warning is not printed around it."""
    path = tmp_path / "t.pt"
    torch.save({"state_dict": tacotron2_sd}, path, pickle_protocol=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # any warning torch prints fails the test
        try:
            loaded = load_tacotron2_weights(path)
        except CheckpointError as e:
            message = str(e)
            assert "\n" not in message and str(path) in message
            assert "pickle protocol 4" in message and "save it again" in message
            assert "damaged" not in message
        else:
            assert_canonical(loaded, tacotron2_sd)


def test_missing_file(tmp_path):
    path = tmp_path / "nowhere.pt"
    assert "no such file" in load_error(load_tacotron2_weights, path)
    assert "no such file" in load_error(load_waveglow_weights, path)


def test_empty_directory_and_text_files(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "readme.pt").write_text("404 Not Found\n")
    (tmp_path / "folder.pt").mkdir()
    assert "empty" in load_error(load_waveglow_weights, tmp_path / "empty.pt")
    assert "not a PyTorch checkpoint" in load_error(load_waveglow_weights,
                                                    tmp_path / "readme.pt")
    assert "directory" in load_error(load_waveglow_weights, tmp_path / "folder.pt")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_archive_is_explained(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(path))
    assert "TorchScript" in load_error(load_tacotron2_weights, path)


# --------------------------------------------------------------------------
# The voice entry: a WaveGlow file's own name, sample rate and denoiser strength

DEMO_ENTRY = {"name": "demo", "sample_rate": 22050, "denoiser_strength": 0.0}


@pytest.mark.parametrize("writer", [cf.write_ngc_waveglow, cf.write_bare_state_dict], ids=["ngc", "bare"])
def test_a_voice_entry_is_read_and_leaves_the_weights_alone(tmp_path, waveglow_sd, writer):
    path = tmp_path / "any name.pt"
    writer(path, waveglow_sd, voice={"name": "Ada", "sample_rate": 16000, "denoiser_strength": 1})
    assert read_voice_info(path) == VoiceInfo(name="Ada", sample_rate=16000, denoiser_strength=1.0)
    assert_canonical(load_waveglow_weights(path), waveglow_sd)
    # each field may be left out: the run then uses the reference's
    writer(path, waveglow_sd, voice={"sample_rate": 24000})
    assert read_voice_info(path) == VoiceInfo(sample_rate=24000)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "pre-1.6"])
def test_published_files_carry_no_voice_entry(tmp_path, tacotron2_sd, waveglow_sd, legacy):
    waveglow, tacotron2 = tmp_path / "waveglow.pt", tmp_path / "tacotron2.pt"
    cf.write_pickled_waveglow(waveglow, waveglow_sd, legacy=legacy)
    cf.write_nvidia_tacotron2(tacotron2, tacotron2_sd, legacy=legacy)
    assert read_voice_info(waveglow) == VoiceInfo() == read_voice_info(tacotron2)


def test_voice_entry_writes_what_read_voice_info_reads(tmp_path, waveglow_sd):
    info = VoiceInfo(name="demo", sample_rate=22050, denoiser_strength=0.0)
    assert voice_entry(info) == {VOICE_ENTRY: DEMO_ENTRY}
    path = tmp_path / "wg.pt"
    torch.save({"state_dict": waveglow_sd, **voice_entry(info)}, path)
    assert read_voice_info(path) == info
    with pytest.raises(CheckpointError, match="sample_rate"):
        voice_entry(VoiceInfo(sample_rate=22050.0))


@pytest.mark.parametrize("entry, names", [
    ("demo", "must be a mapping"),
    ([22050, 0.0], "must be a mapping"),
    ({"rate": 22050}, "unknown key(s) 'rate'"),
    ({**DEMO_ENTRY, 7: 1}, "unknown key(s) 7"),
    ({"name": ""}, "name must be"),
    ({"name": "two\nlines"}, "name must be"),
    ({"name": 3}, "name must be"),
    ({"name": "x" * 101}, "name must be"),
    ({"sample_rate": "22050"}, "sample_rate must be"),
    ({"sample_rate": 22050.0}, "sample_rate must be"),
    ({"sample_rate": True}, "sample_rate must be"),
    ({"sample_rate": 0}, "sample_rate must be"),
    ({"sample_rate": 10 ** 30}, "sample_rate must be"),
    ({"sample_rate": 4000}, "sample_rate must be a whole number of Hz from 8000 to 192000"),   # no run could write it
    ({"sample_rate": torch.tensor(22050)}, "sample_rate must be"),
    ({"denoiser_strength": -0.01}, "denoiser_strength must be"),
    ({"denoiser_strength": float("nan")}, "denoiser_strength must be"),
    ({"denoiser_strength": float("inf")}, "denoiser_strength must be"),
    ({"denoiser_strength": 10 ** 400}, "denoiser_strength must be"),
    ({"denoiser_strength": "0.01"}, "denoiser_strength must be"),
    ({"denoiser_strength": False}, "denoiser_strength must be"),
])
def test_a_wrong_voice_entry_is_one_line_naming_the_file_and_the_fix(tmp_path, waveglow_sd, entry, names):
    path = tmp_path / "mine.pt"
    cf.write_ngc_waveglow(path, waveglow_sd, voice=entry)
    message = load_error(read_voice_info, path)
    assert names in message and VOICE_ENTRY in message and "fix or remove" in message
    assert len(message) < 400


def test_code_in_a_voice_entry_is_refused_not_run(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {}, VOICE_ENTRY: {"name": _RunsShell(marker)}}, path)
    assert "refused" in load_error(read_voice_info, path)
    assert not marker.exists()


#
