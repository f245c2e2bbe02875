"""CLI verbs of runs that exist: runs, logs (tail, follow, errors), stop, kill-zombies.

Each verb parses, calls one function in commands/, renders, and raises common.Exit with the
documented code (DESIGN §5). Errors are DflashError: one line at the boundary, never a traceback.
The text and --json of a verb come from the same result record (its to_record()).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dflashctl import bounds
from dflashctl.cli.app import app
from dflashctl.cli.cluster import (
    ClusterOpt,
    entry_host,
    logs_across,
    pick,
    stop_across,
    zombies_across,
)
from dflashctl.cli.common import Exit, HostOpt, HostsOpt, JsonOpt, age, err, escape, open_target, out, print_json, show
from dflashctl.errors import ConfigError, ExitCode

if TYPE_CHECKING:  # each verb imports its command module itself: `status` should not pay for `kill-zombies`
    from rich.table import Table

    from dflashctl.commands import logs as logs_cmd
    from dflashctl.commands import zombies as zombies_cmd
    from dflashctl.remote import Target


@app.command("runs")
def runs(host: str | None = HostOpt, hosts: Path | None = HostsOpt, json_out: bool = JsonOpt) -> None:
    """Every run on the host with its verdict, start, duration and last step; newest first."""
    from dflashctl.commands import runs as runs_cmd

    with open_target(hosts, host) as target:
        lst = runs_cmd.list_runs(target)
    if json_out:
        print_json(lst.to_record())
        return
    if not lst.runs:
        out(f"no runs in {lst.workspace}/runs on {lst.host}")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    chained = any(r.attempt is not None for r in lst.runs)
    watched = any(r.events_tail for r in lst.runs)
    for col in ("", "RUN", "VERDICT", "PID", "STARTED", "DURATION", "STEP", "EXIT", *(["ATTEMPT"] if chained else []),
                *(["LAST EVENT"] if watched else [])):
        table.add_column(col, no_wrap=col != "LAST EVENT", overflow="ellipsis")
    for r in lst.runs:
        started = r.meta.started_at or "-"
        table.add_row("*" if r.id == lst.latest else "", ("↳ " if (r.attempt or 1) > 1 else "") + r.id,
                      str(r.verdict(lst.now)), str(r.pid or "-"),
                      str(started), age(r.duration_s(lst.now)), "-" if r.last_step is None else str(r.last_step),
                      "-" if r.exit_code is None else str(r.exit_code), *([r.attempt_label] if chained else []),
                      *([_event_cell(r.last_event)] if watched else []))
    show(table)
    out("* = runs/latest")


def _event_cell(ev: dict | None) -> str:
    return "-" if ev is None else escape(f"{ev.get('kind')}: {ev.get('message') or ''}")[:90]


@app.command("logs")
def logs(
    run: str | None = typer.Argument(None, metavar="[RUN]", help="run id (default: the latest run)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing as the log grows (Ctrl-C detaches)"),
    lines: int = typer.Option(50, "--lines", "-n", metavar="N", callback=bounds.option(bounds.LINES),
                              help="lines from the end to print first"),
    errors: bool = typer.Option(False, "--errors",
                                help="only whole tracebacks of crashed threads and ranks + final exception"),
    events: bool = typer.Option(False, "--events", help="the run's event timeline (its sentinel's events.jsonl)"),
    node: str | None = typer.Option(None, "--node", metavar="HOST",
                                    help="a run across hosts: this node's log alone (else every node's, prefixed)"),
    cluster: str | None = ClusterOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Print a run's train.log (its tail, a live follow, or only its errors)."""
    if lines < 0:
        raise ConfigError(f"--lines must be 0 or more (got {lines})")
    from dflashctl.commands import logs as logs_cmd

    inv, _ = pick(hosts, host, cluster)
    with open_target(hosts, node or entry_host(inv, host, cluster)) as target:
        if errors:
            _print_errors(logs_cmd.errors(target, run), json_out)
            return
        if events:
            tl = logs_cmd.events(target, run)
            if json_out:
                print_json(tl.to_record())
            else:
                from dflashctl.cli.timeline import render_events

                show(render_events(tl.events))
            return
        if follow:
            raise Exit(follow_log(target, run, lines=lines))
        t = logs_cmd.tail(target, run, lines)
        across = t.run.meta.members
        if node is not None and node not in [h for h, _ in across or []]:
            raise ConfigError(f"--node {node}: run {t.run.id} is not a run across hosts with a node {node}",
                              hint="the nodes are in `dflashctl status RUN`")
        if across and node is None:
            logs_across(inv, target.host.name, t.run.id, across, lines, json_out)
            return
        if json_out:
            print_json(t.to_record())
            return
        sys.stdout.write(t.text)
        sys.stdout.flush()


def _print_errors(v: logs_cmd.ErrorsView, json_out: bool) -> None:
    if json_out:
        print_json(v.to_record())
        return
    if not v.tracebacks and not v.error_files and not v.workers:
        out(f"no tracebacks in {v.run.log_path}")
        return
    if v.scanned_from:
        out(f"[dim](scanned the last part of the log, from byte {v.scanned_from})[/]")
    for tb in v.tracebacks:
        who = escape(tb.thread if tb.rank is not None else f"thread {tb.thread}" if tb.thread else "main thread")
        out(f"[bold red]── {who}[/] [dim](log lines {tb.first_line}-{tb.last_line})[/]")
        out(tb.text.rstrip("\n"), markup=False, highlight=False)
    for thread, doc in v.files_only.items():
        out(f"[bold red]── thread {escape(thread)}[/] [dim](errors/{escape(thread)}.json)[/]")
        text = doc.get("traceback") or f"{doc.get('type')}: {doc.get('message')}"
        out(str(text).rstrip("\n"), markup=False, highlight=False)
    for f in v.workers.values():
        out(f"[bold red]── {escape(f.name)}[/] [dim](log line {f.line})[/] {escape(f.how)}")
        if f.exit_code is not None:
            out(f"  {f.text}", markup=False, highlight=False)
    if v.root_cause and len({tb.thread for tb in v.tracebacks if tb.thread} | set(v.workers)) > 1:
        out(f"[bold]first to fail:[/] {escape(v.root_cause)}")
    if v.final_exception:
        out(f"[bold]final exception:[/] {escape(v.final_exception)}")


def follow_log(target: Target, run: str | None, *, from_start: bool = False, lines: int = 10) -> int:
    """Stream a run's log to stdout until it ends (`logs -f`, `launch -f`); its verdict's exit code, 0 on Ctrl-C."""
    from dflashctl.commands import logs as logs_cmd

    info = None
    try:
        for ev in logs_cmd.follow(target, run, from_start=from_start, lines=lines):
            info = ev.run
            if ev.rotated:
                err("[dim]-- log rotated; reading from its start --[/]")
            if ev.data:
                sys.stdout.buffer.write(ev.data)
                sys.stdout.flush()
    except KeyboardInterrupt:
        if info is not None:
            err(f"\ndetached; run {info.id} keeps running (stop it with `dflashctl stop {info.id}`)")
        return 0
    if info is None:
        return 0
    verdict = info.verdict()
    err(f"-- run {info.id} ended: {verdict} (exit code {info.exit_code}) --")
    return int(verdict.exit_code)


@app.command("stop")
def stop(
    run: str | None = typer.Argument(None, metavar="[RUN]", help="run id (default: the latest run)"),
    grace: float = typer.Option(30.0, "--grace", metavar="S", callback=bounds.option(bounds.GRACE_S),
                                help="seconds between SIGTERM and SIGKILL"),
    cluster: str | None = ClusterOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Stop a run: SIGTERM to its process group, grace period, SIGKILL. Exits 103 (stopped by user).
    A run across hosts (meta.json `cluster`) is stopped on every node."""
    from dflashctl.commands import stop as stop_cmd
    from dflashctl.commands.runs import get_run

    inv, _ = pick(hosts, host, cluster)
    with open_target(hosts, entry_host(inv, host, cluster)) as target:
        info, _doc = get_run(target, run)
        across = info.meta.members
        if across:
            stop_across(inv, target.host.name, info.id, across, grace, json_out)
        res = stop_cmd.stop(target, info.id, grace_s=grace)
    if json_out:
        print_json(res.to_record())
    else:
        how = "SIGKILL after the grace period" if res.escalated else "SIGTERM"
        verb = "stopped" if not res.survivors else "signalled"
        out(f"{verb} run {res.run_id} (pid {res.pid}) with {how}: exit code {res.exit_code}", markup=False)
        if len(res.members) > 1:
            out("ended its process tree: " + ", ".join(f"{m['pid']} {_short_cmd(str(m.get('cmdline') or ''), 40)}"
                                                         for m in res.members), markup=False)
        if res.gpu_released_mib:
            freed = ", ".join(f"GPU {i}: {mib:.0f} MiB" for i, mib in res.gpu_released_mib.items() if mib)
            out(f"GPU memory released: {freed or 'none'}")
        if res.cache_removed:
            out(f"removed {len(res.cache_removed)} half-written compile-cache file(s): "
                + ", ".join(res.cache_removed[:3]) + (" …" if len(res.cache_removed) > 3 else ""), markup=False)
        for u in res.unwritten:
            why = "the disk is full: " if res.disk_full else ""
            err(f"[yellow]WARNING:[/] the run was ended but {why}could not write {escape(u)}")
        for s in res.survivors:
            err(f"[bold red]ERROR:[/] pid {s['pid']} ({escape(_short_cmd(str(s.get('cmdline') or '')))}) of the "
                "run's process tree is still alive after SIGKILL; the run is not stopped")
    if res.survivors:
        raise Exit(1)
    raise Exit(ExitCode.STOPPED)


def _short_cmd(cmdline: str, width: int = 70) -> str:
    """The command as a person reads it: program base name, then its arguments."""
    prog, _, rest = cmdline.partition(" ")
    text = f"{prog.rsplit('/', 1)[-1]} {rest}".strip().replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def zombie_table(rows: list[zombies_cmd.ZombieRow], *, outcome: bool) -> Table:
    """The processes kill-zombies (or a refused launch) lists; with outcome, what ending each one did."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("PID", "RUN", "AGE", "GPU MiB", "STATE", "ACTION", "WHY", "COMMAND"):
        table.add_column(col, overflow="fold", no_wrap=col != "WHY")
    if outcome:
        table.add_column("OUTCOME")
    for r in rows:
        cells = [str(r.pid), escape(r.run_id or "-"), age(r.age_s), "-" if r.gpu_mib is None else f"{r.gpu_mib:.0f}",
                 r.state, r.action, escape(r.why), escape(_short_cmd(r.cmdline))]
        if outcome:
            cells.append(r.outcome or "-")
        table.add_row(*cells)
    return table


@app.command("kill-zombies")
def kill_zombies(
    dry_run: bool = typer.Option(False, "--dry-run", help="only show what would be killed"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask before killing"),
    pid: list[int] | None = typer.Option(None, "--pid", metavar="PID",
                                         help="also end this process although it has no marker (repeatable)"),
    grace: float = typer.Option(10.0, "--grace", metavar="S", callback=bounds.option(bounds.GRACE_S),
                                help="seconds between SIGTERM and SIGKILL"),
    cluster: str | None = ClusterOpt,
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """End processes of earlier runs, defunct children's parents, and GPU holders of no live run (with --cluster
    NAME or --host a,b: on every one of those hosts)."""
    from dflashctl.commands import zombies as zombies_cmd

    inv, across = pick(hosts, host, cluster)
    if across is not None:
        if pid:
            raise ConfigError("--pid names a process on one host; give --host HOST with it")
        zombies_across(inv, across, dry_run, yes, grace, json_out, zombie_table)

    with open_target(hosts, host) as target:
        found = zombies_cmd.scan(target, tuple(pid or ()))
        victims = found.to_kill
        if not json_out:
            if found.current_run:
                out(f"current run {found.current_run} is protected")
            for note in found.notes:
                err(f"[yellow]WARNING:[/] {escape(note)}")
            if found.rows and (dry_run or not yes or not victims):
                show(zombie_table(found.rows, outcome=False))
        if not victims or dry_run:
            if json_out:
                print_json(zombies_cmd.record(found, dry_run=dry_run))
            elif not victims:
                out(f"no zombies on {target.host.label}")
            else:
                out(f"dry run: {len(victims)} process(es) would be ended")
            return
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigError(f"refusing to kill {len(victims)} process(es) without confirmation",
                                  hint="pass --yes (stdin is not a terminal), or --dry-run to look first")
            if not typer.confirm(f"end {len(victims)} process(es)?", default=False):
                raise Exit(ExitCode.USAGE)
        t0 = time.monotonic()
        report = zombies_cmd.kill(target, found, grace_s=grace)
    if json_out:
        print_json(zombies_cmd.record(found, dry_run=False, report=report))
    else:
        show(zombie_table(report.rows, outcome=True))
        out(f"ended {len(report.ended)} of {len(victims)} in {time.monotonic() - t0:.1f}s")
    raise Exit(0 if not report.failed else 1)


@app.command("export")
def export(
    run: str = typer.Argument("latest", metavar="[RUN]",
                              help="the training run whose drafter to export (id or latest)"),
    out_dir: Path | None = typer.Option(None, "--out", "-o", metavar="DIR",
                                        help="local directory to create (default ./drafters/<run>-step-N-<dtype>; "
                                             "never overwritten)"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 (as published drafters) or float32"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Export a run's drafter (newest checkpoint) as config.json + model.safetensors — the layout the dflash
    package, SGLang and vLLM load — in the container, and copy it here."""
    from dflashctl.commands import export as export_cmd

    if dtype not in ("bfloat16", "float32"):
        raise ConfigError(f"--dtype {dtype!r}: expected bfloat16 or float32", hint="e.g. --dtype bfloat16")
    with open_target(hosts, host) as target:
        res = export_cmd.export(target, run, out_dir, dtype)
    if json_out:
        print_json(res.to_record())
        return
    size = sum(int(f["size"]) for f in res.files.values()) / 2**20
    out(f"{res.local_dir}: drafter of run {res.run_id} ({size:.1f} MiB, sha256 checked; "
        f"{'kept' if res.reused else 'written'} in the container at {res.remote_dir})", markup=False)
    out(f"  load it: dflash.model.DFlashDraftModel.from_pretrained({res.local_dir!r}), or serve it with SGLang "
        f"--speculative-draft-model-path {res.local_dir}", markup=False)
