"""tts-batch: batch speech synthesis of a text corpus with Tacotron2 + WaveGlow.

The stages, one module each: text -> corpus -> batching -> tacotron2 ->
waveglow -> audio + manifest; checkpoints.py knows the file formats, engine.py
runs the models on a device, pipeline.py runs the whole job, cli.py is the
``tts-batch`` command.
"""

__version__ = "0.1.0"
__all__ = ["Synthesizer"]


def __getattr__(name: str):
    # ``from tts_cli import Synthesizer`` without importing the pipeline for
    # the command, which starts before any of it is needed.
    if name == "Synthesizer":
        from tts_cli.synthesizer import Synthesizer
        return Synthesizer
    raise AttributeError(f"module 'tts_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
