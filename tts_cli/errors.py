"""Errors that end a whole run, as one line for the user."""


class FatalError(Exception):
    """Stops the run; the message is one line."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type when it has none."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__
