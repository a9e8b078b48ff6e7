"""``python -m tts_cli`` runs the ``tts-batch`` command."""
from tts_cli.cli import run

if __name__ == "__main__":
    run()
