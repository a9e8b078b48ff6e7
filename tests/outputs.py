"""Reading an output directory back, for the tests that compare two runs."""
import json

import numpy as np
import soundfile as sf


def manifest(out):
    """The manifest's rows as dicts, in file order."""
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def assert_same_output(out, reference):
    """The same manifest rows (it has no timing fields) and the same audio
    (to float32 rounding)."""
    assert manifest(out) == manifest(reference)
    for row in manifest(reference):
        if row["audio_filepath"]:
            mine = sf.read(out / row["audio_filepath"], dtype="float32")[0]
            theirs = sf.read(reference / row["audio_filepath"], dtype="float32")[0]
            np.testing.assert_allclose(mine, theirs, atol=1e-6)


def mtimes(out, folder="wavs"):
    """Each WAV's (or mel's) modification time: unchanged when a re-run reuses it."""
    return {p.name: p.stat().st_mtime_ns for p in (out / folder).iterdir()}
