"""tts-batch: batch speech synthesis of a text corpus with Tacotron2 + WaveGlow.

The stages, one module each: text -> corpus -> batching -> tacotron2 ->
waveglow -> audio + manifest; checkpoints.py knows the file formats, engine.py
runs the models on a device, pipeline.py runs the whole job, cli.py is the
``tts-batch`` command.
"""

__version__ = "0.1.0"
