"""The webdataset layout: lines appended to tar shards in ``shards/``.

Each line is a group of members sharing a key, as WebDataset reads them:
``<key>.wav`` (or ``.flac``), ``<key>.json`` (its manifest row) and, with
``--save-mels``, ``<key>.npy``. A shard is written under a hidden temporary
name and renamed ``shard-000000.tar``, ``shard-000001.tar``, ... once it
holds about ``TAR_SHARD_BYTES`` or the run ends, so a shard that exists is
whole. Its lines' rows are handed to the manifest only then
(``TarShards.take_whole``): until their shard is whole its lines stay
pending, so a run that fails to write a shard, or is killed mid-shard,
leaves no row naming audio that is not there (a killed run's temporary
file is removed by the next run, which makes those lines again). A later
run starts a new shard; it never appends to a finished one.

The key is the line's id, with any "." written "_": WebDataset takes the
key to end at a member name's first dot.
"""
from __future__ import annotations

import functools
import io
import os
import re
import tarfile
import threading
from collections.abc import Container, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

from tts_cli.audio import WriteError, atomic_write
from tts_cli.errors import option
from tts_cli.formats import SHARDS

if TYPE_CHECKING:
    from tts_cli.corpus import Utterance
ONE_PROCESS = ("--layout webdataset writes its tar shards from one process; run it without torchrun, "
               "or use the files layout")
T = TypeVar("T")
# Where the line's row says its audio is: shards/shard-000003.tar/<key>.<ext>
_MEMBER_PATH = re.compile(rf"{SHARDS}/(shard-[0-9]{{6,}}\.tar)/([^/]+)")


def key_of(line_id: str) -> str:
    return line_id.replace(".", "_")


def clashing_keys(utterances: Iterable[Utterance]) -> str | None:
    """One line naming the first two lines whose ids are one key in a shard
    (``a.b`` and ``a_b``; ids that differ in case only the corpus refused
    already), else None."""
    seen: dict[str, Utterance] = {}
    for u in utterances:
        earlier = seen.setdefault(key_of(u.id).casefold(), u)
        if earlier is not u:
            return (f"corpus lines {earlier.line} and {u.line}: ids {earlier.id!r} and {u.id!r} are one key in a "
                    f"tar shard ({key_of(u.id)!r}; WebDataset ends a key at its first '.'); rename one, or use "
                    f"{option('layout', 'files')}")
    return None


def shard_of(path: str) -> str | None:
    """The shard file (``shards/shard-000003.tar``) a row's path points into."""
    match = _MEMBER_PATH.fullmatch(path)
    return f"{SHARDS}/{match[1]}" if match else None


def member_key(path: str) -> str:
    """A line's members in a shard, named by one of them:
    ``shards/shard-000003.tar/<key>.wav`` -> ``shards/shard-000003.tar/<key>``."""
    shard, _, member = path.rpartition("/")
    return f"{shard}/{member.partition('.')[0]}"


def superseded(out_dir: Path, named: Container[str], shards: Iterable[str]) -> dict[Path, list[str]]:
    """Of ``shards`` (``shards/shard-000003.tar``, named by rows), the
    members whose line no row places there: a line made again into a later
    shard, or no longer in the corpus. A reader of the whole folder would
    take them too. By shard file."""
    found = {}
    for shard in shards:
        path = out_dir / shard
        try:
            stat = path.stat()
        except OSError:
            continue
        stale = [member for member in _index(path, stat.st_size, stat.st_mtime_ns)
                 if member_key(f"{shard}/{member}") not in named]
        if stale:
            found[path] = stale
    return found


def rewrite_without(shard: Path, stale: Iterable[str]) -> None:
    """``shard`` again without the members ``stale`` (the others as they
    were, same names and bytes), under a temporary name renamed over it."""
    stale = set(stale)
    with atomic_write(shard) as temp_path, tarfile.open(shard, "r:") as old, \
            tarfile.open(temp_path, "w", format=tarfile.PAX_FORMAT) as new:
        for member in old:
            if member.isfile() and member.name not in stale:
                new.addfile(member, old.extractfile(member))


def member_size(out_dir: Path, path: str) -> int | None:
    """The size of the member a row's path names (``shards/<shard>/<member>``),
    from the shard's index (read once a shard, while it is unchanged); None
    when the shard or the member is not there."""
    match = _MEMBER_PATH.fullmatch(path)
    if match is None:
        return None
    shard = out_dir / SHARDS / match[1]
    try:
        found = shard.stat()
    except OSError:
        return None
    return _index(shard, found.st_size, found.st_mtime_ns).get(match[2])


@functools.lru_cache(maxsize=64)
def _index(shard: Path, size: int, mtime_ns: int) -> dict[str, int]:
    try:
        with tarfile.open(shard, "r:") as tar:
            return {member.name: member.size for member in tar if member.isfile()}
    except (OSError, tarfile.TarError):
        return {}


class TarShards(Generic[T]):
    """Appends lines to shards of about ``limit`` bytes; safe to call from
    the writer threads (one line at a time goes in). What each line's
    ``make`` returned (its row) is held until its shard is whole."""

    def __init__(self, out_dir: Path, limit: int):
        self.folder, self.limit = out_dir / SHARDS, limit
        self._lock = threading.Lock()
        self._tar: tarfile.TarFile | None = None
        self._file = None
        self._next = 1 + max((int(p.name[6:-4]) for p in self.folder.glob("shard-*.tar")
                              if p.name[6:-4].isdigit()), default=-1)
        self._name = ""
        self._in_open: list[T] = []   # the open shard's lines
        self._whole: list[T] = []     # lines of shards finished since take_whole
        self.written: list[str] = []  # the shards finished, as rows name them

    def add(self, key: str, make: Callable[[str], tuple[list[tuple[str, bytes]], T]]) -> T:
        """Put one line in the open shard: ``make(shard)`` gives its members'
        (extension, bytes) pairs, knowing the shard they go in
        (``shards/shard-000003.tar``), and what ``add`` returns. A write that
        fails abandons the shard and the lines in it (made again by the
        next run)."""
        with self._lock:
            if self._tar is None:
                self._open()
            members, made = make(f"{SHARDS}/{self._name}")
            try:
                for extension, data in members:
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    self._tar.addfile(info, io.BytesIO(data))
                self._file.flush()
            except OSError as e:
                self._abandon(e)
                raise WriteError(e.errno, e.strerror or str(e), os.fspath(self.folder / self._name)) from e
            self._in_open.append(made)
            if self._file.tell() >= self.limit:
                self._finish()
            return made

    def take_whole(self) -> list[T]:
        """What ``add`` returned for the lines whose shard has been finished
        (renamed) since the last call."""
        with self._lock:
            whole, self._whole = self._whole, []
            return whole

    def close(self) -> None:
        """Finish the open shard, if any: it gets its final name."""
        with self._lock:
            if self._tar is not None:
                self._finish()

    def _open(self) -> None:
        self._name = f"shard-{self._next:06d}.tar"
        self._next += 1
        self._writing = atomic_write(self.folder / self._name)
        self._file = open(self._writing.__enter__(), "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)

    def _finish(self) -> None:
        """Close the tar and give it its final name (atomic_write's rename)."""
        tar, self._tar = self._tar, None
        try:
            tar.close()
            self._file.close()
        except OSError as e:
            self._abandon(e)
            raise WriteError(e.errno, e.strerror or str(e), os.fspath(self.folder / self._name)) from e
        try:
            self._writing.__exit__(None, None, None)
        except OSError:
            self._in_open = []
            raise
        self._whole += self._in_open
        self._in_open = []
        self.written.append(f"{SHARDS}/{self._name}")

    def _abandon(self, error: BaseException) -> None:
        """Drop the open shard: its temporary file goes, and its lines."""
        self._tar, self._in_open = None, []
        try:
            self._file.close()
        except OSError:
            pass
        try:
            self._writing.__exit__(type(error), error, error.__traceback__)
        except BaseException:   # atomic_write re-raises the error it was given; the caller raises its own
            pass
