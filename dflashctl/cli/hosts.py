"""CLI verbs: `hosts` (the inventory as a table) and `hosts check` (is each host ready?)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dflashctl import bounds
from dflashctl.cli.app import app
from dflashctl.cli.common import Exit, HostsOpt, JsonOpt, console, error, escape, print_json

if TYPE_CHECKING:
    from dflashctl.model import Host

hosts_app = typer.Typer(
    help="The hosts inventory (hosts.toml): list it, or check that hosts are ready.",
    no_args_is_help=False,
    add_completion=False,
)
app.add_typer(hosts_app, name="hosts")


@app.command("version")
def version() -> None:
    """Print the dflashctl version."""
    from dflashctl import __version__

    print(__version__)


def _gpus(host: Host) -> str:
    if not host.gpus_target and not host.gpus_drafters:
        return "cpu"
    fmt = ",".join
    return f"target {fmt(map(str, host.gpus_target)) or '-'} / drafters {fmt(map(str, host.gpus_drafters)) or '-'}"


@hosts_app.callback(invoke_without_command=True)
def hosts_list(ctx: typer.Context, hosts: Path | None = HostsOpt, json_out: bool = JsonOpt) -> None:
    """List the hosts of the inventory (the default one is marked *)."""
    from rich.table import Table

    from dflashctl.config import load_inventory

    ctx.obj = hosts
    if ctx.invoked_subcommand is not None:
        return
    inv = load_inventory(hosts)
    if json_out:
        print_json(inv.to_record())
        return
    table = Table(title=f"hosts from {inv.source}", title_justify="left", title_style="")
    for col in ("", "NAME", "TRANSPORT", "ADDRESS", "CONTAINER", "WORKSPACE", "PYTHON", "GPUS"):
        table.add_column(col, overflow="fold")
    for name in inv.names():
        h = inv.hosts[name]
        cells = (name, h.transport, h.endpoint, str(h.container) if h.container is not None else "-",
                 h.workspace, h.python, _gpus(h))
        table.add_row("*" if name == inv.default else "", *map(escape, cells))
    console.print(table)


_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


@hosts_app.command("check")
def hosts_check(
    ctx: typer.Context,
    names: list[str] | None = typer.Argument(None, metavar="HOST", help="hosts to check (default: all)"),
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
    timeout: float = typer.Option(60.0, "--timeout", callback=bounds.option(bounds.TIMEOUT_S),
                                  help="seconds allowed for each host's checks"),
) -> None:
    """Connect to each host and check: container running, python, nvidia-smi + GPUs, the container's /dev/nvidia*
    and driver against the Proxmox host's, workspace, disk, py-spy (can it attach).

    Exit 0 only when every check passes (warnings pass). Hosts are checked concurrently."""
    from rich.table import Table

    from dflashctl.commands.hosts import check_exit_code, check_hosts, check_record
    from dflashctl.config import load_inventory

    inv = load_inventory(hosts or ctx.obj)
    selected = [inv.get(n) for n in names] if names else [inv.hosts[n] for n in inv.names()]
    reports = check_hosts(selected, timeout=timeout)
    code = check_exit_code(reports)
    if json_out:
        print_json(check_record(reports))
        raise Exit(code)
    table = Table(title=f"hosts check ({inv.source})", title_justify="left", title_style="")
    for col in ("HOST", "CHECK", "RESULT", "DETAIL"):
        table.add_column(col, overflow="fold")
    for r in reports:
        for i, c in enumerate(r.checks):
            table.add_row(r.host.name if i == 0 else "", c.name, f"[{_STYLE[c.status]}]{c.status}[/]",
                          escape(c.detail))
        table.add_section()
    console.print(table)
    ready = sum(r.ok for r in reports)
    console.print(f"{ready}/{len(reports)} host{'s' if len(reports) != 1 else ''} ready")
    for r in reports:
        if r.error is not None:
            error(r.error.message, hint=r.error.hint)
        else:
            for c in r.problems():
                error(f"host {r.host.name}: {c.name}: {c.detail}")
    raise Exit(code)


@hosts_app.command("disconnect")
def hosts_disconnect(
    ctx: typer.Context,
    names: list[str] | None = typer.Argument(None, metavar="HOST", help="hosts whose ssh master to end (default: all)"),
    hosts: Path | None = HostsOpt,
) -> None:
    """End the background ssh connection masters (all of yours, or those of HOST). Exit 0 also when none runs."""
    from dflashctl.commands.hosts import disconnect
    from dflashctl.config import load_inventory

    selected = [load_inventory(hosts or ctx.obj).get(n) for n in names] if names else None
    ended = disconnect(selected)
    for m in ended:
        console.print(f"ended the ssh master for {escape(m.host)} ({escape(m.endpoint)}, pid {m.pid})")
    if not ended:
        console.print("no ssh master was running" + (f" for {', '.join(map(escape, names))}" if names else ""))
