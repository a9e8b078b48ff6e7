"""The names of the formats a run reads and writes, as ``--format`` and
``--sample-format`` and ``--audio-format`` and the recipes accept them, and
where a line's audio file goes.

A leaf: the settings (config.py) check these names, and the corpus reader
(corpus.py) and the WAV writer (audio.py) act on them, so the settings load
neither soundfile nor the reader to know them.
"""

CORPUS_FORMATS = ("plain", "ljspeech", "tsv")
SAMPLE_FORMATS = ("pcm16", "pcm24", "float32")
AUDIO_FORMATS = ("wav", "flac")
# FLAC stores integer samples only.
FLAC_SAMPLE_FORMATS = ("pcm16", "pcm24")


def audio_path(line_id: str, audio_format: str) -> str:
    """Where a line's audio goes, relative to the output directory."""
    return f"wavs/{line_id}.{audio_format}"
