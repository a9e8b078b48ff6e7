"""Cut a long line into pieces the model speaks well.

Tacotron2's attention was trained on LJSpeech clips of at most ~10 s (about
190 characters); on longer inputs it starts to skip, repeat or mumble, and
long lines also run into the decoder step limit. A line whose normalized text
is longer than the limit is therefore cut, at the gentlest boundary that
works: sentence ends first, then clause punctuation (, ; :), then spaces
between words. Pieces are packed greedily, so a line is cut as few times as
the limit allows. The pipeline synthesizes each piece as its own job and
joins the audio with a short pause.

Lengths are counted in normalized symbols (what the model reads), not in raw
characters: "$3.50" is five characters but 29 symbols. Cutting happens on the
text as the normalization writes it out before cleaning (text.spoken: the
extended one's spoken forms already said), so each piece is cleaned on its
own as the reference would and no cut parts a spoken form.
``{ARPAbet}`` spans are never cut, nor is a sentence after a title ("Mr.").
"""
from __future__ import annotations

import re
from collections.abc import Callable

# Ends of sentences: terminal punctuation, closing quotes or brackets, then space.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")
# A title whose period ends no sentence ("Mr. Smith"): no cut after it.
_TITLE = re.compile(r"(?:^|\s)(?:mrs?|ms|drs?|rev|lt|hon|sgt|capt|maj|gen|col|st)\.$", re.IGNORECASE)
# Clause boundaries: a comma, semicolon or colon followed by space.
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+")
# Words; a braced ARPAbet span counts as one word so phones stay together.
_WORD = re.compile(r"\{[^}]*\}?|\S+")


def split_text(text: str, max_symbols: int, length: Callable[[str], int]) -> list[str]:
    """``text`` cut into pieces of at most ``max_symbols`` by ``length``.

    ``length`` counts a piece's normalized symbols. A single word longer than
    the limit stays whole (it cannot be cut anywhere sensible). Returns
    ``[text]`` when no cut is needed.
    """
    if max_symbols <= 0:
        return [text]
    levels = [_sentences, lambda t: _parts(t, _CLAUSE_END), _WORD.findall]
    return _cut(text.strip(), levels, max_symbols, length) or [text]


def _cut(text: str, levels: list, max_symbols: int, length: Callable[[str], int]) -> list[str]:
    """Cut ``text`` at the first level's boundaries, packing neighbours that fit
    together; a part still too long is cut at the next level on its own, so a
    fragment of a long sentence is never glued onto the next sentence."""
    if length(text) <= max_symbols or not levels:
        return [text]
    pieces: list[str] = []
    fitting: list[str] = []
    for part in levels[0](text):
        if length(part) <= max_symbols:
            fitting.append(part)
            continue
        pieces += _pack(fitting, max_symbols, length) + _cut(part, levels[1:], max_symbols, length)
        fitting = []
    return pieces + _pack(fitting, max_symbols, length)


def _sentences(text: str) -> list[str]:
    """``text``'s sentences; a title's period ends none."""
    sentences: list[str] = []
    for part in _parts(text, _SENTENCE_END):
        if sentences and _TITLE.search(sentences[-1]):
            sentences[-1] = f"{sentences[-1]} {part}"
        else:
            sentences.append(part)
    return sentences


def _parts(text: str, boundary: re.Pattern) -> list[str]:
    """Split after each boundary, dropping the whitespace there; no empty parts."""
    return [part.strip() for part in boundary.split(text) if part.strip()]


def _pack(parts: list[str], max_symbols: int, length: Callable[[str], int]) -> list[str]:
    """Join neighbouring parts (with one space) while they stay within the limit."""
    packed: list[str] = []
    for part in parts:
        if packed and length(f"{packed[-1]} {part}") <= max_symbols:
            packed[-1] = f"{packed[-1]} {part}"
        else:
            packed.append(part)
    return packed
