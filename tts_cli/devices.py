"""The device and precision a run uses, decided without importing torch.

Importing torch takes seconds; a run's plan (which lines are left to do) and
its first line come before it. The device is part of every resume key, so
it must be known then:

* a device asked for (``cpu``, ``cuda``, ``cuda:N``) is the one used; torch
  says later whether it exists (``engine.resolve_device``);
* with none asked for, CUDA is expected where the installed torch was built
  for CUDA or ROCm (its ``version.py``, read as text) and the machine shows a
  GPU that ``CUDA_VISIBLE_DEVICES`` does not hide. torch has the last word
  when the models load: where it cannot use that GPU after all, the run ends
  in one line saying so and how to run on CPU (``loading``).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import threading
from pathlib import Path

from tts_cli.errors import FatalError, OutputNotice, option

# A line of torch/version.py naming the CUDA or ROCm version it was built for.
_GPU_BUILD = re.compile(r"^(cuda|hip)\b[^=\n]*=\s*['\"]", re.M)
# Where a GPU shows itself: NVIDIA's driver, ROCm's kernel driver, WSL's GPU.
_GPU_SIGNS = ("/proc/driver/nvidia/gpus", "/dev/kfd", "/dev/dxg")
CPU_NOTICE = "running on CPU in fp32 (slow; a CUDA GPU is much faster)"


def expected_device(requested: str | None) -> str:
    """``requested``, or where none was: ``cuda`` when this machine looks able
    to run torch on a GPU, else ``cpu``. A ``cuda:N`` past the GPUs this
    process can see (NVIDIA's driver counts them) ends the run here, before
    its first line."""
    if requested is not None:
        _, _, index = requested.partition(":")
        seen = _visible_nvidia_gpus()
        if device_type(requested) == "cuda" and index and seen is not None and int(index) >= seen:
            usable = {0: f"; use {option('device', 'cpu')}", 1: ": cuda:0"}.get(seen, f": cuda:0 to cuda:{seen - 1}")
            raise FatalError(f"{option('device', requested)}: this machine shows {seen} CUDA device"
                             f"{'s' if seen != 1 else ''} to this process{usable}")
        return requested
    return "cuda" if _gpu_build() and _gpu_visible() else "cpu"


def _visible_nvidia_gpus(root: Path = Path("/")) -> int | None:
    """How many NVIDIA GPUs this process may use: CUDA_VISIBLE_DEVICES's
    list where set, else the driver's; None where the driver does not say."""
    gpus = root / "proc/driver/nvidia/gpus"
    if not gpus.is_dir():
        return None
    count = sum(1 for _ in gpus.iterdir())
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return count
    visible = 0
    for name in listed.split(","):   # CUDA stops at the first entry that names no device
        if not name.strip() or name.strip().startswith("-"):
            break
        visible += 1
    return min(visible, count)


def device_type(device: str) -> str:
    """``cuda:1`` -> ``cuda``."""
    return device.partition(":")[0]


def expected_precision(device: str, requested: str | None) -> tuple[str, str | None]:
    """The precision to run in on ``device`` and a one-line notice when the
    request was changed: fp16 by default on CUDA; fp32 always on CPU (a
    precision asked for and not given is said even under --quiet)."""
    if device_type(device) == "cpu":
        if requested in (None, "fp32"):
            return "fp32", CPU_NOTICE if requested is None else None
        return "fp32", OutputNotice(f"{option('precision', requested)} is for CUDA; running on CPU in fp32")
    return requested or "fp16", None


def _gpu_build() -> bool:
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            return _GPU_BUILD.search((Path(folder) / "version.py").read_text()) is not None
        except OSError:
            continue
    return False


def _gpu_visible(root: Path = Path("/")) -> bool:
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and (not hidden.strip() or hidden.strip().startswith("-")):
        return False
    for sign in _GPU_SIGNS:
        path = root / sign.lstrip("/")
        if path.is_dir() and any(path.iterdir()) or path.exists() and not path.is_dir():
            return True
    return False


def open_cuda_early(device: str) -> None:
    """Create ``device``'s primary CUDA context, the one torch then uses,
    through the driver's library on a thread, so that it is made while torch
    imports instead of after it (BENCHMARKS.md, what each step bought).
    Where the library or the device is missing nothing happens;
    torch finds that out itself and the run says so (loading.py)."""
    _, _, index = device.partition(":")
    threading.Thread(target=_retain_primary_context, args=(int(index or 0),), daemon=True,
                     name="tts-cuda-context").start()


def _retain_primary_context(index: int) -> bool:
    """Whether the context of the index-th visible CUDA device was made (or
    was there). The reference taken is kept: the context lives until the
    process ends, as torch's does."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    return (driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(handle), index) == 0
            and driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle) == 0)


def on_its_device(method):
    """Runs a method of an object with ``on_device()`` (the engine) with its
    GPU as the thread's current device: streams, graph captures and Triton
    launches go to the current device, which is GPU 0 on every thread until set."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.on_device():
            return method(self, *args, **kwargs)
    return run


def available_ram(root: Path = Path("/")) -> int | None:
    """Bytes of RAM this process can still take: the kernel's MemAvailable,
    or less where a cgroup (a container's memory limit) leaves less; None
    where neither can be read (not Linux)."""
    found = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    cgroup = root / "sys/fs/cgroup"
    for limit, usage in (("memory.max", "memory.current"),     # cgroup v2
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):   # v1
        try:
            found.append(max(int((cgroup / limit).read_text()) - int((cgroup / usage).read_text()), 0))
        except (OSError, ValueError):   # no such file, or "max": no limit
            pass
    return min(found) if found else None
