"""One run at a time per output directory.

Two runs writing one directory (a cron job that outlasts its interval, say)
would replace each other's WAVs and manifest rows. A run holds an exclusive
advisory lock (``flock``) on ``OUT/.tts-batch.lock`` from before it reads the
earlier manifest until it ends. The kernel drops the lock when the process
ends, however it ends, so a killed run never leaves the directory locked; the
file itself stays and is harmless. A second run ends at once, in one line
naming the holder. Under torchrun, rank 0 holds it for the whole job and
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

from tts_cli import distributed
from tts_cli.distributed import Group
from tts_cli.errors import FatalError, cannot_write

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
    if group is None or group.rank == 0:
        try:
            lock = _acquire(out_dir)
        except FatalError as e:
            problem = (type(e), str(e))
    if group is not None:
        try:
            problem = distributed.from_first(problem)
        except distributed.GroupError as e:
            raise FatalError(f"{group}: {e}") from None
    if problem is not None:
        if lock is not None:
            lock.close()
        kind, message = problem
        raise kind(message)
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


def _acquire(out_dir: Path):
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
                   f"wait for it to finish, or use another -o") from None
    except OSError:   # a filesystem without locks (some network mounts): run unlocked
        return handle
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    return handle
