"""Planning a run, without torch: which lines an earlier run made already,
each other corpus line normalized (and, when long, cut) into the pieces to
synthesize, each piece's seed, and the length-sorted batches, the same on
one process and on every process of a torchrun job. Lines that cannot be
synthesized get their manifest row here.

A long corpus is read a window at a time: when more than READ_WINDOW lines
were made by no earlier run, they are read a window at a time, the first
while the models load and each next one while the one before it is made,
so neither the plan nor the first batch waits for the text front end to
read a million lines, and their pieces are not all held at once.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from tts_cli import resume
from tts_cli import text as frontend
from tts_cli.batching import length_sorted_batches
from tts_cli.config import Settings
from tts_cli.corpus import NOTHING_TO_SAY, Utterance
from tts_cli.manifest import ManifestRow, as_written, row_without_audio
from tts_cli.splitting import split_text


# Where a kept row's line is in the manifest, (first byte, length); None
# when the manifest does not hold the row as it is.
Where = tuple[int, int] | None


def line_seed(run_seed: int, line_id: str) -> int:
    """A line's 31-bit seed, from the run's seed and the line's id."""
    digest = hashlib.blake2b(f"{run_seed}:{line_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


@dataclass(eq=False)   # identity: two lines are never "equal"
class PendingLine:
    """A line to synthesize: its pieces (one unless cut) and their results."""
    utterance: Utterance
    normalized: str
    pieces: list[list[int]]       # symbol ids of each piece
    seeds: list[int]              # each piece's seed
    retry_seeds: list[list[int]] = field(default_factory=list)   # each piece's seeds for its retries
    key: str = ""
    text_key: str | None = None   # resume.text_key: the id and text as read, with what they were read under
    results: list = field(default_factory=list)   # per piece: Result, Exception or None
    # why the audio cannot be what the text says, whatever the model does
    # (letters of another script, words left out): the line is suspect with this reason
    caution: str | None = None
    dropped: str | None = None    # the characters the front end left out (text.Reading.dropped)

    @property
    def complete(self) -> bool:
        return all(r is not None for r in self.results)


# Lines read for the first time (no earlier row to compare with) past this
# many wait for their window: the front end reads about 20,000 lines a second
# on one core, a GPU makes about 170, so a window is read in a few seconds
# while the one before it takes minutes to make.
READ_WINDOW = 50_000


@dataclass
class Plan:
    """A run's plan (``plan_lines``)."""
    pending: list[PendingLine]     # the lines read and left to make
    unread: list[list[tuple[Utterance, str]]]   # windows of lines (with their text keys) to read later
    reused: int = 0                # lines an earlier run made that this one keeps ...
    reused_seconds: float = 0.0    # ... and their audio
    as_written: int = 0            # rows kept as the manifest holds them


def plan_lines(utterances: list[Utterance], settings: Settings, seed: int, identity: dict,
               previous: resume.EarlierRows, out_dir: Path, keep: Callable[[ManifestRow, Where], None]) -> Plan:
    """The rows known before synthesis (lines with nothing to say, lines an
    earlier run finished), each handed to ``keep`` with where its line is
    in the manifest when the manifest holds it as it is (else None), and
    the lines left to synthesize, in corpus order. A line whose earlier row
    has its text key keeps that row's key unread (``resume.text_key``); the
    others are read and keyed here, but for the lines no earlier run made
    when there are more than READ_WINDOW of those: they wait in
    ``unread``, in windows of READ_WINDOW, read once the plan is made
    (``WindowReader``). No row is held once it is planned (BENCHMARKS.md,
    Scale)."""
    plan = Plan([], [])
    to_read = []
    context = resume.text_context(seed, identity, settings)

    def kept(row: ManifestRow, old: ManifestRow | dict | None, where: Where) -> None:
        if row.key is not None:
            plan.reused, plan.reused_seconds = plan.reused + 1, plan.reused_seconds + row.duration
        where = where if old is not None and as_written(row, old) else None
        plan.as_written += where is not None
        keep(row, where)

    with collector_paused():
        for u in utterances:
            (old, where), text_key = previous.take(u.id), resume.text_key(context, u)
            row = resume.kept_as_read(old, text_key, u, out_dir, settings)
            if row is None:
                to_read.append((u, old, where, text_key))
            else:
                kept(row, old, where)
        fresh = [(u, text_key) for u, old, _, text_key in to_read if old is None]
        if len(fresh) > READ_WINDOW:
            plan.unread = [fresh[i:i + READ_WINDOW] for i in range(0, len(fresh), READ_WINDOW)]
            to_read = [entry for entry in to_read if entry[1] is not None]
        del fresh
        for u, old, where, text_key in to_read:
            made: dict[int, ManifestRow] = {}
            p = _read_line(u, text_key, seed, identity, made, settings)
            if p is None:
                kept(made[u.line], old, where)
                continue
            row = resume.reusable_row(old, p.key, u, out_dir, settings)
            if row is None:
                plan.pending.append(p)
            else:
                kept(replace(row, text_key=text_key), old, where)
    return plan


def read_window(window: list[tuple[Utterance, str]], settings: Settings, seed: int,
                identity: dict) -> tuple[dict[int, ManifestRow], list[PendingLine]]:
    """A window of ``Plan.unread``, read: the rows of its lines that cannot
    be synthesized, and its lines to make, in corpus order."""
    rows, pending = {}, []
    with collector_paused():
        for u, text_key in window:
            p = _read_line(u, text_key, seed, identity, rows, settings)
            if p is not None:
                pending.append(p)
    return rows, pending


def _read_line(u: Utterance, text_key: str, seed: int, identity: dict, rows: dict[int, ManifestRow],
               settings: Settings) -> PendingLine | None:
    """``prepare_line`` with the line's resume and text keys; None (its row
    in ``rows``) for a line that cannot be synthesized."""
    p = prepare_line(u, seed, rows, settings)
    if p is not None:
        p.key, p.text_key = resume.line_key(p.pieces, u.id, seed, identity, settings.piece_pause), text_key
    return p


class WindowReader:
    """The plan's windows of lines to read (``Plan.unread``), each read
    (``read_window``) on a thread while the one before it is made; the
    first from the moment this is made, while the models load."""

    def __init__(self, windows: list[list[tuple[Utterance, str]]], settings: Settings, seed: int,
                 identity: dict):
        self.windows, self._how = windows, (settings, seed, identity)
        self.without_audio = 0   # lines of the windows read so far that have nothing to make
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-read")
        self._ahead = self._read(0)

    def _read(self, n: int):
        if n == len(self.windows):
            return None
        window, self.windows[n] = self.windows[n], []   # let go of it once read
        return self._thread.submit(read_window, window, *self._how)

    def __iter__(self) -> Iterator[tuple[dict[int, ManifestRow], list[PendingLine]]]:
        """Each window's rows and lines to make (``read_window``), in order."""
        for n in range(len(self.windows)):
            read, self._ahead = self._ahead.result(), self._read(n + 1)
            self.without_audio += len(read[0])
            yield read

    def close(self) -> None:
        """Stop: the window being read is finished, no other is begun."""
        self._thread.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def collector_paused():
    """Python's cycle collector off for a block that makes objects by the
    million and drops none (the plan): each of its full passes would walk
    every one of them, for nothing."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def prepare_line(u: Utterance, run_seed: int, rows: dict[int, ManifestRow],
             settings: Settings) -> PendingLine | None:
    """Normalizes (and if long, cuts) one line; lines that cannot be
    synthesized get their row now."""
    if u.problem is not None:
        status = "skipped" if u.problem in NOTHING_TO_SAY else "error"
        rows[u.line] = row_without_audio(u, "", status, u.problem, None)
        return None
    try:
        reading = frontend.read(u.text, settings.text_normalization)
        pieces = _pieces(u.text, reading.ids, settings)
    except frontend.UnsupportedTextError as e:
        rows[u.line] = row_without_audio(u, "", "error", str(e), None)
        return None
    dropped = reading.dropped or None
    if not pieces:
        rows[u.line] = row_without_audio(u, reading.text, "skipped", "nothing speakable after cleaning", None,
                                         dropped)
        return None
    # Ids never contain "/", so a piece's or a retry's name cannot be another line's id.
    names = [u.id] if len(pieces) == 1 else [f"{u.id}/{i}" for i in range(len(pieces))]
    retries = settings.retries if settings.check_alignment else 0
    return PendingLine(u, reading.text, pieces, [line_seed(run_seed, name) for name in names],
                       [retry_seeds(run_seed, name, retries) for name in names], results=[None] * len(pieces),
                       caution=_caution(u.text, reading), dropped=dropped)


def _caution(text: str, reading: frontend.Reading) -> str | None:
    """Why the line's audio cannot say what its text does: letters of
    another script, read as their transliteration; characters that stand
    for words (%, @, an emoji), left out; braces holding what is no ARPAbet
    phone (a lower-case one, a misspelt one), left out. None when none."""
    foreign, lost = frontend.foreign_letters(text), frontend.words_lost(reading.dropped)
    reasons = [f"letters of another script the voice cannot say ({foreign[:12]!r}), read as their Latin "
               f"transliteration: {reading.text[:40]!r}" if foreign else None,
               f"characters the voice cannot say, left out: {lost[:12]!r}" if lost else None,
               f"braces holding what is no ARPAbet phone (those are upper case: {{HH AW1 S}}), left out: "
               f"{reading.unknown_phones[:40]!r}"
               if reading.unknown_phones else None]
    return "; ".join(filter(None, reasons)) or None


def retry_seeds(run_seed: int, name: str, retries: int) -> list[int]:
    """The seeds of a line's (or piece's, ``<id>/<piece>``) retries: from
    the run's seed, its name and the retry's number, so a re-run makes the
    same attempts."""
    return [line_seed(run_seed, f"{name}/retry{k}") for k in range(1, retries + 1)]


def _pieces(text: str, ids: list[int], settings: Settings) -> list[list[int]]:
    """The ids of each piece to synthesize; pieces with nothing to say (a lone
    "...") are dropped, since the model would only babble."""
    max_symbols = settings.max_symbols_per_piece
    if not max_symbols or len(ids) <= max_symbols:
        return [ids] if frontend.is_speakable(ids) else []
    # cut after the spoken forms are written, so each piece says its part
    # of them as the whole line would ("$3.5 | million" is not cut apart)
    said = frontend.spoken(text, settings.text_normalization)
    def piece_ids(piece: str) -> list[int]:
        return frontend.text_to_sequence(piece, "reference")
    pieces = [piece_ids(piece) for piece in split_text(said, max_symbols, lambda piece: len(piece_ids(piece)))]
    return [p for p in pieces if frontend.is_speakable(p)]


def batch_plan(pending: list[PendingLine], batch_size: int,
               shortest_first: bool = False) -> list[list[tuple[PendingLine, int]]]:
    """Every piece left to make, in length-sorted batches: the same plan on
    one process and on every process of a torchrun job. Longest batch first,
    or with ``shortest_first`` the same batches in the opposite order."""
    work = [(p, i) for p in pending for i in range(len(p.pieces))]
    batches = [[work[i] for i in batch]
               for batch in length_sorted_batches([len(p.pieces[i]) for p, i in work], batch_size)]
    return batches[::-1] if shortest_first else batches
