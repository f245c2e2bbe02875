"""CLI verb `gpus`: every GPU of the GPU host and who holds it (container, pid in there, our run).

Exit 0, or 104 when a GPU holds memory at ≈0 % or memory held by a zombie of an earlier run (DESIGN §5); 102 when
the host cannot be reached. `--json`: one document (schema 1); `--watch --json`: one JSON line per reading.
`--watch` on a terminal is the live full-screen view (cli/gpustui.py); piped, it prints plain rows per reading.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dflashctl import bounds
from dflashctl.cli.app import app
from dflashctl.cli.common import Exit, HostOpt, HostsOpt, JsonOpt, console, open_target, print_json
from dflashctl.errors import ConfigError, ExitCode


def exit_code(view: object) -> int:
    """104 when some GPU is idle-allocated or orphaned (memory held at ≈0 %, or by a zombie), else 0."""
    from dflashctl.model import GpuFinding

    bad = (GpuFinding.IDLE_ALLOCATED, GpuFinding.ORPHANED)
    return int(ExitCode.STALLED) if any(g.finding in bad for g in view.gpus) else 0  # type: ignore[attr-defined]


@app.command("gpus")
def gpus_cmd(
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    watch: bool = typer.Option(False, "--watch", "-w", help="live view (a terminal: full screen, keys; piped: "
                               "plain rows per reading)"),
    interval: float = typer.Option(2.0, "--interval", "-n", callback=bounds.option(bounds.INTERVAL_S),
                                   help="seconds between readings with --watch"),
    count: int | None = typer.Option(None, "--count", "-c", metavar="N",
                                     help="with --watch piped or --json: stop after N readings"),
    json_out: bool = JsonOpt,
) -> None:
    """Every GPU of the host and who holds it: container, pid in there, user, memory, our run (current, earlier =
    zombie, none), with what to do about GPUs held idle and processes of no live run."""
    if interval <= 0:
        raise ConfigError(f"--interval must be > 0, got {interval:g}", hint="e.g. --interval 2")
    if count is not None and count < 1:
        raise ConfigError(f"--count must be at least 1, got {count}", hint="e.g. --count 5")
    import contextlib
    import itertools

    from dflashctl.commands import gpus

    with open_target(hosts, host) as target:
        if not watch:
            view = gpus.snapshot(target)
            if json_out:
                print_json(view.to_record())
            else:
                from dflashctl.cli.common import show
                from dflashctl.cli.gpusview import render_table

                show(render_table(view))
            raise Exit(exit_code(view))
        views = gpus.watch(target, interval)
        shown = itertools.islice(views, count)
        try:
            if json_out:
                for view in shown:
                    print_json(view.to_record())
            elif console.is_terminal:
                from dflashctl.cli.gpustui import run_tui

                run_tui(views)  # its own thread reads the views; `q` leaves
            else:
                from dflashctl.cli.gpusview import plain_rows

                for view in shown:
                    console.file.write("".join(line + "\n" for line in plain_rows(view)))
                    console.file.flush()
        except KeyboardInterrupt:
            pass
        finally:
            with contextlib.suppress(ValueError):  # still running in the live view's reader thread: the
                views.close()  # connection's close (open_target) ends it
        raise Exit(0)
