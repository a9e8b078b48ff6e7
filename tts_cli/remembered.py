"""A value kept between runs in a small JSON file beside what it was made
from, read back while that is unchanged and else made again and kept: what
start-up would otherwise hash at every run (Triton's cache key,
kernels.remembered_triton_key; the checkpoints' sha256,
voice.remembered_digest). A file that cannot be read or written only means
the value is made."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def remembered(path: Path, made_from, make: Callable[[], str], keep: bool = True) -> str:
    """The string ``path`` keeps for ``made_from`` (a value JSON reads back
    equal: a str, a number, a list), else ``make()``, then kept there unless
    ``keep`` is False. The file is written under a temporary name and
    renamed, so it is whole or absent."""
    try:
        kept = json.loads(path.read_text())
        if isinstance(kept, dict) and kept.get("made_from") == made_from and isinstance(kept.get("value"), str):
            return kept["value"]
    except (OSError, ValueError):
        pass
    value = make()
    if keep:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"made_from": made_from, "value": value}))
            temporary.replace(path)
        except OSError:
            pass
    return value
