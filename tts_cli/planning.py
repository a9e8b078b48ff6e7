"""Planning a run, without torch: each corpus line normalized (and, when
long, cut) into the pieces to synthesize, each piece's seed, and the
length-sorted batches, the same on one process and on every process of a
torchrun job. Lines that cannot be synthesized get their manifest row here."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from tts_cli import text as frontend
from tts_cli.batching import length_sorted_batches
from tts_cli.config import Settings
from tts_cli.corpus import NOTHING_TO_SAY, Utterance
from tts_cli.manifest import ManifestRow, row_without_audio
from tts_cli.splitting import split_text


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
    for words (%, @, an emoji), left out. None when neither."""
    foreign, lost = frontend.foreign_letters(text), frontend.words_lost(reading.dropped)
    reasons = [f"letters of another script the voice cannot say ({foreign[:12]!r}), read as their Latin "
               f"transliteration: {reading.text[:40]!r}" if foreign else None,
               f"characters the voice cannot say, left out: {lost[:12]!r}" if lost else None]
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
    def piece_ids(piece: str) -> list[int]:
        return frontend.text_to_sequence(piece, settings.text_normalization)
    pieces = [piece_ids(piece) for piece in split_text(text, max_symbols, lambda piece: len(piece_ids(piece)))]
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
