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
raw text, so each piece is normalized on its own as the reference would.
``{ARPAbet}`` spans are never cut.
"""
from __future__ import annotations

import re
from collections.abc import Callable

# Ends of sentences: terminal punctuation, closing quotes or brackets, then space.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")
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
    levels = [lambda t: _parts(t, _SENTENCE_END), lambda t: _parts(t, _CLAUSE_END), _WORD.findall]
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
