"""CLI verbs: status (one-shot, --watch, --all) and diagnose (offline). One renderer serves them all.

Exit codes are the verdict's (DESIGN §5): 0 training/starting/finished, 100 crashed/lost, 103 stopped,
104 stalled, 105 degraded; 102 run or host not found; 2 usage. `--json` is built from the same record
the table is drawn from; `--watch --json` prints one JSON line per probe report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dflashctl import bounds
from dflashctl.cli import statusonce
from dflashctl.cli.app import app
from dflashctl.cli.cluster import ClusterOpt, entry_host, watch_across
from dflashctl.cli.common import Exit, HostOpt, HostsOpt, JsonOpt, err, escape, print_json
from dflashctl.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import RenderableType

    from dflashctl.commands.status import StatusView
    from dflashctl.model import Verdict


def render_view(v: StatusView, *, history: bool = False, events: int | None = 5) -> RenderableType:
    """The one-shot and --watch view (cli/statusview.py: rich and the analysis records load only to draw)."""
    from dflashctl.cli import statusview

    return statusview.render_view(v, history=history, events=events)


def _print(renderable: RenderableType) -> None:
    from dflashctl.cli.statusview import print_wide

    print_wide(renderable)


def _load_hosts(hosts: Path | None):
    from dflashctl.config import load_inventory

    return load_inventory(hosts)


@app.command("status")
def status(
    run: str = typer.Argument(None, metavar="[RUN]", help="run id (default: the latest run)"),
    hosts: Path = HostsOpt,
    host: str = HostOpt,
    json_: bool = JsonOpt,
    watch: bool = typer.Option(False, "--watch", "-w", help="live view, redrawn in place (streaming probe)"),
    interval: float = typer.Option(1.0, "--interval", "-i", callback=bounds.option(bounds.INTERVAL_S), metavar="SEC",
                                   help="seconds between reports in --watch"),
    gpu_interval: float | None = typer.Option(None, "--gpu-interval", metavar="SEC",
                                              callback=bounds.option(bounds.INTERVAL_S),
                                              help="with --watch: read the GPUs this often (≤ --interval; default: "
                                                   "once a report); the histories show each report's min/mean/max"),
    exit_on_failure: bool = typer.Option(False, "--exit-on-failure",
                                         help="with --watch: exit with the verdict's code once the run "
                                              "crashes, loses a thread or stalls"),
    all_hosts: bool = typer.Option(False, "--all", help="every host of the inventory, one line each"),
    cluster: str | None = ClusterOpt,
    events: bool = typer.Option(False, "--events", help="the run's whole event timeline (its sentinel's "
                                                        "events.jsonl), not only the last few"),
    notify_desktop: bool = typer.Option(False, "--notify-desktop",
                                        help="with --watch: a desktop notification when the run fails or ends"),
) -> None:
    """The run's verdict, threads, GPUs and known failures (exit code = the verdict's code). A run across hosts
    (--cluster NAME, --host pve1,pve2, or a run whose meta.json names its nodes): one row per node."""
    if all_hosts:
        if run or host or watch:
            raise ConfigError("--all checks the latest run of every host; it takes no RUN, --host or --watch")
        _status_all(hosts, json_)
    if exit_on_failure and not watch:
        raise ConfigError("--exit-on-failure needs --watch", hint="one-shot status already exits with the verdict")
    if notify_desktop and not watch:
        raise ConfigError("--notify-desktop needs --watch", hint="dflashctl status --watch --notify-desktop")
    if gpu_interval is not None:
        if not watch:
            raise ConfigError("--gpu-interval needs --watch", hint="one-shot status reads the GPUs once")
        if not 0 < gpu_interval <= interval:
            raise ConfigError(f"--gpu-interval {gpu_interval:g} must be above 0 and at most --interval ({interval:g})",
                              hint="e.g. dflashctl status --watch --gpu-interval 0.2")
    if not watch:  # the body the console script also runs before typer (entry.py)
        statusonce.show(statusonce.OneShot(run, hosts, host, json_, events), cluster)
    inv = _load_hosts(hosts)
    across = cluster is not None or (host is not None and "," in host)
    h = inv.get(entry_host(inv, host, cluster))  # a run across hosts is asked on its first host, which names the rest
    from dflashctl.remote import connect

    if across:  # every node at once, one connection per host
        watch_across(inv, h, run, interval, json_, exit_on_failure)
    _watch(lambda: connect(h), run, interval, json_, exit_on_failure, None if events else 5,
           _Desktop() if notify_desktop else None, gpu_interval)


class _Desktop:
    """`--notify-desktop`: one notification each time the verdict becomes a failure or an end."""

    def __init__(self) -> None:
        self.last: Verdict | None = None

    def see(self, v: StatusView) -> None:
        verdict = v.health.verdict
        if v.reconnecting or v.settling or verdict == self.last:
            return
        first, self.last = self.last is None, verdict
        if (verdict.is_failure or verdict.is_terminal) and not (first and verdict.is_terminal):
            from dflashctl.cli.timeline import desktop_notify

            why = desktop_notify(f"dflashctl: {v.host} run {v.run_id} {verdict}", "; ".join(v.health.reasons[:2]))
            if why:
                err(f"[dim]{escape(why)}[/]")


def _watch(connect, run: str | None, interval: float, json_: bool, exit_on_failure: bool,  # noqa: ANN001
           events: int | None = 5, desktop: _Desktop | None = None, gpu_interval: float | None = None) -> None:
    from dflashctl.cli.live import watch_loop
    from dflashctl.commands import status as status_cmd

    views = status_cmd.watch(connect, run, interval=interval, gpu_interval=gpu_interval)
    watch_loop(views, lambda v: render_view(v, history=True, events=events), json_,
               lambda v: _done(v, exit_on_failure), desktop.see if desktop else None,
               lambda doc: print_json(doc))  # looked up on each line: tests/status hook this module's print_json


def _done(v: StatusView, exit_on_failure: bool) -> bool:
    from dflashctl.commands import status as status_cmd

    if v.reconnecting or v.settling or v.restart_pending:  # a restart pending: the watch follows the next attempt
        return False
    if exit_on_failure and status_cmd.is_failure(v):
        return True
    return v.health.verdict.is_terminal  # nothing more will happen: stop watching


def _status_all(hosts: Path | None, json_: bool) -> None:
    from dflashctl.cli import statusview as view
    from dflashctl.commands import status as status_cmd
    from dflashctl.remote import connect

    inv = _load_hosts(hosts)
    names = inv.names()
    lines = status_cmd.status_all([inv.get(n) for n in names], connect)
    code = status_cmd.all_exit_code(lines)
    if json_:
        print_json(status_cmd.all_record(lines))
        raise Exit(code)
    _print(view.render_all(lines))
    raise Exit(code)


@app.command("diagnose")
def diagnose(
    logs: list[Path] = typer.Argument(None, metavar="[LOG]...",
                                      help="copied train.log files (oldest first), or a copied run directory"),
    gpus: list[Path] = typer.Option(None, "--gpus", metavar="FILE",
                                    help="saved nvidia-smi output: CSV query, plain table, or `nvidia-smi -q` "
                                         "(its GPU health only); repeatable"),
    progress_regex: str | None = typer.Option(None, "--progress-regex", metavar="REGEX",
                                              help="your trainer's own progress line: a regex with named groups "
                                                   "step, total, loss, lr, epoch, tok_s, it_s, eta_s"),
    kernel_log: list[Path] = typer.Option(None, "--kernel-log", metavar="FILE",
                                          help="saved `dmesg` / `journalctl -k` of the GPU host: its NVIDIA Xid "
                                               "lines become GPU findings (repeatable)"),
    json_: bool = JsonOpt,
) -> None:
    """What went wrong and what to do, from copied files only (exit code = the verdict's code)."""
    from dflashctl.cli.statusview import render
    from dflashctl.commands import diagnose as diagnose_cmd

    d = diagnose_cmd.diagnose(list(logs or []), list(gpus or []), progress_regex=progress_regex,
                              kernel_logs=list(kernel_log or []))
    if json_:
        print_json(d.to_record())
    else:
        _print(render(f"diagnose {', '.join(d.sources)}", d.health, extra=[f"{d.log.last_line_no} lines"],
                      notes=[f"flight recorder: {b.line()}" for b in d.behind]))
    raise Exit(d.health.exit_code)


