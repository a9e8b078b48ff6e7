"""The device and precision a run expects before torch is imported."""
import ctypes.util

import pytest
import torch

from tts_cli import devices
from tts_cli.devices import CPU_NOTICE, expected_device, expected_precision


def test_a_device_asked_for_is_the_one_expected(monkeypatch):
    monkeypatch.setattr(devices, "_gpu_build", lambda: False)
    assert expected_device("cuda:1") == "cuda:1" and expected_device("cpu") == "cpu"


def test_the_build_is_read_as_torch_itself_reports_it():
    assert devices._gpu_build() == (torch.version.cuda is not None or torch.version.hip is not None)


@pytest.mark.parametrize("sign", ["proc/driver/nvidia/gpus/0000:1b:00.0", "dev/kfd", "dev/dxg"])
def test_a_gpu_shows_itself_unless_cuda_visible_devices_hides_it(tmp_path, monkeypatch, sign):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert not devices._gpu_visible(tmp_path)
    (tmp_path / sign).parent.mkdir(parents=True)
    (tmp_path / sign).write_text("")
    assert devices._gpu_visible(tmp_path)
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not devices._gpu_visible(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert devices._gpu_visible(tmp_path)


def test_without_a_request_cuda_needs_both_a_gpu_build_and_a_gpu(monkeypatch):
    for build, visible, expected in ((True, True, "cuda"), (True, False, "cpu"), (False, True, "cpu")):
        monkeypatch.setattr(devices, "_gpu_build", lambda: build)
        monkeypatch.setattr(devices, "_gpu_visible", lambda: visible)
        assert expected_device(None) == expected


def test_cpu_runs_fp32_and_says_why_when_asked_otherwise():
    assert expected_precision("cpu", None) == ("fp32", CPU_NOTICE)
    assert expected_precision("cpu", "fp32") == ("fp32", None)
    assert expected_precision("cpu", "bf16") == ("fp32", "--precision bf16 is for CUDA; running on CPU in fp32")
    assert expected_precision("cuda:0", None) == ("fp16", None)
    assert expected_precision("cuda", "bf16") == ("bf16", None)


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this machine has CUDA's driver")
def test_without_cuda_s_driver_the_early_context_gives_up_quietly():
    """On a machine with no CUDA driver library (a run asked for cuda there
    ends in torch's one-line refusal, not in this thread), making the
    context early neither raises nor claims a context."""
    assert devices._retain_primary_context(0) is False
    devices.open_cuda_early("cuda:1")   # returns at once: the work is on its thread


@pytest.mark.parametrize("listed, seen", [(None, 2), ("1", 1), ("0,1", 2), ("1,-1,0", 1), ("", 0), ("-1", 0)])
def test_the_gpus_a_process_may_use_are_counted_as_cuda_counts_them(tmp_path, monkeypatch, listed, seen):
    gpus = tmp_path / "proc/driver/nvidia/gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (gpus / bus).mkdir(parents=True)
    if listed is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    assert devices._visible_nvidia_gpus(tmp_path) == seen
    assert devices._visible_nvidia_gpus(tmp_path / "elsewhere") is None


def test_a_gpu_the_process_cannot_see_ends_the_run_before_its_first_line(tmp_path, monkeypatch):
    """--device cuda:7 on a machine showing one GPU: one line, exit 2, no
    plan line claiming the run will go "on cuda:7"."""
    from click.testing import CliRunner
    from tts_cli.cli import main
    monkeypatch.setattr(devices, "_visible_nvidia_gpus", lambda: 1)
    (tmp_path / "corpus.txt").write_text("Hi.\n")
    result = CliRunner().invoke(main, [str(tmp_path / "corpus.txt"), "-o", str(tmp_path / "out"),
                                       "--device", "cuda:7"])
    assert result.exit_code == 2
    assert result.output == "tts-batch: error: --device cuda:7: this machine shows 1 CUDA device to this process: cuda:0\n"
