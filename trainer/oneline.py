"""An exception as one line for the user: every "cannot load / cannot join (…)" message of the trainer quotes it."""

from __future__ import annotations


def first_line(e: BaseException) -> str:
    """The first line of the message (libraries raise multi-line ones), or the type's name when there is none."""
    lines = str(e).strip().splitlines()
    return lines[0].strip() if lines else type(e).__name__
