"""kill-zombies: read what an earlier run left behind (one probe, and the host's GPU process list), let
analysis/zombies.py decide, and end the chosen processes safely: before any signal the pid's start time and
marker are checked again in the container (pid reuse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.zombies import KILL, ZombieRow, ZombieScan, classify
from dflashctl.commands import gpuzombies
from dflashctl.remote import agentcall, probe
from dflashctl.remote.target import Target


def scan(target: Target, named_pids: tuple[int, ...] = ()) -> ZombieScan:
    """One probe (processes, latest run) plus, on a container host, the host's GPU process list."""
    host_gpu, elsewhere = gpuzombies.host_gpu(target)  # the one host mapping of `gpus` (issue 29)
    on_gpu = tuple(p.ns_pid for p in host_gpu.procs if p.in_container and p.ns_pid is not None)
    doc = probe.probe_once(target, target.host.workspace, "latest", procs=True, gpus=False, log_max=0,
                           pids=tuple(named_pids) + on_gpu, require_run=False)
    run = doc.run
    left = tuple(int(s["pid"]) for s in run.survivors) if run else ()
    ended = run is not None and run.exit_code is not None and bool(left)  # its end recorded, its tree not gone
    current = run.id if run and run.alive and not ended else None
    adopted = run.meta.adopted_identity if run and current else None
    protected = (int(adopted["pid"]),) if adopted and isinstance(adopted.get("pid"), int) else ()
    if current and left:  # an adopted run whose process is gone while its tree lives on: still the current run
        protected += left
    procs = list(doc.procs)
    missing = tuple(p for p in left if p not in {x.pid for x in procs})
    if ended and missing:  # unmarked (an adopted run's children): the probe lists them only when asked
        procs += [p for p in probe.probe_once(target, target.host.workspace, "latest", procs=True, gpus=False,
                                              log_max=0, pids=missing, require_run=False).procs
                  if p.pid in missing]
    found = classify(procs, current, host_gpu, named_pids, set(doc.run_ids), protected=protected,
                    survivors=left if ended else (), survivors_of=run.id if ended and run else None)
    found.notes += elsewhere  # other containers' and the host's GPU processes: named, never touched
    return found


@dataclass
class KillReport:
    rows: list[ZombieRow]
    cache_removed: list[str] = field(default_factory=list)  # half-written compile-cache artefacts of those ended

    # "changed": the pid now belongs to another process, so the one we listed is gone; "defunct": dead,
    # holding nothing, waiting only to be reaped.
    ENDED = ("terminated", "killed", "gone-before", "changed", "defunct")

    @property
    def ended(self) -> list[ZombieRow]:
        return [r for r in self.rows if r.action == KILL and r.outcome in self.ENDED]

    @property
    def failed(self) -> list[ZombieRow]:
        return [r for r in self.rows if r.action == KILL and r.outcome not in self.ENDED]


def kill(target: Target, found: ZombieScan, grace_s: float = 10.0) -> KillReport:
    """SIGTERM, grace, SIGKILL, verified, for the rows marked kill; the rest are untouched."""
    victims = found.to_kill
    removed: list[str] = []
    if victims:
        spec = {"targets": [{"pid": r.pid, "starttime": r.starttime, "marker": r.run_id} for r in victims],
                "grace_s": grace_s}
        res = agentcall.call(target, "kill", spec, timeout=grace_s + 60)
        outcomes = res.get("results") or {}
        for r in victims:
            o = outcomes.get(str(r.pid)) or {"outcome": "unknown"}
            r.outcome = o.get("outcome")
        removed = [str(p) for p in res.get("cache_removed") or []]
    return KillReport(found.rows, removed)


def record(found: ZombieScan, *, dry_run: bool, report: KillReport | None = None) -> dict[str, Any]:
    """`kill-zombies --json`: what was found, and, after a kill, how many ended and how many survived."""
    doc = {**found.to_record(), "dry_run": dry_run, "ended": len(report.ended) if report else 0}
    if report is not None:
        doc["failed"] = len(report.failed)
        doc["cache_removed"] = report.cache_removed
    return doc
