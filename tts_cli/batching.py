"""Sort utterances by length and cut them into batches; pad symbol ids.

Lines of similar length share a batch, so little work is spent on padding.
Each batch remembers the positions of its items, so results can be put back
in corpus order whatever order the batches ran in.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices into ``lengths``, longest first, cut into batches of at most
    ``batch_size``. Equal lengths keep their corpus order (a stable sort), so
    the batching is deterministic."""
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def pad_sequences(seqs: Sequence[Sequence[int]], pad: int = 0,
                  device: "torch.device | str" = "cpu") -> tuple[Tensor, Tensor]:
    """(B, T) int64 ids padded with ``pad`` and (B,) int64 lengths."""
    import torch   # here, not at the top: planning sorts lines without torch
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    ids = torch.full((len(seqs), int(lengths.max())), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return ids.to(device), lengths.to(device)
