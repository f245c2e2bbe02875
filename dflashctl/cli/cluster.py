"""The multi-host halves of launch, status, logs, stop and kill-zombies (a run across hosts, issue 17 part 2).

The verbs stay where they are (cli/launch.py, cli/status.py, cli/runs.py); each hands over here when it is given
`--cluster NAME` / `--host a,b`, or finds meta.json `cluster` in the run it reads. Rendering
only: the work is in commands/cluster.py and commands/cluster_runs.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dflashctl.cli.common import Exit, err, escape, out, print_json, show
from dflashctl.errors import ConfigError, ExitCode

if TYPE_CHECKING:
    from dflashctl.commands.cluster_runs import ClusterStatus
    from dflashctl.commands.program import LaunchOptions
    from dflashctl.commands.status import StatusView
    from dflashctl.config import Inventory
    from dflashctl.model import Cluster, Host

ClusterOpt = typer.Option(None, "--cluster", metavar="NAME",
                          help="a \\[clusters.NAME] table of hosts.toml: every host of it (or give --host pve1,pve2)")


def pick(hosts: Path | None, host: str | None, cluster: str | None, **overrides: int | None
         ) -> tuple[Inventory, Cluster | None]:
    from dflashctl.commands.cluster import resolve
    from dflashctl.config import load_inventory

    inv = load_inventory(hosts)
    found = resolve(inv, host, cluster, **overrides)
    if found is None and any(v is not None for v in overrides.values()):
        raise ConfigError("--rendezvous-port and --nproc-per-node are for a run across hosts",
                          hint="add --cluster NAME or --host pve1,pve2")
    return inv, found


def entry_host(inv: Inventory, host: str | None, cluster: str | None) -> str | None:
    """The host a command about a run across hosts asks first (the cluster's first; its run names the others)."""
    if cluster is None and (host is None or "," not in host):
        return host  # an ordinary one-host command: the launch machinery stays unimported (start-up cost)
    from dflashctl.commands.cluster import resolve

    found = resolve(inv, host, cluster)
    return host if found is None else found.hosts[0]


def launch_across(inv: Inventory, cluster: Cluster, opts: LaunchOptions, json_out: bool) -> None:
    from dflashctl.commands import cluster as cluster_cmd
    from dflashctl.remote import connect

    say = (lambda m: None) if json_out else (lambda m: err(f"[dim]{escape(m)}[/]"))
    res = cluster_cmd.launch(inv, cluster, opts, connect, say=say)
    if json_out:
        print_json(res.to_record())
        raise Exit(0)
    out(f"launched run [bold]{escape(res.run_id)}[/] on {len(res.nodes)} hosts (cluster {escape(cluster.name)}, "
        f"rendezvous {res.rendezvous})")
    for i, n in enumerate(res.nodes):
        out(f"  node {i}  {n.host:<12} pid {n.pid}  log {n.log_path}", markup=False)
    where = f"--cluster {cluster.name}" if "," not in cluster.name else f"--hosts {cluster.name}"
    out(f"  next dflashctl status {res.run_id} {where} | dflashctl stop {res.run_id} --host {cluster.hosts[0]}",
        markup=False, soft_wrap=True)
    raise Exit(0)


def status_across(inv: Inventory, first: StatusView, json_out: bool) -> None:
    """`status` of a run whose meta.json names a cluster (only its first host given): every other node asked next."""
    from dflashctl.commands.cluster_runs import cluster_status
    from dflashctl.remote import connect

    _show_status(cluster_status(inv, first, connect), json_out)


def status_known(inv: Inventory, host: str | None, cluster: str | None, run: str | None, json_out: bool) -> None:
    """`status --cluster NAME` / `--host a,b`: the members are known, so every node is asked in one round."""
    from dflashctl.commands.cluster import resolve
    from dflashctl.commands.cluster_runs import status_of
    from dflashctl.remote import connect

    found = resolve(inv, host, cluster)
    assert found is not None  # the caller passes a cluster or a host list
    _show_status(status_of(inv, found, run, connect), json_out)


def _show_status(cs: ClusterStatus, json_out: bool) -> None:
    """The whole run, one row per node; exit = the run's verdict."""
    if json_out:
        print_json(cs.to_record())
    else:
        show(render(cs))
    raise Exit(cs.exit_code)


def watch_across(inv: Inventory, first: Host, run: str | None, interval: float, json_out: bool,
                 exit_on_failure: bool) -> None:
    """`status --watch --cluster NAME` (or --host a,b): every node's stream at once; exit = the run's verdict."""
    from dflashctl.cli.live import watch_loop
    from dflashctl.commands import cluster_watch
    from dflashctl.commands.status import status_once
    from dflashctl.remote import connect

    with connect(first) as target:
        v = status_once(target, run, log_max=0)
    assert v.run is not None
    cluster = v.run.meta.cluster
    if cluster is None or not v.run.meta.members:
        raise ConfigError(f"run {v.run.id} on {first.name} is not a run across hosts",
                          hint=f"watch it alone: dflashctl status --watch {v.run.id} --host {first.name}")
    expected = len(v.run.meta.members or [])
    views = cluster_watch.watch_across(inv, first, cluster, v.run.id, connect, interval=interval)
    watch_loop(views, render, json_out, lambda cs: cluster_watch.settled(cs, expected, exit_on_failure))


def render(cs: ClusterStatus):  # noqa: ANN201 - a rich renderable
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NODE", "HOST", "VERDICT", "STEP", "THREADS", "GPUS", "NOTE"):
        table.add_column(col, no_wrap=col != "NOTE")
    for n in cs.nodes:
        if n.view is None:
            table.add_row(str(n.node_rank), n.host, "unreachable", "-", "-", "-", escape(n.error or ""))
            continue
        h = n.view.health
        step = h.progress.get("step")
        alive = sum(1 for t in h.threads if t.state == "running")
        gpus = ", ".join(f"{g.sample.index}:{g.sample.memory_used_mib or 0:.0f}MiB" for g in h.gpus) or "-"
        note = (h.reasons or [""])[0]
        if n.counted_as is not None and n.counted_as != h.verdict:  # a later node: rank 0 prints the steps
            note = f"{h.verdict} in its own log, which has no step lines (node 0's rank 0 prints them)"
        table.add_row(str(n.node_rank), n.host, str(n.counted_as or h.verdict), "-" if step is None else f"{step:g}",
                      f"{alive}/{len(h.threads)}" if h.threads else "-", gpus, escape(note)[:100])
    head = Text.from_markup(f"run [bold]{escape(cs.run_id)}[/] across {len(cs.nodes)} hosts (cluster "
                            f"{escape(str(cs.cluster.get('name')))}, rendezvous {cs.cluster.get('rendezvous')}): "
                            f"[bold]{cs.verdict}[/]")
    return Group(head, table, *(Text(f"  - {r}") for r in cs.reasons))


def stop_across(inv: Inventory, first_host: str, run_id: str, members: list[tuple[str, int]], grace: float,
                json_out: bool) -> None:
    from dflashctl.commands.cluster_runs import stop_all
    from dflashctl.remote import connect

    rows = stop_all(inv, inv.get(first_host), members, run_id, connect, grace)
    code = max(r.exit_code for r in rows)
    if json_out:
        print_json({"run": run_id, "nodes": [r.to_record() for r in rows], "exit_code": code})
        raise Exit(code)
    for r in rows:
        if r.result is not None:
            out(f"node {r.node_rank} {r.host}: stopped run {run_id} (pid {r.result.pid}): exit code "
                f"{r.result.exit_code}", markup=False)
        else:
            out(f"node {r.node_rank} {r.host}: {r.error}", markup=False)
    raise Exit(code)


def logs_across(inv: Inventory, first_host: str, run_id: str, members: list[tuple[str, int]], lines: int,
                json_out: bool) -> None:
    """Each node's tail, every line prefixed `[host] ` (`logs --node HOST` reads one node's alone, unprefixed)."""
    from dflashctl.commands.cluster_runs import tails
    from dflashctl.remote import connect

    got = tails(inv, inv.get(first_host), members, run_id, lines, connect)
    if json_out:
        print_json({"run": run_id, "nodes": [{"host": h, "error": e, **(t.to_record() if t else {})}
                                             for h, t, e in got]})
        return
    for host, tail, e in got:
        if tail is None:
            err(f"[bold red]ERROR:[/] {escape(host)}: {escape(e or '')}")
            continue
        sys.stdout.write("".join(f"[{host}] {ln}\n" for ln in tail.text.splitlines()))
    sys.stdout.flush()
    if any(t is None for _, t, _e in got):
        raise Exit(ExitCode.NOT_FOUND)


def zombies_across(inv: Inventory, cluster: Cluster, dry_run: bool, yes: bool, grace: float, json_out: bool,
                   zombie_table: Callable[..., Any]) -> None:
    """`kill-zombies --cluster NAME` / `--host a,b`: every host, each its own table (cli/runs.py's zombie_table)."""
    from dflashctl.commands import zombies as zombies_cmd
    from dflashctl.commands.cluster_runs import zombies_all
    from dflashctl.remote import connect

    if not dry_run and not yes:
        raise ConfigError("kill-zombies on several hosts needs --yes (or --dry-run to look first)")
    got = zombies_all(inv, [inv.get(h) for h in cluster.hosts], connect, dry_run=dry_run, grace_s=grace)
    failed = [h for h, _f, rep, _e in got if rep is not None and rep.failed]
    code = ExitCode.NOT_FOUND if any(e for *_x, e in got) else 1 if failed else 0
    if json_out:
        print_json({"hosts": [{"host": h, "error": e, **(zombies_cmd.record(f, dry_run=dry_run, report=rep)
                                                          if f is not None else {})} for h, f, rep, e in got],
                    "exit_code": int(code)})
        raise Exit(code)
    for host, found, rep, e in got:
        if found is None:
            err(f"[bold red]ERROR:[/] {escape(host)}: {escape(e or '')}")
        elif not found.to_kill:
            out(f"{host}: no zombies" + (f" (current run {found.current_run} is protected)"
                                         if found.current_run else ""), markup=False)
        else:
            out(f"{host}: {len(found.to_kill)} process(es) {'would be ended' if dry_run else 'ended'}", markup=False)
            show(zombie_table(rep.rows if rep else found.rows, outcome=rep is not None))
    raise Exit(code)
