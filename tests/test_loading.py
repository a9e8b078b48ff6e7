"""Every published checkpoint format, written with a tiny model's weights, loads
through the real path into a model that speaks exactly like the original."""
import pytest
import torch

import checkpoint_files as files
from tts_cli.config import Settings
from tts_cli.loading import load_models
from tiny_models import canonical, tiny_tacotron2, tiny_waveglow

TACOTRON2_WRITERS = {
    "nvidia": files.write_nvidia_tacotron2,
    "nvidia-legacy-serialization": lambda p, sd: files.write_nvidia_tacotron2(p, sd, legacy=True),
    "ngc": files.write_ngc_tacotron2,
    "ngc-fp16": lambda p, sd: files.write_ngc_tacotron2(p, sd, fp16=True),
}
WAVEGLOW_WRITERS = {
    "pickled-module": files.write_pickled_waveglow,
    "pickled-module-before-aug-2019": lambda p, sd: files.write_pickled_waveglow(p, sd, per_layer_cond=True),
    "pickled-module-legacy-torch1": lambda p, sd: files.write_pickled_waveglow(p, sd, legacy=True),
    "ngc": files.write_ngc_waveglow,
    "ngc-fp16": lambda p, sd: files.write_ngc_waveglow(p, sd, fp16=True),
}


@torch.inference_mode()
@pytest.mark.parametrize("tacotron2_format", TACOTRON2_WRITERS)
@pytest.mark.parametrize("waveglow_format", WAVEGLOW_WRITERS)
def test_each_format_loads_into_the_same_voice(tmp_path, tacotron2_format, waveglow_format):
    tacotron2, waveglow = tiny_tacotron2(seed=9), tiny_waveglow(seed=9)
    if "fp16" in tacotron2_format:  # the file stores fp16: compare with fp16-rounded weights
        tacotron2.load_state_dict({k: v.half().float() for k, v in tacotron2.state_dict().items()})
    if "fp16" in waveglow_format:
        waveglow.load_state_dict({k: v.half().float() for k, v in waveglow.state_dict().items()})
    TACOTRON2_WRITERS[tacotron2_format](tmp_path / "t.pt", canonical(tacotron2))
    WAVEGLOW_WRITERS[waveglow_format](tmp_path / "w.pt", canonical(waveglow))
    loaded_t, loaded_w = load_models(Settings(tacotron2=str(tmp_path / "t.pt"),
                                              waveglow=str(tmp_path / "w.pt")))
    ids, lengths = torch.tensor([[20, 30, 40, 11, 50]]), torch.tensor([5])
    assert torch.allclose(loaded_t.encode(ids, lengths)[0], tacotron2.encode(ids, lengths)[0], atol=1e-5)
    mel, frames = torch.randn(1, 16, 7), torch.tensor([7])
    seeds = torch.tensor([3])
    expected = waveglow.infer(mel, frames, seeds, sigma=0.666)
    assert torch.allclose(loaded_w.infer(mel, frames, seeds, sigma=0.666), expected,
                          atol=1e-4 * expected.abs().max())
