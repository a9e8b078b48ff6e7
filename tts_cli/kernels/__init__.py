"""Triton kernels for the GPU fast paths, one module per model:
``kernels.waveglow`` (WaveGlow's coupling layers as two fused matrix
products per layer) and ``kernels.decoder`` (Tacotron2's decoder step in a
few launches). Each is proven against the plain torch path over a matrix of
model shapes (tests/test_gpu.py), and the callers route any shape a kernel
cannot serve to plain torch.

``available()`` is False without Triton or CUDA; the callers then run plain
torch. Tests run the kernels on the CPU through Triton's interpreter
(tests/test_kernels_interpreted.py).

Every launch is a ``Launch``, made by a pure function of the widths and
dtype (``kernels.decoder.attention_launch`` and the like), so that
tests/test_kernel_targets.py compiles exactly what the engine launches for
each GPU in ``TARGETS``, without a GPU, and checks that it fits there. On
any other GPU the engine runs the plain torch paths (``usable``).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tts_cli.remembered import remembered

try:
    import triton
except ImportError:  # CPU-only installs: the plain torch paths run instead
    triton = None


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


# The GPUs the kernels are compiled and checked for (tests/test_kernel_targets.py),
# by compute capability: the most shared memory one block may use there, in
# bytes (the CUDA programming guide's per-block opt-in limit).
TARGETS = {
    (8, 0): 163 * 1024,   # A100
    (8, 6): 99 * 1024,    # A10, RTX 30xx
    (8, 9): 99 * 1024,    # L4, RTX 40xx
    (9, 0): 227 * 1024,   # H100, H200
}


@dataclass(frozen=True)
class Launch:
    """One kernel configuration, all that Triton compiles for a launch: the
    kernel; its arguments, each a tensor of ``dtype`` unless ``args`` names
    it (a tensor's other dtype, a number's value as launched, or None for an
    integer the kernel does not specialize on); its constexpr arguments; and
    the launch options."""
    kernel: Callable
    dtype: torch.dtype
    args: dict[str, torch.dtype | int | float | None]
    constexprs: dict[str, object]
    num_warps: int
    num_stages: int | None = None        # None: Triton's default

    def run(self, grid: tuple[int, ...], *args) -> None:
        """The kernel over ``grid`` on ``args``, its non-constexpr arguments
        in order, each tensor of the dtype this launch says."""
        for name, x in zip(self.kernel.arg_names, args):
            assert not isinstance(x, torch.Tensor) or x.dtype == self.args.get(name, self.dtype), (name, x.dtype)
        stages = {} if self.num_stages is None else {"num_stages": self.num_stages}
        self.kernel[grid](*args, **self.constexprs, num_warps=self.num_warps, **stages)


def usable(device: torch.device) -> tuple[bool, str | None]:
    """Whether the kernels run on this CUDA device: where Triton and CUDA
    are there and ``refused`` has no reason against it. The notice: where
    they could be but are not run, the line saying why."""
    if not available():
        return False, None
    notice = refused(device)
    return notice is None, notice


def refused(device: torch.device) -> str | None:
    """Where the kernels do not run on this CUDA device, the one-line notice
    saying why; None where they do: an NVIDIA GPU of a capability in TARGETS."""
    if torch.version.hip is not None:
        reason = "the GPU kernels are NVIDIA-only (inline PTX) and this is a ROCm GPU"
    else:
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) in TARGETS:
            return None
        checked = ", ".join(f"{a}.{b}" for a, b in TARGETS)
        reason = (f"the GPU kernels are compiled and checked for compute capability {checked}, "
                  f"and this GPU's is {major}.{minor}")
    return f"{reason}: running the plain PyTorch path instead (slower)"


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: float32 stays float32 (no TF32); the
    setting is moot for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


# What a first run on a machine spends compiling the kernels for a voice and
# precision (BENCHMARKS.md, Start-up): the notice says so before it starts.
FIRST_COMPILE = "about 10 s"
# The modules whose code decides what Triton compiles.
_KERNEL_SOURCES = ("kernels/decoder.py", "kernels/waveglow.py", "decoder_graph.py", "waveglow_fast.py")


class CompiledMark:
    """Whether this machine has compiled the kernels for one voice shape and
    precision before: a file in Triton's cache directory, named by a hash of
    the kernels' code, Triton's and torch's versions, the GPU and ``what``
    (the models' dimensions and dtype). It lives beside the compiled kernels,
    so clearing Triton's cache clears it too."""

    def __init__(self, what: str):
        package = Path(__file__).resolve().parent.parent
        digest = hashlib.sha256(what.encode())
        for name in _KERNEL_SOURCES:
            digest.update((package / name).read_bytes())
        digest.update(f"{triton.__version__} {torch.__version__} {torch.cuda.get_device_name()}".encode())
        self.path = _triton_cache_dir() / f"tts-batch-{digest.hexdigest()[:24]}.compiled"

    def seen(self) -> bool:
        return self.path.exists()

    def remember(self) -> None:
        """Mark the kernels compiled; a cache directory that cannot be written
        only means the next run says it compiles again."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        except OSError:
            pass


def _triton_cache_dir() -> Path:
    """Where Triton keeps compiled kernels (TRITON_CACHE_DIR, else its default)."""
    knobs = getattr(triton, "knobs", None)
    configured = getattr(getattr(knobs, "cache", None), "dir", None)
    return Path(configured or os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def remembered_triton_key() -> None:
    """Let Triton read its cache key from a file instead of computing it.

    Before its first kernel lookup in a process, Triton hashes its own
    files, libtriton's hundreds of megabytes among them, to key its cache
    of compiled kernels, a noticeable part of a small job (BENCHMARKS.md,
    what each step bought). The key depends only on those files, so it is
    kept in Triton's cache directory beside their sizes and modification
    times, and computed again when any of them changes, as ``make``
    decides. A cache directory that cannot be read or written only means
    Triton computes it."""
    cache = getattr(getattr(triton, "runtime", None), "cache", None)
    computed = getattr(cache, "triton_key", None)
    if computed is None or getattr(computed, "remembered", False):
        return
    key = remembered(_triton_cache_dir() / "tts-batch-triton-key.json", _triton_files_fingerprint(), computed)

    def triton_key() -> str:
        return key
    triton_key.remembered = True
    for module in (cache, getattr(triton.runtime, "autotuner", None)):   # both call it by this name
        if getattr(module, "triton_key", None) is computed:
            module.triton_key = triton_key


def _triton_files_fingerprint() -> str:
    """Triton's version and the size and modification time of every file
    under its package directory: what its cache key is made from, and more."""
    root = Path(triton.__file__).resolve().parent
    digest = hashlib.sha256(triton.__version__.encode())
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            stat = os.stat(os.path.join(folder, name))
            digest.update(f"{os.path.relpath(folder, root)}/{name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
