"""A run across hosts as a whole: status per node and the run's verdict, stop on every node, logs by node.

A node's run dir records its cluster (meta.json `cluster`: members, node ranks, rendezvous), so any command that
reads one node's run finds the others. Every node is asked at once (fan_out: one connection per host, a deadline
each), and a node that does not answer is a row saying so, never a hang.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.safe_names import MalformedReply, safe_name
from dflashctl.commands import logs as logs_cmd
from dflashctl.commands import stop as stop_cmd
from dflashctl.commands import zombies as zombies_cmd
from dflashctl.commands.fanout import fan_out
from dflashctl.commands.runlookup import runs_dir
from dflashctl.commands.status import StatusView, status_once
from dflashctl.config import Inventory
from dflashctl.errors import ConfigError, DflashError, ExitCode
from dflashctl.model import Cluster, Host, Verdict
from dflashctl.remote import agentcall
from dflashctl.remote.target import Target

NODE_DEADLINE_S = 60.0
# The run's verdict is its worst node's: most in need of a person first (a tie keeps node order).
SEVERITY = (Verdict.FINISHED, Verdict.TRAINING, Verdict.STARTING, Verdict.STOPPED, Verdict.DEGRADED,
            Verdict.STALLED, Verdict.LOST, Verdict.CRASHED)
_RANK_FAILED = re.compile(r"\brank (\d+) ")


@dataclass
class NodeRow:
    host: str
    node_rank: int
    view: StatusView | None = None
    error: str | None = None
    exit_code: int = 0
    counted_as: Verdict | None = None  # what this node adds to the run's verdict (judge(): a later node `starting`)
    final: bool = False  # an error row that will not change: its run, container or host is gone, or it cannot be named

    @property
    def verdict(self) -> Verdict | None:
        return None if self.view is None else self.view.health.verdict

    def to_record(self) -> dict[str, Any]:
        if self.view is None:
            return {"host": self.host, "node_rank": self.node_rank, "error": self.error, "exit_code": self.exit_code}
        return {"node_rank": self.node_rank, "error": None, **self.view.to_record(),
                "counted_as": None if self.counted_as is None else str(self.counted_as)}


@dataclass
class ClusterStatus:
    run_id: str
    cluster: dict[str, Any]  # meta.json `cluster` of the node that was asked first
    nodes: list[NodeRow]
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    failed_node: str | None = None  # the host whose rank failed first, where a node names it

    @property
    def exit_code(self) -> int:
        """The verdict's; a node that did not answer beside a run not failing: its code (102 unreachable)."""
        if self.verdict.is_failure:
            return self.verdict.exit_code
        return max([self.verdict.exit_code, *(n.exit_code for n in self.nodes if n.view is None)])

    def to_record(self) -> dict[str, Any]:
        """`status --json` of a run across hosts: the whole run, then `nodes` (each a one-host status record)."""
        return {"run": self.run_id, "cluster": self.cluster.get("name"), "rendezvous": self.cluster.get("rendezvous"),
                "verdict": str(self.verdict), "reasons": self.reasons, "failed_node": self.failed_node,
                "exit_code": self.exit_code, "nodes": [n.to_record() for n in self.nodes]}


def _each_node(inv: Inventory, first: Host, member_list: list[tuple[str, int]], call: Callable[[Target], Any],
               connect: Callable[[Host], Target]) -> list[tuple[str, int, Any, DflashError | None]]:
    """call(target) on every member's host at once: (host, node_rank, result, error) in node order."""
    def one(m: tuple[str, int]) -> tuple[str, int, Any, DflashError | None]:
        name, rank = m
        try:  # the members come from a container's meta.json: a name, not a path or an escape sequence
            safe_name(name, "cluster member host name", first.name)
        except MalformedReply as e:
            return repr(name)[:40], rank, None, e
        host = first if name == first.name else inv.hosts.get(name)
        if host is None:
            return name, rank, None, DflashError(f"host {name} is not in {inv.source}", exit_code=ExitCode.NOT_FOUND)
        try:
            with connect(host) as t:
                return name, rank, call(t), None
        except DflashError as e:
            return name, rank, None, e

    def late(m: tuple[str, int], seconds: float) -> tuple[str, int, Any, DflashError | None]:
        return m[0], m[1], None, DflashError(f"host {m[0]}: no answer within {seconds:g} s",
                                             exit_code=ExitCode.NOT_FINISHED)

    return fan_out(member_list, one, late, deadline_s=NODE_DEADLINE_S)


def cluster_status(inv: Inventory, first: StatusView, connect: Callable[[Host], Target]) -> ClusterStatus:
    """Every node's status (the first one's view reused), judged as one run: the path when only the first host is
    given (its meta.json names the others, a second round asks them)."""
    assert first.run is not None
    meta = first.run.meta
    run_id = safe_name(first.run.id, "run id", first.host)
    others = [m for m in meta.members or [] if m[0] != first.host]
    rows = _rows(_each_node(inv, inv.hosts.get(first.host) or Host(first.host), others,
                            lambda t: status_once(t, run_id), connect))
    own = next((r for h, r in meta.members or [] if h == first.host), 0)
    rows = sorted([NodeRow(first.host, own, first), *rows], key=lambda r: r.node_rank)
    return judge(run_id, meta.cluster or {}, rows)


def status_of(inv: Inventory, cluster: Cluster, run: str | None,
              connect: Callable[[Host], Target]) -> ClusterStatus:
    """`status --cluster NAME` / `--host a,b`: the members are known, so every node is asked in one round. The
    run's meta.json still decides: members other than the ones given are asked as the first host's run names them
    (cluster_status), and without a RUN a node whose latest run is another is asked again for node 0's."""
    asked = [(h, i) for i, h in enumerate(cluster.hosts)]
    got = _each_node(inv, inv.get(cluster.hosts[0]), asked, lambda t: status_once(t, run), connect)
    lead = next((v for _h, _r, v, e in got if e is None), None)
    if lead is None:
        raise next(e for *_x, e in got if e is not None)  # no node answered: the first one's one-line error
    assert lead.run is not None
    if lead.run.meta.members is None:
        raise ConfigError(f"run {lead.run.id} on {lead.host} is not a run across hosts",
                          hint=f"ask it alone: dflashctl status {lead.run.id} --host {lead.host}")
    if sorted(lead.run.meta.members or []) != sorted(asked):
        return cluster_status(inv, lead, connect)
    run_id = safe_name(lead.run.id, "run id", lead.host)
    again = [(h, r) for h, r, v, e in got if e is None and v.run is not None and v.run.id != run_id]
    redo = {h: (h, r, v, e) for h, r, v, e in _each_node(inv, inv.get(cluster.hosts[0]), again,
                                                         lambda t: status_once(t, run_id), connect)}
    rows = _rows([redo.get(h, (h, r, v, e)) for h, r, v, e in got])
    return judge(run_id, lead.run.meta.cluster or {}, sorted(rows, key=lambda x: x.node_rank))


def _rows(got: list[tuple[str, int, Any, DflashError | None]]) -> list[NodeRow]:
    return [NodeRow(name, rank, view) if e is None else NodeRow(name, rank, error=e.message, exit_code=int(e.exit_code))
            for name, rank, view, e in got]


def judge(run_id: str, cluster: dict[str, Any], rows: list[NodeRow]) -> ClusterStatus:
    """The run's verdict: the worst node's. Nodes other than 0 print no step lines (rank 0 logs), so one of them
    alive and `starting` counts as node 0's live verdict. The node that failed first is the one whose own log holds
    a thread's traceback (the others only report that a peer ended: torchrun's summary, the abort line), else the one
    a node's root cause names as `rank R …` (rank R runs on node R // nproc_per_node), else the first failing node."""
    nproc = int(cluster.get("nproc_per_node") or 1)
    lead = next((r.verdict for r in rows if r.node_rank == 0 and r.verdict is not None), None)

    def counted(r: NodeRow) -> Verdict:
        v = r.verdict
        assert v is not None
        if v == Verdict.STARTING and r.node_rank > 0 and lead is not None and not lead.is_terminal:
            return lead
        return v

    judged = [r for r in rows if r.view is not None]
    for r in judged:
        r.counted_as = counted(r)
    verdict = max((counted(r) for r in judged), key=SEVERITY.index, default=Verdict.LOST)
    failed: str | None = None
    if verdict.is_failure:
        failed = next((r.host for r in judged if _own_crash(r)), None)
        for r in judged if failed is None else ():
            m = _RANK_FAILED.search(f"{r.view.health.root_cause or ''} ")  # type: ignore[union-attr]
            failed = next((x.host for x in rows if m and x.node_rank == int(m.group(1)) // nproc), None)
            if failed:
                break
        failed = failed or next((r.host for r in judged if counted(r) == verdict), None)
    reasons = [f"node {failed} failed first" + _cause(rows, failed)] if failed else []
    for r in rows:
        if r.view is None:
            reasons.append(f"{r.host} (node {r.node_rank}): {r.error}")
        elif r.verdict == verdict and r.view.health.reasons and (r.host == failed or not verdict.is_failure):
            reasons.append(f"{r.host} (node {r.node_rank}): {r.view.health.reasons[0]}")
    return ClusterStatus(run_id, cluster, rows, verdict, reasons, failed)


def _own_crash(r: NodeRow):  # noqa: ANN202 - the first thread of this node that crashed with its own exception
    return next((t for t in r.view.health.threads if t.state == "crashed" and t.exception), None) if r.view else None


def _cause(rows: list[NodeRow], host: str) -> str:
    row = next((r for r in rows if r.host == host), None)
    t = _own_crash(row) if row else None
    if t is not None:
        return f" ({t.name}: {t.exception}: {t.message})" if t.message else f" ({t.name}: {t.exception})"
    cause = row.view.health.root_cause if row and row.view else None
    return f" ({cause})" if cause else ""


@dataclass
class NodeStop:
    host: str
    node_rank: int
    result: stop_cmd.StopResult | None = None
    error: str | None = None
    exit_code: int = int(ExitCode.STOPPED)

    def to_record(self) -> dict[str, Any]:
        return {"host": self.host, "node_rank": self.node_rank, "error": self.error,
                **(self.result.to_record() if self.result else {})}


def stop_all(inv: Inventory, first: Host, member_list: list[tuple[str, int]], run_id: str,
             connect: Callable[[Host], Target], grace_s: float) -> list[NodeStop]:
    """`stop RUN` of a run across hosts: every node at once. Each live node is marked stopped by the user before
    any node is signalled (a node whose workers end because a peer's did, before its own stop arrives, reads as
    stopped, not crashed). A node already ended is reported, not an error."""
    safe_name(run_id, "run id", first.name)  # it names a directory on every node
    _each_node(inv, first, member_list, lambda t: _mark_stopped(t, run_id), connect)
    out = []
    for name, rank, res, e in _each_node(inv, first, member_list,
                                         lambda t: stop_cmd.stop(t, run_id, grace_s=grace_s), connect):
        if isinstance(e, stop_cmd.NotRunning):
            out.append(NodeStop(name, rank, error=e.message, exit_code=int(ExitCode.STOPPED)))
        elif e is not None:
            out.append(NodeStop(name, rank, error=e.message, exit_code=int(e.exit_code)))
        else:
            out.append(NodeStop(name, rank, res))
    return out


def _mark_stopped(t: Target, run_id: str) -> None:
    """The reaper's `stopped` marker alone, on a node whose run is alive (agent/reaper.py mark)."""
    agentcall.call(t, "mark", {"run_dir": f"{runs_dir(t.host.workspace)}/{run_id}", "run_id": run_id})


def tails(inv: Inventory, first: Host, member_list: list[tuple[str, int]], run_id: str, lines: int,
          connect: Callable[[Host], Target]) -> list[tuple[str, logs_cmd.LogTail | None, str | None]]:
    """`logs RUN` of a run across hosts: each node's tail, (host, tail, error) in node order."""
    safe_name(run_id, "run id", first.name)
    return [(name, tail, None if e is None else e.message) for name, _r, tail, e in
            _each_node(inv, first, member_list, lambda t: logs_cmd.tail(t, run_id, lines), connect)]


def zombies_all(inv: Inventory, hosts: list[Host], connect: Callable[[Host], Target], *, dry_run: bool,
                grace_s: float = 10.0) -> list[tuple[str, zombies_cmd.ZombieScan | None, zombies_cmd.KillReport | None,
                                                     str | None]]:
    """`kill-zombies --cluster`: on every host at once, each scanned and (unless dry_run) cleaned on its own
    connection; (host, scan, kill report, error) in host order."""
    def one(t: Target) -> tuple[zombies_cmd.ZombieScan, zombies_cmd.KillReport | None]:
        found = zombies_cmd.scan(t)
        return found, None if dry_run or not found.to_kill else zombies_cmd.kill(t, found, grace_s=grace_s)

    return [(name, *(res or (None, None)), None if e is None else e.message) for name, _r, res, e in
            _each_node(inv, hosts[0], [(h.name, i) for i, h in enumerate(hosts)], one, connect)]
