"""The typer app: parse, call one function in commands/, render, return an exit code. No logic.

Each verb group registers itself from its own module (hosts.py, runs.py, status.py); this module
is the boundary that turns a DflashError into one line on stderr and its documented exit code.
"""

from __future__ import annotations

import sys

import typer
from typer._click.exceptions import NoArgsIsHelpError
from typer.exceptions import TyperException

from dflashctl.cli import common
from dflashctl.errors import DflashError, ExitCode

app = typer.Typer(
    name="dflashctl",
    help="Deploy, launch and watch DFlash drafter training inside a Proxmox LXC container.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



@app.callback()
def _root() -> None:
    """Deploy, launch and watch DFlash drafter training inside a Proxmox LXC container."""


# Verb groups register on `app` when imported (each module owns its verbs).
from dflashctl.cli import hosts as _hosts  # noqa: E402,F401
from dflashctl.cli import runs as _runs  # noqa: E402,F401
from dflashctl.cli import status as _status  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, prog_name="dflashctl", standalone_mode=False)
    except DflashError as e:
        common.error(e.message, hint=e.hint)
        return int(e.exit_code)
    except common.Exit as e:
        return e.code
    except typer.Exit as e:
        return e.exit_code
    except NoArgsIsHelpError:  # typer has already printed the help
        return 0
    except TyperException as e:  # usage errors: bad option, missing argument, bad value
        common.error(e.format_message(), hint="see `dflashctl --help` or `dflashctl COMMAND --help`")
        return int(ExitCode.USAGE)
    except (KeyboardInterrupt, typer.Abort):
        common.error("interrupted")
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
