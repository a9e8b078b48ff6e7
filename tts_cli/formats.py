"""The names of the formats a run reads and writes, as ``--format`` and
``--sample-format`` and the recipes accept them.

A leaf: the settings (config.py) check these names, and the corpus reader
(corpus.py) and the WAV writer (audio.py) act on them, so the settings load
neither soundfile nor the reader to know them.
"""

CORPUS_FORMATS = ("plain", "ljspeech", "tsv")
SAMPLE_FORMATS = ("pcm16", "float32")
