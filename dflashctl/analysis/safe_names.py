"""Names the container sends back, checked before the laptop uses them (issue 26 part 2).

The container is not trusted with a path: a run id, a host name of a cluster member, a file name of an export —
anything that comes back in a reply and ends up in a local path, a command or a terminal — passes `safe_name`
first. A name is what our own launcher and hosts.toml make: letters, digits, '.', '_', '-' (run ids are built that
way: commands/program.py run_slug), not starting with a dot, at most NAME_MAX characters. Everything else (a slash,
`..`, a control character or escape sequence, an empty or huge string, a non-string) is a malformed reply: one
line naming the host and what it sent, exit 100 (the container answered, and its answer is broken).

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from dflashctl.errors import DflashError, ExitCode

NAME_MAX = 200
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_SHOWN = 80  # characters of a bad value quoted in the message


class MalformedReply(DflashError):
    """The container's reply holds a value the laptop must not use (a path where a name belongs, …)."""

    exit_code = ExitCode.CRASHED


def is_safe_name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= NAME_MAX and _NAME.fullmatch(value) is not None


def safe_name(value: Any, what: str, host: str) -> str:
    """value itself when it is a plain name; else MalformedReply naming the host, what it was and what came."""
    if is_safe_name(value):
        return value
    shown = repr(value)
    shown = shown if len(shown) <= _SHOWN else shown[: _SHOWN - 1] + "…"
    raise MalformedReply(f"host {host} sent a malformed {what}: {shown} (expected letters, digits, '.', '_', '-')",
                         hint="the container's reply was refused and nothing was written here; check what runs "
                              "in that container")
