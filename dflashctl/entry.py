"""The console script's first step: `dflashctl version` answers before typer (and everything it pulls in) is
imported, since scripts call it in loops and a version check should cost about what `python -c pass` does; every
other command line goes to the typer app (cli/__init__.py main), which renders its own help and coerces its own
values."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:] == ["version"]:
        from dflashctl import __version__

        print(__version__)
        return 0
    from dflashctl.cli import main as cli_main

    return cli_main()
