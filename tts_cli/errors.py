"""Errors that end a whole run, as one line for the user."""
import errno


class FatalError(Exception):
    """Stops the run; the message is one line."""


class CheckpointError(Exception):
    """A checkpoint file could not be used; the message is one line for the user."""


class OutputError(FatalError):
    """The output directory could not be written (full disk, permissions).
    Raised after the manifest rows of everything already written were saved."""


class OutputNotice(str):
    """A notice that changes what the output is (another voice stands in,
    the corpus looks misread, a setting has no effect): shown even under
    --quiet, where other notices are not."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type when it has none."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


# What to do about a write that failed, by its errno.
_WRITE_ADVICE = {
    errno.ENOSPC: "free disk space",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free disk space (or raise your quota)",
    errno.EACCES: "fix the permissions",
    errno.EPERM: "fix the permissions",
    errno.EROFS: "the file system is read-only: remount it writable or choose another -o",
    errno.EIO: "the disk reported an I/O error: check it, or choose another -o",
    # a folder that cannot hold files (/proc, /sys) or a path through a file
    errno.ENOENT: "that place cannot hold the output: choose another -o",
    errno.ENOTDIR: "a part of the path is a file: choose another -o",
    # a file where the output needs a folder (wavs, say), or a folder where it needs a file
    errno.EEXIST: "a file is in the way of that folder: move it away",
    errno.EISDIR: "a folder is in the way of that file: move it away",
}


def cannot_write(where, e: OSError, then: str = "run the same command again to finish") -> str:
    """One line: the file that could not be written (``e.filename``, else
    ``where``), why, and what to do."""
    advice = _WRITE_ADVICE.get(e.errno, "free disk space or fix the permissions")
    return f"cannot write {e.filename or where}: {e.strerror or first_line(e)}; {advice}, then {then}"
