"""Shared fixtures: tiny checkpoints written in the published file formats."""
import os

import pytest

from checkpoint_files import write_nvidia_tacotron2, write_pickled_waveglow
from tiny_models import canonical, tiny_tacotron2, tiny_waveglow


@pytest.fixture(scope="session", autouse=True)
def own_cache_home(tmp_path_factory):
    """The tests' runs keep what they cache (the voices' digests) in a folder
    of their own, not in the user's ~/.cache."""
    kept = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if kept is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = kept


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """(tacotron2 path, waveglow path): NVIDIA's state-dict Tacotron2 file and
    NVIDIA's pickled-module WaveGlow file, with tiny random weights."""
    folder = tmp_path_factory.mktemp("checkpoints")
    tacotron2, waveglow = folder / "tacotron2_statedict.pt", folder / "waveglow_256channels_universal_v5.pt"
    write_nvidia_tacotron2(tacotron2, canonical(tiny_tacotron2(seed=4)))
    write_pickled_waveglow(waveglow, canonical(tiny_waveglow(seed=4)))
    return tacotron2, waveglow


@pytest.fixture(scope="session")
def never_stopping_checkpoints(tmp_path_factory):
    """(tacotron2 path, waveglow path) of a Tacotron2 whose stop gate never
    fires: every line decodes up to --max-decoder-steps and is truncated."""
    folder = tmp_path_factory.mktemp("never-stopping")
    tacotron2, waveglow = folder / "tacotron2.pt", folder / "waveglow.pt"
    write_nvidia_tacotron2(tacotron2, canonical(tiny_tacotron2(seed=5, gate_bias=-10.0)))
    write_pickled_waveglow(waveglow, canonical(tiny_waveglow(seed=5)))
    return tacotron2, waveglow


def pytest_collection_modifyitems(config, items):
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine")
    for item in items:
        if "requires_cuda" in item.keywords:
            item.add_marker(skip)
