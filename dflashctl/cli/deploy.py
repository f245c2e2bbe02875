"""CLI verb: deploy (ship a code tree into <workspace>/code, or only check whether it is current)."""

from __future__ import annotations

from pathlib import Path

import typer

from dflashctl import bounds
from dflashctl.cli.app import app
from dflashctl.cli.common import Exit, HostOpt, HostsOpt, JsonOpt, open_target, out, print_json


@app.command("deploy")
def deploy(
    check: bool = typer.Option(False, "--check", help="only say whether the deployed code matches (exit 1 if not)"),
    force: bool = typer.Option(False, "--force", help="send the tree even when the hashes match"),
    source: Path | None = typer.Option(
        None, "--source", metavar="DIR",
        help="the directory to ship: its files land in <workspace>/code/ (a `trainer` package: in code/trainer/); "
             "default: the host's code_source, else the trainer installed with dflashctl"),
    max_file_mib: float | None = typer.Option(None, "--max-file-mib", metavar="MIB",
                                              callback=bounds.option(bounds.SIZE_MIB),
                                              help="refuse a file bigger than this (default: code_max_file_mib, 50)"),
    max_total_mib: float | None = typer.Option(None, "--max-total-mib", metavar="MIB",
                                               callback=bounds.option(bounds.SIZE_MIB),
                                               help="refuse a tree bigger in all (default: code_max_total_mib, 200)"),
    host: str | None = HostOpt,
    hosts: Path | None = HostsOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Ship a directory (yours, or our trainer/) into <workspace>/code (atomic swap; nothing sent when unchanged)."""
    from dflashctl.commands import deploy as deploy_cmd

    with open_target(hosts, host) as target:
        where = target.host.label
        limits = deploy_cmd.Limits.of(target.host, max_file_mib, max_total_mib)
        if check:
            st = deploy_cmd.check(target, source, limits=limits)
            if json_out:
                print_json(st.to_record(target.host.name))
            elif st.current:
                out(f"code on {where} is current ({st.local_hash[:12]})")
            elif st.remote_hash is None:
                out(f"no code deployed on {where} (local {st.local_hash[:12]})")
            elif st.remote_hash == st.local_hash:
                out(f"code on {where} is stale: same files, but recorded as "
                    f"{(st.recorded_hash or 'nothing')[:12]} (an older deploy); `dflashctl deploy` rewrites it")
            else:
                edited = " (edited in place)" if st.recorded_hash == st.local_hash else ""
                out(f"code on {where} is stale{edited}: deployed {st.remote_hash[:12]}, local {st.local_hash[:12]}")
            raise Exit(0 if st.current else 1)
        res = deploy_cmd.deploy(target, source, force=force, limits=limits)
        if json_out:
            print_json(res.to_record(target.host.name))
        elif res.changed:
            label = res.source.label if res.source else "trainer"
            out(f"deployed {label} {res.hash[:12]} ({res.files} files, {res.bytes_sent / 1024:.1f} KiB) "
                f"to {where}:{res.path} in {res.seconds:.1f}s", markup=False)
        else:
            out(f"code on {where} is current ({res.hash[:12]}); nothing sent")
