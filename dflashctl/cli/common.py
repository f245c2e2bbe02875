"""Shared CLI plumbing: the consoles, one-line errors, JSON output, host selection options, the target.

Nothing heavy at import (issue 16: `dflashctl version` starts fast): rich, the model and the transports are imported
on first use, so a verb pays only for what it prints and talks to.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from dflashctl.remote import Target


class _LazyConsole:
    """A rich Console made on first use (rich costs more to import than `version` may take in all)."""

    def __init__(self, **kwargs: Any):
        object.__setattr__(self, "_kwargs", kwargs)
        object.__setattr__(self, "_console", None)

    def _get(self) -> Console:
        if self._console is None:
            from rich.console import Console

            object.__setattr__(self, "_console", Console(**self._kwargs))
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __enter__(self) -> Console:  # rich's Live enters its console: dunders bypass __getattr__
        return self._get().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._get().__exit__(*exc)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)


console: Console = _LazyConsole(highlight=False)  # type: ignore[assignment]
err_console: Console = _LazyConsole(stderr=True, highlight=False)  # type: ignore[assignment]


def rich_console(*, stderr: bool = False) -> Console:
    """The real Console behind `console` / `err_console`, for rich objects that take one (Live)."""
    return (err_console if stderr else console)._get()  # type: ignore[attr-defined]


def out(*objects: Any, **kwargs: Any) -> None:
    """Plain lines on stdout: never re-wrapped at 80 columns when piped."""
    console.print(*objects, **{"soft_wrap": True, **kwargs})


def err(*objects: Any, **kwargs: Any) -> None:
    """Plain lines on stderr, like out()."""
    err_console.print(*objects, **{"soft_wrap": True, **kwargs})


def escape(text: str) -> str:
    """rich's markup escape, imported when something is printed."""
    from rich.markup import escape as _escape

    return _escape(text)


class Exit(Exception):
    """Raised by a command to return an exit code after it has rendered its output."""

    def __init__(self, code: int):
        self.code = int(code)


def error(message: str, *, hint: str | None = None) -> None:
    """nvitop's style: the prefix coloured, the message plain, on stderr, one line (+ a hint)."""
    line = message.splitlines()[0] if message else "error"
    # escape(): messages quote config text such as "[hosts.pve]", which rich would eat as markup
    err_console.print(f"[bold red]ERROR:[/] {escape(line)}", markup=True, soft_wrap=True, highlight=False)
    if hint:
        err_console.print(f"[bold yellow]HINT:[/] {escape(hint)}", soft_wrap=True)


def print_json(doc: dict[str, Any]) -> None:
    """One JSON document (or one JSON Lines record) with the schema field first."""
    from dflashctl.model import SCHEMA

    out = {"schema": SCHEMA, **{k: v for k, v in doc.items() if k != "schema"}}
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()


def __getattr__(name: str) -> Any:
    """HostsOpt, HostOpt, JsonOpt: typer's option objects, made when a verb module first imports them, so that the
    one-shot `status` (cli/statusonce.py, answered before typer) can use this module without importing typer."""
    if name not in ("HostsOpt", "HostOpt", "JsonOpt"):  # the import system asks for __path__ and the like
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import typer

    made = {"HostsOpt": lambda: typer.Option(None, "--hosts", help="hosts.toml to use (else $DFLASHCTL_HOSTS, "
                                             "./hosts.toml, ~/.config/dflashctl/hosts.toml)", metavar="FILE"),
            "HostOpt": lambda: typer.Option(None, "--host", "-H",
                                            help="host name from hosts.toml (default: its `default`)"),
            "JsonOpt": lambda: typer.Option(False, "--json", help="print JSON (schema 1) instead of a table")}
    value = globals()[name] = made[name]()
    return value


@contextmanager
def open_target(hosts: Path | None, host: str | None) -> Iterator[Target]:
    """The host chosen by --hosts/--host, connected, and closed on every path out of the verb."""
    from dflashctl.config import load_inventory
    from dflashctl.remote import connect

    target = connect(load_inventory(hosts).get(host))
    try:
        yield target
    finally:
        target.close()


def show(renderable: object, *, to_stderr: bool = False) -> None:
    """Tables keep whole run ids when piped: rich would squeeze them into 80 columns."""
    c = err_console if to_stderr else console
    if c.is_terminal:
        c.print(renderable)
        return
    saved = c.width
    c.width = 240
    try:
        c.print(renderable)
    finally:
        c.width = saved


def age(seconds: float | None) -> str:
    """A duration the way a run table reads it: 42s, 3m07s, 2h05m, 1d03h ("-" when unknown)."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
