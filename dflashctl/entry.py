"""The console script's first step: `dflashctl version` answers before typer (and everything it pulls in) is
imported, since scripts call it in loops and a version check should cost about what `python -c pass` does; so does a
one-shot `status` of the plain shape (cli/statusonce.py: typer's coercion imports pydantic), which scripts poll; every
other command line goes to the typer app (cli/__init__.py main), which renders its own help and coerces its own
values."""

from __future__ import annotations

import sys


def main() -> int:
    """The command's exit code; Ctrl-C at any point — while typer or torch-free imports are still loading, before
    the commands' own handlers exist — is one line and 130, never a traceback or silence."""
    try:
        return _dispatch()
    except KeyboardInterrupt:
        sys.stderr.write("ERROR: interrupted\n")
        return 130


def _dispatch() -> int:
    if sys.argv[1:] == ["version"]:
        from dflashctl import __version__

        print(__version__)
        return 0
    if sys.argv[1:2] == ["status"]:  # a one-shot status of the plain shape, before typer (cli/statusonce.py)
        from dflashctl.cli.statusonce import quick

        code = quick(sys.argv[2:])
        if code is not None:
            return code
    from dflashctl.cli import main as cli_main

    return cli_main()
