"""status's share of the host view (issue 29): the memory the run's own processes hold on each GPU against what
every other process holds there: the GPU host's compute apps (read on the Proxmox host with the kernel log's Xid
lines, in one interpreter) placed on the probe's own GPU reading (remote/probe.py StatusFetch)."""

from __future__ import annotations

from typing import Any

from dflashctl.analysis.hostgpus import Runs, share
from dflashctl.commands import gpus
from dflashctl.remote.target import Target


def share_of(target: Target, doc: dict[str, Any] | None, run_id: str | None) -> dict[int, tuple[float, float]] | None:
    """GPU index → (MiB of run_id's processes, MiB of all others); doc: a host probe reply's shape (StatusFetch).
    None when the host could not be read (doc None: missing, failed, or still reading when the host half answered)
    or lists no process (nothing to split)."""
    if doc is None or not doc.get("apps_csv"):
        return None
    view = gpus.view_of(target, [doc], Runs(run_id, None))
    return share(view) if any(g.procs for g in view.gpus) else None
