"""SIGINT (Ctrl-C) and SIGTERM: a run that is asked to stop ends cleanly,
however many times it is asked.

The handlers only set flags; they never raise. An exception raised from a
handler lands wherever the main thread happens to be (inside a manifest
rewrite, a lock, a queue's bookkeeping) and leaves the engine's threads
running while the interpreter exits, which aborted the process (exit status
134). Instead the run looks at the flags at its own safe points:

* the first signal sets ``stop``: no new batch enters the decoder; the
  batches already decoded are vocoded and written, and the manifest saved;
* a later one sets ``abort``: the work in flight is dropped at its next
  slice, the lines already written keep their rows, the manifest is saved;
  exports being written again from it are left for the next run.

Either way the run ends with ``128 + the first signal's number``: 130 after
SIGINT, 143 after SIGTERM. No torch here: the command installs these before
it imports torch, so a signal during its start-up is honoured the same way.
"""
from __future__ import annotations

import signal
import threading


class StopOnSignals:
    """While entered (from the main thread; elsewhere, as in a library
    caller's worker, nothing is installed), SIGINT and SIGTERM set ``stop``,
    then ``abort``; ``received`` is the first signal's number. On leaving,
    the handlers before it are put back; ``then_ignore`` (the command's,
    which ends after a signal): once a signal came, the two are ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, then_ignore: bool = False):
        self.stop, self.abort = threading.Event(), threading.Event()
        self.received: int | None = None
        self.then_ignore = then_ignore
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
        (self.abort if self.stop.is_set() else self.stop).set()

    def __enter__(self) -> "StopOnSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> bool:
        # After a signal the command is on its way out with that signal's
        # status: more signals change nothing. Ignored, not handled: the
        # interpreter puts the default action (death by the signal) back in
        # place of a Python handler while it exits. A library caller goes on,
        # with its own handlers.
        ignore = self.then_ignore and self.received is not None
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_IGN if ignore else handler)
        self._previous = {}
        return False

    @property
    def exit_status(self) -> int | None:
        """The shell's status for the first signal received (None: none was)."""
        return None if self.received is None else 128 + self.received
