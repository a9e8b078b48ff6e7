"""Errors that end a whole run, as one line for the user."""
import contextlib
import errno
import threading


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


# Whom the messages speak to: the command (``--force``, ``-o``) or a Python
# caller (``force=True``, ``out_dir``). The outermost caller decides (the
# command's Synthesizer speaks the command's words); a process-wide value,
# as the worker threads that make messages see it too, kept while any
# caller (a library's threads, each with a Synthesizer) is inside. None:
# the command's.
_audience: str | None = None
_inside = 0
_lock = threading.Lock()


@contextlib.contextmanager
def speaking_to(audience: str):
    """Messages made inside speak to ``audience`` ("command" or "python"),
    unless an outer caller chose already."""
    global _audience, _inside
    with _lock:
        _audience = _audience or audience
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if not _inside:
                _audience = None


def option(setting: str, *value) -> str:
    """A setting as the one reading the message gives it: ``option("device",
    "cpu")`` is ``--device cpu`` to the command and ``device='cpu'`` to a
    Python caller; ``option("force", True)`` ``--force`` or ``force=True``;
    ``option("layout")`` ``--layout`` or ``layout``; ``out_dir`` is the
    command's ``-o``."""
    if _audience == "python":
        return f"{setting}={value[0]!r}" if value else setting
    flag = "-o" if setting == "out_dir" else f"--{setting.replace('_', '-')}"
    return f"{flag} {value[0]}" if value and value[0] is not True else flag


def again() -> str:
    """What finishes a run that stopped: the same command, or the same call."""
    return "make the same call again" if _audience == "python" else "run the same command again"


def the_run_again() -> str:
    """What makes the synthesis run again, said where another command
    (``tts-batch export``) or another call reads it."""
    return "the same synthesize_to_dir call again" if _audience == "python" else "the same tts-batch command again"


# What to do about a write that failed, by its errno.
_WRITE_ADVICE = {
    errno.ENOSPC: "free disk space",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free disk space (or raise your quota)",
    errno.EACCES: "fix the permissions",
    errno.EPERM: "fix the permissions",
    errno.EROFS: "the file system is read-only: remount it writable or choose another {out_dir}",
    errno.EIO: "the disk reported an I/O error: check it, or choose another {out_dir}",
    # a folder that cannot hold files (/proc, /sys) or a path through a file
    errno.ENOENT: "that place cannot hold the output: choose another {out_dir}",
    errno.ENOTDIR: "a part of the path is a file: choose another {out_dir}",
    # a file where the output needs a folder (wavs, say), or a folder where it needs a file
    errno.EEXIST: "a file is in the way of that folder: move it away",
    errno.EISDIR: "a folder is in the way of that file: move it away",
}


def cannot_write(where, e: OSError, then: str | None = None) -> str:
    """One line: the file that could not be written (``e.filename``, else
    ``where``), why, and what to do (then: ``again()`` to finish, by default)."""
    advice = _WRITE_ADVICE.get(e.errno, "free disk space or fix the permissions").format(out_dir=option("out_dir"))
    then = then or f"{again()} to finish"
    return f"cannot write {e.filename or where}: {e.strerror or first_line(e)}; {advice}, then {then}"
