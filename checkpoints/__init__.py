"""Installed as the package ``tts_cli.demo_voice`` (see setup.cfg), so that a
non-editable install carries the demo voice's two files with it."""
