"""`status --watch` of a run across hosts: every node's streaming probe at once, merged into one judged view.

One thread per node runs commands/status.py `watch` (one connection per host, its reconnects and backoff included);
each view a node reports is put on one queue, and every time one arrives the run is judged again as a whole
(cluster_runs.judge). A node that cannot be reached at all is a row saying so, retried every few seconds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from dflashctl.analysis.safe_names import MalformedReply, safe_name
from dflashctl.commands import status as status_cmd
from dflashctl.commands.cluster_runs import ClusterStatus, NodeRow, judge
from dflashctl.config import Inventory
from dflashctl.errors import DflashError, ExitCode
from dflashctl.model import Host
from dflashctl.remote.target import Target
from dflashctl.report import RunMeta

RETRY_S = 3.0  # a node that could not be watched at all is tried again this often


def watch_across(inv: Inventory, first: Host, cluster: dict[str, Any], run_id: str,
                 connect: Callable[[Host], Target], *, interval: float = 1.0) -> Iterator[ClusterStatus]:
    """A ClusterStatus each time any node reports (the caller stops by closing the iterator)."""
    members = RunMeta(cluster=cluster).members or []
    reports: queue.SimpleQueue[NodeRow] = queue.SimpleQueue()
    stop = threading.Event()

    def pump(name: str, rank: int) -> None:
        try:  # a member's name comes from a container's meta.json: a plain name, or that node is an error row
            safe_name(name, "cluster member host name", first.name)
        except MalformedReply as e:
            reports.put(NodeRow(repr(name)[:40], rank, error=e.message, exit_code=int(e.exit_code), final=True))
            return
        host = first if name == first.name else inv.hosts.get(name)
        while not stop.is_set():
            if host is None:
                reports.put(NodeRow(name, rank, error=f"host {name} is not in {inv.source}",
                                    exit_code=int(ExitCode.NOT_FOUND), final=True))
                return
            views = status_cmd.watch(lambda h=host: connect(h), run_id, interval=interval)
            try:
                for v in views:
                    if v.gone:  # its run directory, container or host is gone: that node's watch is over
                        reports.put(NodeRow(name, rank, error=v.gone_why, exit_code=v.exit_code, final=True))
                        return
                    reports.put(NodeRow(name, rank, v))
                    if stop.is_set() or (v.health.verdict.is_terminal and not v.settling):
                        return
            except DflashError as e:
                reports.put(NodeRow(name, rank, error=e.message, exit_code=int(e.exit_code)))
            finally:
                views.close()
            stop.wait(RETRY_S)

    for name, rank in members:
        threading.Thread(target=pump, args=(name, rank), name=f"watch-{name}", daemon=True).start()
    rows: dict[str, NodeRow] = {}
    try:
        while True:
            try:
                row = reports.get(timeout=interval * 5)
            except queue.Empty:
                continue
            rows[row.host] = row
            yield judge(run_id, cluster, sorted(rows.values(), key=lambda r: r.node_rank))
    finally:
        stop.set()


def settled(cs: ClusterStatus, expected: int, exit_on_failure: bool) -> bool:
    """Whether a watch can end: every node reported and ended — its run over, or its watch over for good (run,
    container or host gone: it will never report again) — or, with --exit-on-failure, the run failed. A node that
    could not be reached this time is retried, so it keeps the watch open."""
    if len(cs.nodes) < expected or any(n.view is not None and (n.view.settling or n.view.reconnecting)
                                       for n in cs.nodes):
        return False
    if exit_on_failure and cs.verdict.is_failure:
        return True
    return all(n.final if n.view is None else n.view.health.verdict.is_terminal for n in cs.nodes)
