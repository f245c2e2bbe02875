"""The typer app: parse, call one function in commands/, render, return an exit code. No logic.

Each verb group registers itself from its own module (hosts.py, deploy.py, launch.py, runs.py, stacks.py,
status.py); this module is the boundary that turns a DflashError into one line on stderr and its documented exit code.

Shell completion is typer's: `--show-completion` prints the script for the shell it detects (shellingham: the
parent processes), `--install-completion` writes it into that shell's startup file.
"""

from __future__ import annotations

import sys
from typing import Any

from dflashctl.cli import common
from dflashctl.errors import DflashError, ExitCode


def typer_app() -> Any:
    """The typer app with every verb registered. Imported when a command line reaches typer, not with this package:
    the one-shot status answered before typer (cli/statusonce.py, entry.py) lives in it too."""
    from dflashctl.cli.app import app

    # Verb groups register on `app` when imported (each module owns its verbs).
    # The import order is the order of `dflashctl --help`.
    # isort: off
    from dflashctl.cli import hosts as _hosts  # noqa: F401
    from dflashctl.cli import deploy as _deploy  # noqa: F401
    from dflashctl.cli import launch as _launch  # noqa: F401
    from dflashctl.cli import runs as _runs  # noqa: F401
    from dflashctl.cli import stacks as _stacks  # noqa: F401
    from dflashctl.cli import status as _status  # noqa: F401
    from dflashctl.cli import gpus as _gpus  # noqa: F401
    # isort: on
    return app


def plain_metavars(command: Any, ctx: Any = None) -> Any:
    """typer (0.29) puts a Python type in the help's type column of an option without a metavar (`<bool>`,
    `<str>`): a flag takes no value, so it shows none, and a valued option shows its name (NAME), as click's help
    always did. Display only: parsing and coercion stay typer's. The help option (-h/--help) is made here, with the
    app's names, as click would make it at the first parse."""
    from typer._click.core import Context

    ctx = Context(command, parent=ctx, info_name=command.name, **(command.context_settings if ctx is None else {}))
    help_option = command.get_help_option(ctx)
    for p in [*command.params, *([help_option] if help_option is not None else [])]:
        if p.param_type_name == "option" and p.metavar is None:
            p.metavar = "" if p.is_flag else (p.name or "value").upper()
    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub, ctx)
    return command


class _Interrupted(Exception):
    """Ctrl-C (or a caught SIGTERM/SIGHUP) carried past typer, which would turn it into a silent exit code."""


def main(argv: list[str] | None = None) -> int:
    """The console script: the verb's exit code (DESIGN §5); never a traceback for a DflashError."""
    import typer
    from typer._click.exceptions import NoArgsIsHelpError
    from typer.exceptions import TyperException
    from typer.main import get_command

    command = plain_metavars(get_command(typer_app()))
    invoke = command.invoke

    def invoke_past_typer(ctx: Any) -> Any:  # typer returns Ctrl-C as a bare 130; it must say why
        try:
            return invoke(ctx)
        except KeyboardInterrupt as e:
            raise _Interrupted from e

    command.invoke = invoke_past_typer
    try:
        rv = command(args=argv, prog_name="dflashctl", standalone_mode=False)
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
    except (KeyboardInterrupt, _Interrupted, typer.Abort):
        common.error("interrupted")
        return 130
    except SystemExit as e:  # --show-completion / --install-completion and completion requests end with sys.exit
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
