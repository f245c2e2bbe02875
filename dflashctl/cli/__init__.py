"""The typer app: parse, call one function in commands/, render, return an exit code. No logic.

Each verb group registers itself from its own module (hosts.py, deploy.py, launch.py, runs.py, stacks.py,
status.py); this module is the boundary that turns a DflashError into one line on stderr and its documented exit code.

Shell completion is typer's: `--show-completion` prints the script for the shell it detects (shellingham: the
parent processes), `--install-completion` writes it into that shell's startup file.
"""

from __future__ import annotations

import functools
import sys

import typer
from typer._click.exceptions import NoArgsIsHelpError
from typer.exceptions import TyperException
from typer.main import get_command

from dflashctl.cli import coerce, common
from dflashctl.cli.app import app
from dflashctl.errors import DflashError, ExitCode

# Verb groups register on `app` when imported (each module owns its verbs).
# The import order is the order of `dflashctl --help`.
# isort: off
from dflashctl.cli import hosts as _hosts  # noqa: E402,F401
from dflashctl.cli import deploy as _deploy  # noqa: E402,F401
from dflashctl.cli import launch as _launch  # noqa: E402,F401
from dflashctl.cli import runs as _runs  # noqa: E402,F401
from dflashctl.cli import stacks as _stacks  # noqa: E402,F401
from dflashctl.cli import status as _status  # noqa: E402,F401
from dflashctl.cli import gpus as _gpus  # noqa: E402,F401
# isort: on


@functools.cache
def built_command():  # noqa: ANN201 - a click command (typer._click), not worth importing its type here
    """The click command behind `app`, built once a process (~10 ms): the command server builds it before it
    forks, so a served call does not pay it. click commands keep no state between invocations."""
    command = get_command(app)
    coerce.install(command)  # no pydantic for plain values (issue 16)
    return command


def main(argv: list[str] | None = None) -> int:
    """The console script: the verb's exit code (DESIGN §5); never a traceback for a DflashError."""
    try:
        rv = built_command()(args=argv, prog_name="dflashctl", standalone_mode=False)
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
    except SystemExit as e:  # --show-completion / --install-completion and completion requests end with sys.exit
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
