"""The one typer app every verb module registers on (cli/__init__.py imports them all, in `--help` order)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="dflashctl",
    help="Deploy, launch and watch DFlash drafter training inside a Proxmox LXC container.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root() -> None:
    """Deploy, launch and watch DFlash drafter training inside a Proxmox LXC container."""
