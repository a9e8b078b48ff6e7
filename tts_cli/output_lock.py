"""One run at a time per output directory.

Two runs writing one directory (a cron job that outlasts its interval, say)
would replace each other's WAVs and manifest rows. A run holds an exclusive
advisory lock (``flock``) on ``OUT/.tts-batch.lock`` from before it reads the
earlier manifest until it ends. The kernel drops the lock when the process
ends, however it ends, so a killed run never leaves the directory locked
(after a kill the file stays, harmless). A second run ends at once, in one
line naming the holder.

A run leaves no trace it did not mean to: the lock file goes when the run
ends, and so do the folders it created (the output directory, ``wavs/``,
``mels/``) that are still empty, such as after a run that failed before its
first file. Under torchrun, rank 0 holds it for the whole job and
every process learns whether it got it.

Where ``fcntl`` does not exist (Windows) or the filesystem has no locks
(some network mounts), runs are not locked.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tts_cli.errors import FatalError, cannot_write, option
from tts_cli.formats import SHARDS

if TYPE_CHECKING:   # torch.distributed; imported only under torchrun
    from tts_cli.distributed import Group

try:
    import fcntl
except ImportError:   # not on Windows: no locking there
    fcntl = None

LOCK_NAME = ".tts-batch.lock"


class Busy(FatalError):
    """Another run holds the output directory."""


@contextlib.contextmanager
def held(out_dir: Path, group: Group | None = None) -> Iterator[None]:
    """The output directory's lock for the duration of the ``with`` block;
    ``Busy`` (one line) when another run has it, FatalError when the
    directory cannot be made."""
    lock, problem = None, None
    first = group is None or group.rank == 0
    new_folders = ([d for d in (out_dir / "mels", out_dir / "wavs", out_dir / SHARDS, out_dir) if not d.exists()]
                   if first else [])
    if first:
        try:
            lock = _acquire(out_dir)
        except FatalError as e:
            problem = (type(e), str(e))
    if group is not None:
        from tts_cli import distributed
        try:
            problem = distributed.from_first(problem)
        except distributed.GroupError as e:
            raise FatalError(f"{group}: {e}") from None
    try:
        if problem is not None:
            kind, message = problem
            raise kind(message)
        yield
    finally:
        if lock is not None:   # the folders are this run's to tidy only while it holds them
            _release(lock, out_dir)
            _remove_if_empty(new_folders)


def _acquire(out_dir: Path):
    """The lock file's handle, locked. A run that ends removes the file while
    it still holds the lock; one that opened the file just before may then
    lock the removed file, so after locking the path must still name the
    file locked, or it starts over."""
    while True:
        handle = _locked(out_dir)
        try:
            if os.stat(out_dir / LOCK_NAME).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return handle


def _locked(out_dir: Path):
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        handle = open(out_dir / LOCK_NAME, "a+", encoding="utf-8")
    except OSError as e:
        raise FatalError(cannot_write(out_dir, e, then="run it again")) from None
    if fcntl is None:
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise Busy(f"{out_dir} is being written by another tts-batch run ({holder}); "
                   f"wait for it to finish, or use another {option('out_dir')}") from None
    except OSError:   # a filesystem without locks (some network mounts): run unlocked
        pass
    return handle


def _release(handle, out_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (out_dir / LOCK_NAME).unlink()
    handle.close()


def _remove_if_empty(folders: list[Path]) -> None:
    """The folders this run created that nothing was written to, innermost first."""
    for folder in folders:
        with contextlib.suppress(OSError):   # not empty, or gone
            folder.rmdir()
