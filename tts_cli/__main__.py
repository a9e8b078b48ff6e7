"""``python -m tts_cli`` runs the ``tts-batch`` command."""
from tts_cli.cli import main

if __name__ == "__main__":
    main(prog_name="tts-batch")
