"""The output folder around a run: made ready before it (the folders it
writes in; the temporary files a killed run left, removed), and after it
the files no manifest row names, said or, with --prune, removed."""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Container
from pathlib import Path

from tts_cli.config import Settings
from tts_cli.errors import OutputError, OutputNotice, again, cannot_write, option
from tts_cli.formats import is_shard_folder
from tts_cli.manifest import plural
from tts_cli.tarshards import SHARDS, rewrite_without, superseded


def prepare_output(out_dir: Path, settings: Settings, remove_temp_files: bool = True) -> None:
    try:
        (out_dir / (SHARDS if settings.layout == "webdataset" else "wavs")).mkdir(parents=True, exist_ok=True)
        if settings.save_mels:
            (out_dir / "mels").mkdir(parents=True, exist_ok=True)
        if remove_temp_files:
            for folder in (out_dir, out_dir / SHARDS, *_folders_of(out_dir / "wavs"), *_folders_of(out_dir / "mels")):
                _remove_stale_temp_files(folder)
    except OSError as e:
        raise OutputError(cannot_write(out_dir, e)) from None


# audio.atomic_write's temporary names: ".<final name>.<pid>.tmp".
_TEMP_NAME = re.compile(r"\..+\.(\d+)\.tmp")


def _remove_stale_temp_files(folder: Path) -> None:
    """Delete the temporary files a killed run left behind (its pid is gone);
    those of a live process, which may still be writing, are left alone."""
    for name in _files_in(folder):
        match = name.startswith(".") and _TEMP_NAME.fullmatch(name)
        if match and not _alive(int(match[1])):
            (folder / name).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid < 2 ** 31   # someone else's live process, or no valid pid at all
    return True


def orphans(out_dir: Path, named: Container[str]) -> list[Path]:
    """Audio and mel files in the output's wavs/ and mels/ and their shard
    folders (the names and kinds this tool writes) that no row names
    (``named``: the rows' file names, and their shards', relative to
    ``out_dir``): left by an earlier corpus, or by a line in another audio
    format. From the folders' listings (no stat per file where the file
    system says what each entry is)."""
    found = [f"{where}/{name}"
             for kind, suffixes in (("wavs", (".wav", ".flac")), ("mels", (".npy",)))
             for folder in _folders_of(out_dir / kind) for where in [folder.relative_to(out_dir).as_posix()]
             for name in _files_in(folder) if name.endswith(suffixes)]
    found += [f"{SHARDS}/{name}" for name in _files_in(out_dir / SHARDS)
              if name.startswith("shard-") and name.endswith(".tar")]
    return sorted(out_dir / name for name in found if name not in named and not name.rpartition("/")[2].startswith("."))


def _files_in(folder: Path) -> list[str]:
    """The names of the regular files in ``folder`` (none when it is not one)."""
    try:
        with os.scandir(folder) as entries:
            return [entry.name for entry in entries if entry.is_file()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _folders_of(kind: Path) -> list[Path]:
    """``wavs/`` or ``mels/`` and the shard folders in it (formats.Layout)."""
    if not kind.is_dir():
        return []
    return [kind, *sorted(path for path in kind.iterdir() if is_shard_folder(path.name) and path.is_dir())]


def report_orphans(out_dir: Path, named: Container[str], prune: bool, on_notice) -> None:
    left = orphans(out_dir, named)
    if not left:
        return
    if prune:
        for path in left:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for folder in {path.parent for path in left} - {out_dir / "wavs", out_dir / "mels"}:
            with contextlib.suppress(OSError):   # a shard folder left empty goes; one with other files stays
                folder.rmdir()
        on_notice(f"removed {plural(len(left), 'file')} in {out_dir} (wavs/, mels/, shards/) that no manifest row "
                  f"named ({option('prune', True)})")
    else:
        on_notice(OutputNotice(f"{plural(len(left), 'file')} in {out_dir} (wavs/, mels/, shards/) that no manifest row "
                               f"names (left by an earlier corpus, e.g. {left[0].name}); {option('prune', True)} "
                               "removes them"))


def report_superseded(out_dir: Path, named: Container[str], written: list[str], prune: bool, on_notice) -> None:
    """The members of earlier shards whose lines this run made again or the
    corpus no longer has (``tarshards.superseded``); with ``prune``, those
    shards rewritten without them."""
    earlier = [shard for name in _files_in(out_dir / SHARDS)
               if (shard := f"{SHARDS}/{name}") in named and shard not in written]
    stale = superseded(out_dir, named, earlier)
    if not stale:
        return
    count = sum(len({member.partition(".")[0] for member in members}) for members in stale.values())
    if not prune:
        on_notice(OutputNotice(f"{plural(count, 'line')} in {plural(len(stale), 'earlier shard')} in {out_dir / SHARDS} "
                               f"no manifest row places there (made again into a later shard, or gone from the "
                               f"corpus), e.g. in {next(iter(stale)).name}; a reader of the whole folder would take "
                               f"them too: {option('prune', True)} rewrites those shards without them"))
        return
    try:
        for shard, members in stale.items():
            rewrite_without(shard, members)
    except OSError as e:
        raise OutputError(cannot_write(out_dir, e, then=f"{again()} with {option('prune', True)}")) from None
    on_notice(f"rewrote {plural(len(stale), 'shard')} in {out_dir / SHARDS} without the {plural(count, 'line')} no "
              f"manifest row placed there ({option('prune', True)})")
