"""Which GPUs the Triton kernels run on, and that every kernel configuration
the engine launches fits each of them.

The engine runs the kernels on the GPUs of ``kernels.TARGETS`` (A100; A10
and RTX 30xx; L4 and RTX 40xx; H100 and H200) and the plain PyTorch path on
any other GPU, saying why in one line (``kernels.refused``). A part of
Tacotron2 whose kernel does not serve the model's widths runs as its module,
and the run says that too.

Every launch the graph decoder and FastWaveGlow make (``kernel_launches`` of
decoder_graph.py and waveglow_fast.py, built by the functions the launchers
call), in each dtype, over a matrix of model shapes the loader accepts
(NVIDIA's published ones, the shipped demo voice's, the tests' tiny ones,
odd and wide ones), is compiled by Triton's own compiler for each target
on the CPU, no GPU needed, its arguments specialized as Triton's launcher
specializes them: tensors 16-byte aligned, as torch allocates them (the
graph decoder's per-step views into its frame and gate buffers can be
less aligned, which Triton compiles with narrower loads and stores); an
integer of 1 as a constant, one divisible by 16 as such. Each must use no
more shared memory than the target gives a block, at most 255 registers a
thread and 65,536 a block (else the launch fails), and spill at most a few
registers.

Those checks are skipped where Triton is not installed or cannot compile
for CUDA. They take about three minutes on 2 cores; Triton keeps what it
compiled in TRITON_CACHE_DIR (a fresh directory unless that is set), so with
it set a second run takes seconds. Run with -s for the published shapes'
table.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import importlib
import multiprocessing
import os
import re
import subprocess
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from tiny_models import TACOTRON2_DIMS as TINY_TACOTRON2, WAVEGLOW_DIMS as TINY_WAVEGLOW
from tts_cli import kernels
from tts_cli.checkpoints import load_tacotron2_weights, load_waveglow_weights
from tts_cli.decoder_graph import GraphedDecoder, kernel_launches as decoder_launches
from tts_cli.kernels import decoder as decoder_kernels
from tts_cli.tacotron2 import PUBLISHED_DIMS as TACOTRON2_PUBLISHED, DecodeSettings, Tacotron2, Tacotron2Dims
from tts_cli.waveglow import PUBLISHED_DIMS as WAVEGLOW_PUBLISHED, WaveGlowDims
from tts_cli.waveglow_fast import kernel_launches as waveglow_launches, supports

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
THREAD_REGISTERS, BLOCK_REGISTERS = 255, 65536     # every target's limits
# Spilled registers a thread may keep on its stack: a few registers' worth,
# which stays in L1. Triton 3.6 and 3.9 spill up to 32 bytes of a launch the
# engine makes (the demo voice's WaveGlow taps in bf16); the tiles the kernels
# refuse spill 168 bytes and more (kernels/decoder.py).
SPILLED_BYTES = 64
TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.uint8: "u8",
                torch.int64: "i64"}


@functools.cache
def tacotron2_shapes() -> dict[str, Tacotron2Dims]:
    published = functools.partial(dataclasses.replace, TACOTRON2_PUBLISHED)
    demo = load_tacotron2_weights(ROOT / "checkpoints" / "demo_tacotron2.pt")
    return {
        "published": TACOTRON2_PUBLISHED,
        "demo voice": Tacotron2Dims.from_state_dict(demo),
        "tiny (the tests')": TINY_TACOTRON2,
        "odd widths": published(embedding_dim=514, n_mel=100, prenet_dims=(300, 200), attention_rnn_dim=1000,
                                decoder_rnn_dim=1100, attention_dim=100, location_kernel=21),
        "wide: encoder 1024, LSTMs 2048, prenet 512": published(
            embedding_dim=1024, attention_rnn_dim=2048, decoder_rnn_dim=2048, prenet_dims=(512, 512)),
        # wider than the attention and prenet kernels serve: those run as modules
        "attention dim 256": published(attention_dim=256),
        "attention dim 512": published(attention_dim=512),
        "63 location taps": published(location_kernel=63),
        "prenet 1024 wide": published(prenet_dims=(1024, 256)),
    }


@functools.cache
def waveglow_shapes() -> dict[str, WaveGlowDims]:
    """Each one ``supports`` accepts."""
    small = functools.partial(dataclasses.replace, WAVEGLOW_PUBLISHED, n_flows=4, n_early_every=2, wn_layers=2)
    demo = load_waveglow_weights(ROOT / "checkpoints" / "demo_waveglow.pt")
    return {
        "published": WAVEGLOW_PUBLISHED,
        "demo voice": WaveGlowDims.from_state_dict(demo),
        "tiny (the tests')": TINY_WAVEGLOW,
        "192 channels": small(wn_channels=192),
        "one layer, n_mel 16": small(wn_layers=1, wn_channels=48, n_mel=16),
    }


@dataclasses.dataclass(frozen=True)
class Compile:
    """One launch as ``triton.compile`` takes it (picklable, for the worker
    processes): the kernel by module and name, its signature and constexprs
    as Triton's launcher specializes the launch's arguments, the indices of
    the arguments divisible by 16, and the options."""
    module: str
    name: str
    signature: tuple
    constexprs: tuple
    aligned: tuple
    options: tuple

    @classmethod
    def of(cls, launch: kernels.Launch) -> "Compile":
        signature, constexprs, aligned = {}, dict(launch.constexprs), []
        for i, param in enumerate(launch.kernel.params):
            if param.is_constexpr:
                signature[param.name] = "constexpr"
                continue
            value = launch.args.get(param.name, launch.dtype)
            if isinstance(value, torch.dtype):
                signature[param.name] = "*" + TRITON_TYPES[value]
                aligned.append(i)
            elif isinstance(value, float):
                signature[param.name] = "fp32"
            elif value is None or param.do_not_specialize:
                signature[param.name] = "i32"
            elif value == 1:
                signature[param.name] = "constexpr"
                constexprs[param.name] = 1
            else:
                signature[param.name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
                if value % 16 == 0:
                    aligned.append(i)
        options = {"num_warps": launch.num_warps}
        if launch.num_stages is not None:
            options["num_stages"] = launch.num_stages
        fn = launch.kernel.fn
        return cls(fn.__module__, fn.__name__, tuple(signature.items()), tuple(constexprs.items()),
                   tuple(aligned), tuple(options.items()))


@dataclasses.dataclass(frozen=True)
class Resources:
    shared: int        # bytes of shared memory a block uses
    registers: int     # a thread's
    threads: int       # a block's
    spilled: int       # bytes of a thread's stack frame, where ptxas puts the registers it spills

    def misfit(self, shared_limit: int) -> bool:
        return (self.shared > shared_limit or self.registers > THREAD_REGISTERS
                or self.registers * self.threads > BLOCK_REGISTERS or self.spilled > SPILLED_BYTES)


def compiled(job: Compile, capability: tuple[int, int]) -> Resources:
    """``job`` compiled for a GPU of this compute capability, and what it uses."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernel = getattr(importlib.import_module(job.module), job.name)
    source = ASTSource(kernel, dict(job.signature), dict(job.constexprs),
                       {(i,): [["tt.divisibility", 16]] for i in job.aligned})
    made = kernels.triton.compile(source, target=GPUTarget("cuda", 10 * capability[0] + capability[1], 32),
                                  options=dict(job.options))
    registers, stack = _registers_and_stack(made.asm["cubin"])
    return Resources(made.metadata.shared, registers, made.metadata.num_warps * 32, stack)


def _registers_and_stack(cubin: bytes) -> tuple[int, int]:
    """A thread's registers and stack frame in bytes, as cuobjdump (shipped
    with Triton) reads them off the compiled kernel."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        report = subprocess.run([_cuobjdump(), "--dump-resource-usage", str(path)], capture_output=True,
                                text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", report)
    assert found, report
    return int(found[1]), int(found[2])


def _cuobjdump() -> str:
    tool = getattr(getattr(getattr(kernels.triton, "knobs", None), "nvidia", None), "cuobjdump", None)
    if tool is not None:
        return tool.path
    return str(Path(kernels.triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def engine_launches() -> dict[Compile, list[str]]:
    """Every distinct compile of the engine's launches over the shapes and
    dtypes, with where each is launched."""
    found: dict[Compile, list[str]] = {}
    for model, shapes, launches_of in (("Tacotron2", tacotron2_shapes(), decoder_launches),
                                       ("WaveGlow", waveglow_shapes(), waveglow_launches)):
        for shape, dims in shapes.items():
            for precision, dtype in DTYPES.items():
                for part, launch in launches_of(dims, dtype).items():
                    if launch is not None:
                        found.setdefault(Compile.of(launch), []).append(f"{model} {shape}, {precision}: {part}")
    return found


def _use_cache(folder: str, quiet: bool = False) -> None:
    """Triton's cache in ``folder``; ``quiet``: in a worker process, whose
    warnings would go past pytest (the main process's show in its summary)."""
    os.environ["TRITON_CACHE_DIR"] = folder
    if quiet:
        warnings.simplefilter("ignore")


@pytest.fixture(scope="module")
def resources(tmp_path_factory) -> dict[tuple[Compile, tuple[int, int]], Resources]:
    """Every engine launch compiled for every target, in a process per core
    (8 at most: each holds torch and Triton)."""
    pytest.importorskip("triton")
    cache = os.environ.get("TRITON_CACHE_DIR") or str(tmp_path_factory.mktemp("triton-cache"))
    _use_cache(cache)
    probe = Compile.of(decoder_kernels.query_launch(torch.float32, 16, 16))
    try:
        compiled(probe, (8, 0))
    except Exception as e:  # noqa: BLE001 - a Triton without its CUDA backend or tools
        pytest.skip(f"Triton cannot compile for CUDA here: {type(e).__name__}: {e}")
    jobs = [(job, capability) for job in engine_launches() for capability in kernels.TARGETS]
    with concurrent.futures.ProcessPoolExecutor(min(os.cpu_count() or 1, 8), multiprocessing.get_context("spawn"),
                                                initializer=_use_cache, initargs=(cache, True)) as pool:
        return dict(zip(jobs, pool.map(compiled, *zip(*jobs))))


@pytest.mark.parametrize("capability", kernels.TARGETS, ids=[f"sm_{a}{b}" for a, b in kernels.TARGETS])
def test_every_kernel_launch_of_the_engine_fits_each_gpu_it_runs_on(resources, capability):
    where, limit = engine_launches(), kernels.TARGETS[capability]
    used = {job: r for (job, target), r in resources.items() if target == capability}
    misfits = [f"{job.name} {dict(job.constexprs)} {dict(job.options)}: {r}; launched for {where[job][:3]}"
               for job, r in used.items() if r.misfit(limit)]
    assert len(used) == len(where)
    assert not misfits, (f"{len(misfits)} launches do not fit sm_{capability[0]}{capability[1]} ({limit} bytes "
                         "of shared memory a block):\n" + "\n".join(misfits))
    spills = sorted({f"{where[job][0]}: {r.spilled} bytes" for job, r in used.items() if r.spilled})
    print(f"\nsm_{capability[0]}{capability[1]}: {len(used)} launches fit; spilling:", *spills, sep="\n  ")


def test_the_published_shapes_launches_and_what_they_use(resources):
    """The published shapes' every launch compiled for every target (the
    table in BENCHMARKS.md, GPU targets; run with -s)."""
    lines = []
    for job, places in engine_launches().items():
        for place in places:
            if place.split(",")[0] in ("Tacotron2 published", "WaveGlow published"):
                cells = [resources[job, capability] for capability in kernels.TARGETS]
                lines.append(f"{place:62}" + "".join(f"{r.shared / 1024:6.1f} {r.registers:3d} {r.spilled:2d}  "
                                                     for r in cells))
    heading = " " * 62 + "".join(f"sm_{a}{b}".ljust(15) for a, b in kernels.TARGETS)
    print(f"\n{heading}\n{'shared memory (KiB), registers, bytes spilled':>62}", *sorted(lines), sep="\n")
    # the two models' every part, in each dtype
    assert len(lines) == 3 * (8 + 2)


@pytest.mark.parametrize("shape", ["attention dim 256", "attention dim 512", "63 location taps",
                                   "prenet 1024 wide"])
def test_a_part_wider_than_its_kernel_runs_as_its_module_and_the_run_says_so(shape):
    """The graph decoder with its kernels (as on a GPU they run on): the part
    its kernel does not serve runs as the module, the others fused; one
    notice names the part and the widths."""
    pytest.importorskip("triton")
    dims = tacotron2_shapes()[shape]
    with torch.device("meta"):
        model = Tacotron2(dims).eval()
    graphed = GraphedDecoder(model, DecodeSettings(), use_kernels=True)
    wide_attention = "prenet" not in shape
    assert (graphed.attention is None) == (graphed.few_rows.attention is None) == wide_attention
    assert (graphed.prenet is None) == (not wide_attention)
    assert graphed.few_rows.attention_rnn is not None and graphed.few_rows.output is not None
    [notice] = graphed.notices
    part = "attention" if wide_attention else "prenet"
    assert f"Tacotron2's {part}" in notice and "plain module" in notice
    assert (f"attention dim {dims.attention_dim} by {dims.location_kernel}" in notice if wide_attention
            else f"{dims.prenet_dims[0]} units" in notice)


def test_the_shapes_checked_are_ones_the_loader_and_the_fast_paths_accept():
    pytest.importorskip("triton")
    for dims in tacotron2_shapes().values():
        assert dims.checked() == dims
    for dims in waveglow_shapes().values():
        assert dims.checked() == dims and supports(dims)
    # the published shapes run every kernel
    assert all(decoder_launches(TACOTRON2_PUBLISHED, torch.float16).values())
    assert all(waveglow_launches(WAVEGLOW_PUBLISHED, torch.float16).values())


@pytest.mark.parametrize("hip, capability, named", [
    ("6.2.41133", (9, 4), "ROCm"),
    (None, (7, 5), "this GPU's is 7.5"),
    (None, (8, 7), "this GPU's is 8.7"),
    (None, (10, 0), "this GPU's is 10.0"),
    (None, (12, 0), "this GPU's is 12.0"),
])
def test_on_a_gpu_the_kernels_are_not_checked_for_the_engine_runs_the_plain_path_and_says_why(
        monkeypatch, hip, capability, named):
    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    runs, notice = kernels.usable(torch.device("cuda"))
    assert not runs
    assert named in notice and "running the plain PyTorch path" in notice
    if hip is None:
        assert "8.0, 8.6, 8.9, 9.0" in notice


@pytest.mark.parametrize("capability", kernels.TARGETS, ids=[f"sm_{a}{b}" for a, b in kernels.TARGETS])
def test_on_the_gpus_the_kernels_are_checked_for_they_run(monkeypatch, capability):
    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert kernels.usable(torch.device("cuda")) == (True, None)


def test_without_triton_or_cuda_the_plain_path_runs_without_a_notice(monkeypatch):
    """As CPU-only installs always ran."""
    monkeypatch.setattr(kernels, "available", lambda: False)
    assert kernels.usable(torch.device("cuda")) == (False, None)
