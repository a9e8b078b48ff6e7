"""The voice: which two checkpoint files a run uses, and what its resume
keys need to know of them, all without importing torch (loading.py loads
the models).

Which two files a run uses is decided once, by ``choose_voice``; model loading
and the resume keys' fingerprint both ask it, so they never disagree:

1. ``--tacotron2`` / ``--waveglow`` (or the recipe's ``tacotron2`` /
   ``waveglow``): the given files; one not given is NVIDIA's published file,
   looked for as in 2. The demo voice never stands in for half of a pair.
2. Neither given: NVIDIA's published file names (``PUBLISHED_FILES``) are
   looked for in ./checkpoints, then in the checkpoints/ folder of the source
   tree (``checkpoint_dirs``); both found, they are used.
3. Otherwise, when both demo files (``DEMO_FILES``, a small voice trained for
   trying the tool) are found there, the demo voice is used and the run says so
   in one notice line, naming the published file(s) that would give NVIDIA's
   voice. This holds when one published file is present too: the two
   published models only make sense together, so the notice names the missing
   one rather than ending the run.
4. Neither pair complete: a run-ending error naming the first missing
   published file and where to get it.

A voice is one ``Voice``, filled in as a run learns more of it: chosen
(the files), resolved (``resolve_voice``: their fingerprint, the device and
precision the run expects, before torch is imported) and loaded
(``loading.load_engine``: its name, sample rate and denoiser strength).
Those three come from its WaveGlow file (``loading.voice_settings``), not
from where the file is or what it is called. The resume keys need not read
them: the files' fingerprint decides them, with the run's own
``sample_rate`` / ``denoiser_strength`` where set.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tts_cli.config import Settings
from tts_cli.devices import expected_device, expected_precision
from tts_cli.errors import FatalError, OutputNotice, option
from tts_cli.remembered import remembered

PUBLISHED_FILES = {
    "tacotron2": "tacotron2_statedict.pt",
    "waveglow": "waveglow_256channels_universal_v5.pt",
}
WHERE_TO_GET = {
    "tacotron2": "NVIDIA's published LJSpeech Tacotron2 (linked from github.com/NVIDIA/tacotron2's "
                 "README; NGC's Tacotron2 checkpoints load too)",
    "waveglow": "NVIDIA's published WaveGlow (linked from github.com/NVIDIA/waveglow's README; "
                "NGC's WaveGlow checkpoints load too)",
}
# The demo voice (made by recipes/demo-voice), used when NVIDIA's files are not there.
DEMO_FILES = {
    "tacotron2": "demo_tacotron2.pt",
    "waveglow": "demo_waveglow.pt",
}


@dataclass(frozen=True)
class Voice:
    """A voice: its two checkpoint files (``choose_voice``); resolved for a
    run, what its resume keys need (``resolve_voice``); loaded, what its
    WaveGlow file states of it (``loading.load_engine``). A field not known
    yet is None (the label: empty)."""
    tacotron2: Path | None          # None: models the caller built (the bench's)
    waveglow: Path | None
    demo: bool = False              # the demo voice stands in for NVIDIA's
    notices: tuple[str, ...] = ()   # one line each for the run's start: the demo voice, a precision changed
    # resolved
    fingerprint: dict[str, str] | None = None   # sha256 of each file, or what stands for them
    device: str | None = None       # the device the run expects: cpu, cuda or cuda:N
    precision: str | None = None    # fp32, fp16 or bf16
    label: str = ""                 # the voice as the run's first line names it
    # loaded: the file's values, the reference's where it states none
    name: str | None = None         # shown to the user
    sample_rate: int | None = None  # Hz of the audio its WaveGlow makes
    denoiser_strength: float | None = None   # what a run that sets none uses; 0: no denoiser

    def path(self, kind: str) -> Path:
        return getattr(self, kind)


def choose_voice(settings: Settings) -> Voice:
    """The files this run uses; the order is in the module docstring."""
    given = {kind: getattr(settings, kind) for kind in PUBLISHED_FILES}
    published = {kind: _look_for(name) for kind, name in PUBLISHED_FILES.items()}
    if any(path is not None for path in given.values()):
        return Voice(**{kind: Path(given[kind]) if given[kind] is not None
                        else published[kind] or _missing(kind) for kind in PUBLISHED_FILES})
    if all(published.values()):
        return Voice(**published)
    demo = demo_voice()
    if demo is not None:
        return replace(demo, notices=(_demo_notice({kind: demo.path(kind) for kind in DEMO_FILES}, published),))
    return _missing(next(kind for kind, path in published.items() if path is None))


def demo_voice() -> Voice | None:
    """The demo voice's two files, where both are found (``checkpoint_dirs``)."""
    demo = {kind: _look_for(name) for kind, name in DEMO_FILES.items()}
    return Voice(**demo, demo=True) if all(demo.values()) else None


def checkpoint_dirs() -> list[Path]:
    """Where the published checkpoints and the demo voice are looked for:
    ./checkpoints, then the checkpoints/ folder of the source tree this
    package runs from, then (in a non-editable install, which has no source
    tree) the installed copy of that folder, ``tts_cli.demo_voice``."""
    dirs = [Path.cwd() / "checkpoints"]
    source_tree = Path(__file__).resolve().parent.parent / "checkpoints"
    if source_tree.is_dir():
        dirs.append(source_tree)
    try:
        from tts_cli import demo_voice
        dirs.append(Path(demo_voice.__file__).parent)
    except ImportError:     # run from the source tree, not installed
        pass
    return list(dict.fromkeys(d.resolve() for d in dirs))


def _look_for(name: str) -> Path | None:
    for folder in checkpoint_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


def _missing(kind: str):
    name = PUBLISHED_FILES[kind]
    folders = checkpoint_dirs()
    searched = " or ".join(str(folder) for folder in folders)
    given = option(kind, "PATH") if option(kind).startswith("--") else f"{kind}=<path>"
    raise FatalError(f"no {option(kind)} given and no {name} in {searched}; put {WHERE_TO_GET[kind]} "
                     f"in {folders[0]} as {name}, or pass {given}")


def _demo_notice(demo: dict[str, Path], published: dict[str, Path | None]) -> str:
    folders = {path.parent for path in demo.values()}
    where = (f"{_shown(folders.pop())}/demo_*.pt" if len(folders) == 1
             else ", ".join(_shown(path) for path in demo.values()))
    missing = " and ".join(PUBLISHED_FILES[kind] for kind, path in published.items() if path is None)
    found = " and ".join(PUBLISHED_FILES[kind] for kind, path in published.items() if path is not None)
    todo = f"put {missing} in checkpoints/" + (f" too (only {found} was found)" if found else "")
    guide = next(iter(demo.values())).parent / "README.md"   # shipped beside the demo files, installed or not
    see = f" (see {_shown(guide)})" if guide.is_file() else ""
    return OutputNotice(f"using the demo voice ({where}; robotic, for trying the tool): "
                        f"for NVIDIA's voice {todo}{see}")


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def resolve_voice(settings: Settings) -> Voice:
    """The run's voice, from its settings (the order in the module docstring),
    resolved: what the resume keys need of it, before torch is imported (a
    re-run with nothing left to do never imports it)."""
    device = expected_device(settings.device)
    precision, notice = expected_precision(device, settings.precision)
    files = choose_voice(settings)
    label = ("the demo voice" if files.demo
             else f"{_shown(files.tacotron2.resolve())} + {_shown(files.waveglow.resolve())}")
    return replace(files, notices=tuple(line for line in (notice, *files.notices) if line),
                   fingerprint=model_fingerprint(files), device=device, precision=precision, label=label)


def model_fingerprint(files: Voice) -> dict[str, str]:
    """sha256 of the two files: a resume key must change when the weights
    change, whatever the files are called (switching between the demo voice
    and NVIDIA's redoes every line). Hashing NVIDIA's two files is a
    noticeable part of a small run's start (BENCHMARKS.md, Start-up), so it
    is done once per run (``resolve_voice``) and kept between runs
    (``remembered_digest``)."""
    return {kind: remembered_digest(files.path(kind)) for kind in PUBLISHED_FILES}


# A file changed less than this long ago is hashed at every run and its
# digest not kept: a rewrite of the same size within the file system's
# timestamp resolution would leave its times as they were.
SETTLED_SECONDS = 2.0


def remembered_digest(path: str | os.PathLike) -> str:
    """``file_digest(path)``, kept in the user's cache directory with what
    identifies the file's bytes as git's index does: its device, inode,
    size, modification and change times (a rewrite changes the change time,
    which no tool can set back). A cache that cannot be read or written
    only means the file is hashed."""
    name = os.fspath(path)
    try:
        stat = os.stat(name)
    except OSError as exc:
        raise FatalError(f"{name}: cannot read: {exc.strerror or exc}") from None
    identity = [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
    memo = _digest_cache() / f"{hashlib.sha256(os.path.realpath(name).encode()).hexdigest()[:32]}.json"
    settled = time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > SETTLED_SECONDS * 1e9
    return remembered(memo, identity, lambda: file_digest(name), keep=settled)


def _digest_cache() -> Path:
    """Where the files' digests are kept: tts-batch/digests in
    $XDG_CACHE_HOME, else in ~/.cache."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "tts-batch" / "digests"


def file_digest(path: str | os.PathLike) -> str:
    """sha256 hex digest of the file's bytes, read in chunks."""
    name = os.fspath(path)
    digest = hashlib.sha256()
    try:
        with open(name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise FatalError(f"{name}: cannot read: {exc.strerror or exc}") from None
    return digest.hexdigest()
