"""The console script's first step: `dflashctl version` answers before typer (and everything it pulls in) is
imported, since scripts call it in loops and a version check should cost what `python -c pass` does (issue 16);
`--help` is printed from the help cache when typer printed the same before (helpcache.py); a one-shot `status` or
`runs` (the table or --json) runs in a child of the command server when one is up (cmdclient.py, cmdserver.py);
every other command line goes to the typer app (cli/__init__.py main)."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:] == ["version"]:
        from dflashctl import __version__

        print(__version__)
        return 0
    from dflashctl import helpcache

    if helpcache.help_request(sys.argv[1:]):
        return helpcache.answer(sys.argv[1:], _typer_app)
    from dflashctl import cmdclient

    code = cmdclient.run(sys.argv[1:])
    return _typer_app() if code is None else code


def _typer_app() -> int:
    from dflashctl.cli import main as cli_main

    return cli_main()
