"""The manifest journal: the manifest as it stands during a run, rewritten
atomically as lines finish, so the file on disk is always a whole manifest,
one row per corpus line."""
from __future__ import annotations

import time
from pathlib import Path

from tts_cli.corpus import Utterance
from tts_cli.errors import OutputError, cannot_write
from tts_cli.manifest import ManifestRow, row_without_audio, write_manifest_lines

# The manifest is rewritten at most this often during a run (and always at the
# end): a SIGKILL loses at most this much finished work, and a corpus of many
# small batches does not rewrite a large manifest after every one.
CHECKPOINT_SECONDS = 2.0
# ... and never more often than to spend this share of the run rewriting it
# (a corpus of millions of lines: the rewrite takes a while and holds the GIL
# the GPU threads need).
CHECKPOINT_SHARE = 0.02


class ManifestJournal:
    """The manifest as it stands: rows done so far (and an earlier run's kept
    ones), the rest marked as not synthesized yet. Rewritten atomically, so
    the file on disk is always a whole manifest, one row per corpus line.
    With ``only`` (a torchrun process's partial manifest), just the rows
    of those lines that are done."""

    def __init__(self, path: Path, utterances: list[Utterance], rows: dict[int, ManifestRow],
                 seed: int, only: set[int] | None = None, written: dict[int, str] | None = None):
        self.path, self.utterances, self.rows, self.seed = path, utterances, rows, seed
        self.only = only
        self.saved_at = 0.0
        self.save_seconds = 0.0
        # line -> (normalized text, characters dropped) of the lines this run makes
        self.pending_said: dict[int, tuple[str, str | None]] = {}
        # line -> (row, its JSON line): rows never change once made, so each
        # is serialized once however often the manifest is rewritten; a row
        # kept as an earlier run wrote it (``written``: line -> that JSON line;
        # a kept row is never replaced) is not serialized at all.
        self.written = written or {}
        self._serialized: dict[int, tuple[ManifestRow, str]] = {}
        # The file holds these rows already, as they are (a re-run with nothing
        # to do): no save writes it.
        self.on_disk = False
        # line -> (normalized text, the JSON line) of the row of a line not done
        # yet: only its line is kept, since the row itself is needed only at
        # the end (``ordered``), and there are as many as lines left to make.
        self._placeholders: dict[int, tuple[str, str]] = {}

    @property
    def complete(self) -> bool:
        """Whether every line has its row (none is left to make)."""
        return all(u.line in self.rows for u in self.utterances)

    def ordered(self) -> list[ManifestRow]:
        return [self.rows.get(u.line) or self._unfinished(u) for u in self.utterances]

    def _unfinished(self, u: Utterance) -> ManifestRow:
        """The row of a line not done yet."""
        normalized, dropped = self.pending_said.get(u.line, ("", None))
        return row_without_audio(u, normalized, "pending", "not synthesized yet: the run is still making lines, "
                                 "or stopped first; the same command again finishes it", self.seed, dropped)

    def _json_line(self, u: Utterance) -> str:
        """The line of ``u``'s row in the manifest, serialized once."""
        row = self.rows.get(u.line)
        if row is None:
            normalized = self.pending_said.get(u.line, ("", None))[0]
            cached = self._placeholders.get(u.line)
            if cached is None or cached[0] != normalized:
                cached = self._placeholders[u.line] = (normalized, self._unfinished(u).to_json())
            return cached[1]
        written = self.written.get(u.line)
        if written is not None:
            return written
        self._placeholders.pop(u.line, None)
        self.pending_said.pop(u.line, None)
        cached = self._serialized.get(u.line)
        if cached is None or cached[0] is not row:
            cached = self._serialized[u.line] = (row, row.to_json())
        return cached[1]

    def progress(self) -> tuple[int, int]:
        """(lines done, lines) among those this checkpoint keeps."""
        rows = [r for r in self.ordered() if self.only is None or r.line in self.only]
        return sum(1 for r in rows if r.audio_filepath or r.status == "skipped"), len(rows)

    def save(self, final: bool = False) -> None:
        """Write the manifest; unless ``final``, only if the last write is old
        enough (CHECKPOINT_SECONDS, or longer when a write takes long)."""
        if self.on_disk:
            return
        now = time.monotonic()
        interval = max(CHECKPOINT_SECONDS, self.save_seconds / CHECKPOINT_SHARE)
        if not final and now - self.saved_at < interval and self.saved_at:
            return
        if self.only is None:
            lines = [self._json_line(u) for u in self.utterances]
        else:
            lines = [self._json_line(u) for u in self.utterances if u.line in self.only and u.line in self.rows]
        try:
            write_manifest_lines(self.path, lines)
        except OSError as e:
            raise OutputError(cannot_write(self.path.parent, e)) from None
        self.saved_at = time.monotonic()
        self.save_seconds = self.saved_at - now
