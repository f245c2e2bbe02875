"""CLI verb `stacks`: every thread's Python stack in every process of a run, innermost frame first.

Exit 0 when stacks were printed, 2 with one line when nothing could be dumped (no py-spy and no dump signal, py-spy
refused, no live process), 102 for an unknown run. --json prints the result's record.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dflashctl.cli.app import app
from dflashctl.cli.common import HostOpt, HostsOpt, JsonOpt, open_target, out, print_json

if TYPE_CHECKING:
    from rich.text import Text

    from dflashctl.analysis.stacks import ProcessStacks, ThreadStack


@cache
def _prefixes() -> tuple[re.Pattern[str], ...]:
    """Compiled on first use (not at every `dflashctl` start): a deployed code tree, then a library directory."""
    return (re.compile(r"^.*/\.code/[0-9a-f]+/"),  # a deployed code version: <workspace>/.code/<hash16>/
            re.compile(r"^.*/(?:site|dist)-packages/|^.*/lib/python3\.\d+/"))


def short_path(file: str) -> str:
    """A frame's file as a person reads it: from the deployed tree, the package, or the standard library on."""
    for pattern in _prefixes():
        shorter = pattern.sub("", file, count=1)
        if shorter != file:
            return shorter
    return file


def thread_header(t: ThreadStack) -> str:
    native = f" (native {t.native_id})" if t.native_id is not None else ""
    state = f" · {t.state}" if t.state else ""
    return f"pid {t.pid} · {t.thread}{native}{state}"


def process_lines(p: ProcessStacks) -> list[Text]:
    from rich.text import Text

    cmd = " ".join([p.argv[0].rsplit("/", 1)[-1], *p.argv[1:]]) if p.argv else "?"
    how = p.method or "no stacks"
    lines = [Text(""), Text(f"── pid {p.pid} · {cmd[:160]} ({p.role}) · {how}", style="bold")]
    if not p.threads:
        lines.append(Text(f"   {p.error or 'no Python thread'}", style="yellow"))
    for note in p.notes:
        lines.append(Text(f"   note: {note}", style="dim"))
    for i, t in enumerate(p.threads):
        if i:
            lines.append(Text(""))
        lines.append(Text(thread_header(t), style="bold cyan"))
        if not t.frames:
            lines.append(Text("    (no Python frame)", style="dim"))
        for f in t.frames:
            where = short_path(f.file) + (f":{f.line}" if f.line is not None else "")
            lines.append(Text(f"    {f.function} ({where})"))
            if f.code:
                lines.append(Text(f"        {f.code}", style="dim"))
    return lines


@app.command("stacks")
def stacks(
    run: str | None = typer.Argument(None, metavar="[RUN]", help="run id (default: the latest run)"),
    all_: bool = typer.Option(False, "--all", help="also the run's supervisor and sentinel"),
    no_save: bool = typer.Option(False, "--no-save",
                                 help="do not keep the capture in <run>/stacks/capture-<UTC stamp>.json"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Every thread's Python stack in every process of a run, innermost frame first with its line of code.

    py-spy where the container has it, else the trainer's dump signal (SIGUSR1 to faulthandler). The run's supervisor
    and sentinel are left out unless --all. Exit 0 when stacks were printed, 2 when nothing could be dumped."""
    from rich.text import Text

    from dflashctl.commands import stacks as stacks_cmd

    with open_target(hosts, host) as target:
        res = stacks_cmd.stacks(target, run, include_all=all_, save=not no_save)
    if json_out:
        print_json(res.to_record())
        return
    tool = (res.py_spy_version or "py-spy") if res.py_spy else "no py-spy: the trainer's dump signal"
    n = len(res.processes)
    out(Text(f"run {res.run_id} on {res.host} · {n} process{'es' if n != 1 else ''} · {tool}"))
    for p in res.processes:
        for line in process_lines(p):
            out(line)
    out(Text(""))
    if res.skipped:
        out(Text("left out: " + ", ".join(f"{s['role']} (pid {s['pid']})" for s in res.skipped) + " (--all)",
                 style="dim"))
    if res.saved:
        out(Text(f"saved {res.saved}", style="dim"))
    elif res.save_error:
        out(Text(f"not saved: {res.save_error}", style="yellow"))
