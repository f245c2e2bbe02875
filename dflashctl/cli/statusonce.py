"""One-shot `status` (no --watch, no --all): the body the typer verb runs (cli/status.py), and the console script's
way to the same body before typer is imported (entry.py).

Why: typer's own coercion imports pydantic when it parses any command line, and the typer app imports every verb
module; together about half the laptop CPU of a one-shot `status --json` over ssh (benchmarks/startup.py). A
script polling `status` pays that on every call. So `quick` takes the common command lines of one shape only —
`status [RUN] [--json] [--events] [--host NAME|-H NAME] [--hosts FILE]`, each option at most once, no empty value —
and hands every other line (help, --watch, a typo, a repeated option, `--`) to typer, which parses, explains and
refuses as it always did. Both ways run `show` with the same values, so the output and the exit code are one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dflashctl.cli.common import Exit, error, print_json
from dflashctl.errors import DflashError

_FLAGS = {"--json": "json_", "--events": "events"}
_VALUED = {"--host": "host", "-H": "host", "--hosts": "hosts"}


@dataclass
class OneShot:
    """The values of a one-shot `status` command line, as typer would have coerced them."""

    run: str | None = None
    hosts: Path | None = None
    host: str | None = None
    json_: bool = False
    events: bool = False


def parse(argv: list[str]) -> OneShot | None:
    """The values of `status`'s arguments (argv without the verb) when they are of the one plain shape, else None
    (typer's to parse: it knows every option, the help and the usage errors)."""
    got: dict[str, object] = {}
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if arg in _FLAGS:
            key, val = _FLAGS[arg], True
        elif name in _VALUED and (name == arg or name.startswith("--")):  # click reads `-H=x` as the value "=x"
            if not eq:
                value = next(args, "")
            key, val = _VALUED[name], value
            if not value or value.startswith("-"):
                return None  # a missing or odd value: typer's message
        elif arg and not arg.startswith("-"):
            key, val = "run", arg
        else:
            return None  # another option, `--`, an empty argument
        if key in got:
            return None  # typer decides what a repeated option or a second RUN means
        got[key] = val
    if "hosts" in got:
        got["hosts"] = Path(str(got["hosts"]))
    return OneShot(**got)  # type: ignore[arg-type]


def show(o: OneShot, cluster: str | None = None) -> None:
    """One look at a run: print its view (or a cluster run's rows) and raise Exit with the verdict's code."""
    from dflashctl.config import load_inventory

    inv = load_inventory(o.hosts)
    if cluster is not None or (o.host is not None and "," in o.host):  # the members are known: one round
        from dflashctl.cli.cluster import status_known

        status_known(inv, o.host, cluster, o.run, o.json_)  # raises Exit with the run's code
        return
    h = inv.get(o.host)
    from dflashctl.remote import connect
    from dflashctl.remote.probe import StatusFetch

    with connect(h) as target:
        fetch = StatusFetch(target, o.run)  # asked first: the judging code below is imported while the host works
        from dflashctl.commands import status as status_cmd

        v = status_cmd.status_once(target, o.run, fetch=fetch)
    if v.run is not None and v.run.meta.members:
        from dflashctl.cli.cluster import status_across

        status_across(inv, v, o.json_)
    if o.json_:
        print_json(v.to_record())
    else:
        from dflashctl.cli.statusview import print_wide, render_view

        print_wide(render_view(v, events=None if o.events else 5))
    raise Exit(v.exit_code)


def guarded(body: Callable[[], None]) -> int:
    """body's exit code as the console script returns it (cli/__init__.py main, DESIGN §5): a DflashError is one line
    on stderr and its code, never a traceback."""
    try:
        body()
    except DflashError as e:
        error(e.message, hint=e.hint)
        return int(e.exit_code)
    except Exit as e:
        return e.code
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    return 0


def quick(argv: list[str]) -> int | None:
    """`status …` answered without typer (the exit code), or None: not of the plain shape, typer's to run."""
    o = parse(argv)
    return None if o is None else guarded(lambda: show(o))
