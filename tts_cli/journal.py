"""The manifest journal: the manifest as it stands during a run, rewritten
atomically as lines finish, so the file on disk is always a whole manifest,
one row per corpus line.

No row is held in memory once it is taken in (a million rows are a few
gigabytes as objects, most of one as text). Each row's JSON line stays in
a file: a kept row's where the earlier run's manifest has it, every other
serialized once into a spool, an unnamed file in the output folder that
goes when the run ends; a rewrite copies each line from one or the other,
in corpus order. What the run's summary needs of a row (its status,
duration, clipped samples, the files it names, why it failed) is kept per
line in arrays and counted from them."""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from tts_cli.corpus import Utterance
from tts_cli.errors import OutputError, cannot_write
from tts_cli.manifest import STATUSES, WITH_AUDIO, ManifestRow, manifest_rows_at, row_without_audio, write_manifest_lines
from tts_cli.tarshards import SHARDS, member_key, shard_of
from tts_cli.text import foreign_letters, words_lost

# The manifest is rewritten at most this often during a run (and always at the
# end): a SIGKILL loses at most this much finished work, and a corpus of many
# small batches does not rewrite a large manifest after every one.
CHECKPOINT_SECONDS = 2.0
# ... and never more often than to spend this share of the run rewriting it
# (a corpus of millions of lines: the rewrite takes a while and holds the GIL
# the GPU threads need).
CHECKPOINT_SHARE = 0.02

# A line's status in ``ManifestJournal.status``: 0 while it has no row.
_CODE = {status: n for n, status in enumerate(STATUSES, start=1)}
# Statuses of the lines done (made, or with nothing to make) when a run stops.
_DONE = {_CODE[status] for status in (*WITH_AUDIO, "skipped")}


class ManifestJournal:
    """The manifest as it stands: rows done so far (and an earlier run's kept
    ones), the rest marked as not synthesized yet. Rewritten atomically, so
    the file on disk is always a whole manifest, one row per corpus line.
    With ``only`` (a torchrun process's partial manifest), just the rows
    of those lines that are done.

    ``rows``: rows known already, by corpus line, taken in as ``keep``
    takes them (not kept). A run hands in the rows known before synthesis
    through ``keep`` (with where the manifest at ``path`` holds each as it
    is, so it is written back as it was read), the rows it makes through
    ``record`` (or, from other processes' partial manifests, ``adopt``),
    and the text of the lines it has read but not made yet through
    ``expect``."""

    def __init__(self, path: Path, utterances: list[Utterance], rows: Mapping[int, ManifestRow] | None = None,
                 *, seed: int, only: set[int] | None = None):
        self.path, self.utterances, self.seed, self.only = path, utterances, seed, only
        self.saved_at = 0.0
        self.save_seconds = 0.0
        self.recorded = 0   # rows this run made (``record``, ``adopt``)
        # The file holds these rows already, as they are (a re-run with nothing
        # to do): no save writes it.
        self.on_disk = False
        count = len(utterances)
        self._lines = _RowLines(path, [u.line for u in utterances])
        self.status = bytearray(count)
        self.duration, self.clipped = array("d", bytes(8 * count)), array("q", bytes(8 * count))
        self.retried = bytearray(count)       # 1: made by this run, more than one attempt at it
        self.failed: dict[int, str] = {}      # position -> reason, of the lines that failed
        self.unsaid: dict[int, str] = {}      # position -> what the voice could not say, of lines with audio
        self.named = _Names()                 # the files the rows name
        for row in (rows or {}).values():
            self.keep(row)

    def keep(self, row: ManifestRow, where: tuple[int, int] | None = None) -> None:
        """A row known before synthesis, and where the manifest at ``path``
        holds it as it is, (first byte, length), if it does."""
        n = self._lines.position(row.line)
        self._take(n, row)
        if where is None:
            self._lines.spool(n, row.to_json())
        else:
            self._lines.earlier(n, *where)

    def record(self, row: ManifestRow) -> None:
        """A line's row, made by this run (it replaces any row it had)."""
        self.recorded += 1
        n = self._lines.position(row.line)
        self._take(n, row, made=True)
        self._lines.spool(n, row.to_json())

    def record_all(self, rows: Iterable[ManifestRow]) -> None:
        for row in rows:
            self.record(row)

    def expect(self, lines: Iterable[tuple[Utterance, str, str | None]]) -> None:
        """Lines this run is about to make, as (line, normalized text,
        characters dropped): their rows say so until they are made."""
        for u, normalized, dropped in lines:
            self._lines.spool(self._lines.position(u.line), self._unfinished(u, normalized, dropped).to_json())

    def adopt(self, path: Path) -> None:
        """The rows of another process's partial manifest (its lines this
        run made), copied from it."""
        with open(path, "rb") as f:
            for record, (start, length) in manifest_rows_at(path):
                self.recorded += 1
                n = self._lines.position(record["line"])
                self._take(n, ManifestRow(**record), made=True)
                self._lines.spool_bytes(n, os.pread(f.fileno(), length, start))

    def _take(self, n: int, row: ManifestRow, made: bool = False) -> None:
        """What the summary needs of line ``n``'s row."""
        status, audio = row.status, row.audio_filepath
        self.status[n], self.duration[n], self.clipped[n] = _CODE[status], row.duration, row.clipped_samples or 0
        alignment = row.alignment if made else None
        self.retried[n] = bool(alignment) and alignment["attempts"] > (len(alignment.get("pieces", ())) or 1)
        if status == "error":
            self.failed[n] = row.reason
        elif n in self.failed:
            del self.failed[n]
        what = audio and (words_lost(row.dropped or "") or foreign_letters(row.text))
        if what:
            self.unsaid[n] = what
        elif n in self.unsaid:
            del self.unsaid[n]
        for name in (audio, row.mel_filepath):
            if name and (shard := name.startswith(SHARDS) and shard_of(name)):
                self.named.add(shard)
                self.named.add(member_key(name))   # its line's members in that shard
            elif name:
                self.named.add(name)

    @property
    def complete(self) -> bool:
        """Whether every line has its row (none is left to make)."""
        return 0 not in self.status

    def _unfinished(self, u: Utterance, normalized: str = "", dropped: str | None = None) -> ManifestRow:
        """The row of a line not done yet."""
        return row_without_audio(u, normalized, "pending", "not synthesized yet: the run is still making lines, "
                                 "or stopped first; the same command again finishes it", self.seed, dropped)

    def counts(self) -> dict[str, int]:
        """Lines by status, those not done yet as pending."""
        counts = {status: self.status.count(code) for status, code in _CODE.items()}
        counts["pending"] += self.status.count(0)
        return counts

    def audio_seconds(self) -> float:
        return round(sum(self.duration), 6)

    def lines_of(self, by_position: Mapping[int, str]) -> dict[int, str]:
        """``failed`` or ``unsaid`` by corpus line, in corpus order."""
        return {self.utterances[n].line: what for n, what in sorted(by_position.items())}

    def progress(self) -> tuple[int, int]:
        """(lines done, lines) among those this checkpoint keeps."""
        if self.only is None:
            return sum(self.status.count(code) for code in _DONE), len(self.status)
        kept = [n for n, u in enumerate(self.utterances) if u.line in self.only]
        return sum(1 for n in kept if self.status[n] in _DONE), len(kept)

    @property
    def untouched(self) -> bool:
        """Whether the file is as the run found it: no row made, no save."""
        return not self.recorded and not self.saved_at

    def save(self, final: bool = False) -> None:
        """Write the manifest; unless ``final``, only if the last write is old
        enough (CHECKPOINT_SECONDS, or longer when a write takes long)."""
        if self.on_disk:
            return
        now = time.monotonic()
        interval = max(CHECKPOINT_SECONDS, self.save_seconds / CHECKPOINT_SHARE)
        if not final and now - self.saved_at < interval and self.saved_at:
            return
        try:
            write_manifest_lines(self.path, self._lines.read(self._kept()))
        except OSError as e:
            raise OutputError(cannot_write(self.path.parent, e)) from None
        self.saved_at = time.monotonic()
        self.save_seconds = self.saved_at - now

    def _kept(self) -> Sequence[int]:
        """The positions of the rows the manifest holds, each in the spool
        (a line not done yet, as such) if it is nowhere yet."""
        if self.only is not None:
            return [n for n, u in enumerate(self.utterances) if self.status[n] and u.line in self.only]
        for n, u in enumerate(self.utterances):
            if not self._lines.has(n):
                self._lines.spool(n, self._unfinished(u).to_json())
        return range(len(self.utterances))

    def close(self) -> None:
        """Let go of the spool and the earlier manifest."""
        self._lines.close()


class _Names:
    """Names (of files, relative to the output folder) as their hashes:
    a few dozen bytes a name, whatever its length; a name taken for another
    by a hash collision (one in billions at a million names) is only a file
    left out of the orphans' report."""

    def __init__(self):
        self._hashes: set[int] = set()

    def add(self, name: str) -> None:
        self._hashes.add(hash(name))

    def __contains__(self, name: str) -> bool:
        return hash(name) in self._hashes


class _RowLines:
    """Where each corpus line's row is as a JSON line: in the earlier run's
    manifest, or in this run's spool. 17 bytes a line, whatever the row."""

    def __init__(self, manifest: Path, lines: list[int]):
        self.lines = array("q", lines)
        if any(a >= b for a, b in zip(self.lines, self.lines[1:])):
            raise ValueError("a journal's lines must be in corpus order, each once")
        count = len(self.lines)
        # lines 1, 2, 3, ...: a line's place is its number less one (else found by bisection)
        self._numbered = not count or self.lines[-1] == count
        self.in_spool = bytearray(count)    # 1: in the spool, 0: in the earlier manifest, if anywhere
        self.start, self.length = array("q", bytes(8 * count)), array("q", [-1]) * count
        self._manifest, self._earlier, self._spool, self._spool_size = manifest, None, None, 0

    def position(self, line: int) -> int:
        """The place of corpus line ``line`` among the journal's."""
        n = line - 1 if self._numbered else bisect_left(self.lines, line)
        if not 0 <= n < len(self.lines) or self.lines[n] != line:
            raise KeyError(f"line {line} is not one of this run's")
        return n

    def earlier(self, n: int, start: int, length: int) -> None:
        """Line ``n``'s row is in the earlier run's manifest, at ``start``."""
        if self._earlier is None:
            # open from here on: the output lock keeps the file this run's to replace, and the open file outlives that
            self._earlier = open(self._manifest, "rb")
        self.in_spool[n], self.start[n], self.length[n] = 0, start, length

    def has(self, n: int) -> bool:
        return self.length[n] >= 0

    def spool(self, n: int, json_line: str) -> None:
        """Line ``n``'s row, serialized: appended to the spool."""
        self.spool_bytes(n, json_line.encode("utf-8"))

    def spool_bytes(self, n: int, data: bytes) -> None:
        try:
            if self._spool is None:
                self._spool = tempfile.TemporaryFile(dir=self._manifest.parent, prefix=".manifest-rows.")
            self._spool.write(data)
        except OSError as e:   # a full disk, as when the manifest is written
            raise OutputError(cannot_write(self._manifest.parent, e)) from None
        self.in_spool[n], self.start[n], self.length[n] = 1, self._spool_size, len(data)
        self._spool_size += len(data)

    def read(self, positions: Iterable[int]) -> Iterator[bytes]:
        """The JSON lines at ``positions``, in their order. Read, not mapped:
        pages of a mapped file would count as the process's memory."""
        if self._spool is not None:
            self._spool.flush()
        files = (self._earlier and self._earlier.fileno(), self._spool and self._spool.fileno())
        in_spool, start, length, pread = self.in_spool, self.start, self.length, os.pread
        for n in positions:
            yield pread(files[in_spool[n]], length[n], start[n])

    def close(self) -> None:
        for f in (self._earlier, self._spool):
            if f is not None:
                with contextlib.suppress(OSError):   # a full disk: the spool's last rows are of no more use
                    f.close()
        self._earlier = self._spool = None
