"""Which processes are zombies of an earlier run, and which must be left alone (DESIGN §4): the pure decision
behind `kill-zombies`, from the probe's process list, the latest run and the host's GPU process list.

A zombie is a process of an *earlier* run (by its DFLASH_RUN_ID marker, never by command line), a defunct child
nobody reaps (we end its marked parent), or a process holding GPU memory that belongs to no live run. The current
run is never a zombie; a process without our marker is listed but never signalled unless the user names its pid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dflashctl.errors import ConfigError
from dflashctl.model import HostGpuReport, ProcRecord

KILL = "kill"
SKIP = "skip"


@dataclass
class ZombieRow:
    pid: int
    ppid: int
    state: str
    run_id: str | None
    age_s: float
    cmdline: str
    why: str
    action: str  # "kill" or "skip"
    starttime: int
    gpu_mib: float | None = None
    holds_gpu: bool = False
    outcome: str | None = None  # after kill: terminated | killed | survived | changed | gone-before | defunct

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ZombieScan:
    current_run: str | None  # the live latest run, protected
    rows: list[ZombieRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def to_kill(self) -> list[ZombieRow]:
        return [r for r in self.rows if r.action == KILL]

    def to_record(self) -> dict[str, Any]:
        return {"current_run": self.current_run, "zombies": [r.to_record() for r in self.rows], "notes": self.notes}


def classify(procs: list[ProcRecord], current: str | None, host_gpu: HostGpuReport | None = None,
             named_pids: tuple[int, ...] = (), known_runs: set[str] | None = None, *,
             protected: tuple[int, ...] = (), survivors: tuple[int, ...] = (),
             survivors_of: str | None = None) -> ZombieScan:
    """Pure decision: which of the probe's processes to end, and why (or why not).
    known_runs: run ids of this workspace; a marker naming another run belongs to another
    workspace (another user, another checkout) and is left alone. None: do not check. A process whose
    DFLASH_RUN_DIR is not this workspace's run directory of its id (`elsewhere`) is another workspace's too.
    protected: processes of the current run that carry no marker (an adopted run's process): never
    listed, never ended, even when named.
    survivors: processes of the tree of run survivors_of, whose end is recorded (a `stop` they outlived, a marked
    process planted after it; runstate.tree_left): ended, marked or not (an adopted run's children carry no marker)."""
    out = ZombieScan(current)

    def ours(p: ProcRecord | None) -> bool:
        """Of this workspace: a run id of it, and (where the process says) its run directory too; two
        workspaces can hold runs of the same id (same name, same second)."""
        return (p is not None and bool(p.run_id) and not p.elsewhere
                and (known_runs is None or p.run_id in known_runs))

    by_pid = {p.pid: p for p in procs}
    gpu_mib: dict[int, float] = {}
    if host_gpu is not None:
        if host_gpu.error:
            out.notes.append(f"host GPU processes unavailable: {host_gpu.error}")
        for hp in host_gpu.procs:
            if hp.in_container and hp.ns_pid is not None:
                gpu_mib[hp.ns_pid] = gpu_mib.get(hp.ns_pid, 0.0) + (hp.used_memory_mib or 0.0)
    named = set(named_pids)
    for pid in named:
        if pid not in by_pid:
            raise ConfigError(f"pid {pid} not found in the container", hint="list candidates with `dflashctl "
                              "kill-zombies --dry-run`")
    rows: dict[int, ZombieRow] = {}

    def add(p: ProcRecord, why: str, action: str) -> None:
        pid = p.pid
        if pid in rows:
            if action == KILL and rows[pid].action != KILL:
                rows[pid].action, rows[pid].why = KILL, why
            return
        rows[pid] = ZombieRow(pid=pid, ppid=p.ppid, state=p.state, run_id=p.run_id, age_s=p.age_s,
                              cmdline=p.cmdline, why=why, action=action, starttime=p.starttime,
                              gpu_mib=gpu_mib.get(pid), holds_gpu=p.holds_gpu)

    for pid, p in sorted(by_pid.items()):
        marker = p.run_id
        if pid in survivors and p.state != "Z":
            add(p, f"survivor of run {survivors_of}'s process tree (the run has ended)", KILL)
            continue
        if pid in protected:
            if pid in named:
                raise ConfigError(f"pid {pid} is the process of the current run {current} (adopted)",
                                  hint=f"stop the run instead: dflashctl stop {current}")
            continue
        if p.state == "Z":
            parent = by_pid.get(p.ppid)
            pmark = parent.run_id if parent else None
            if parent is not None and ours(parent) and pmark != current:
                add(p, f"defunct child of pid {parent.pid} (earlier run {pmark}); ends with its parent", SKIP)
                add(parent, f"parent of defunct pid {pid}; earlier run {pmark}", KILL)
            elif parent is not None and ours(parent) and pmark == current:
                add(p, f"defunct child of the current run {current}; it reaps its own", SKIP)
            # else: a defunct child of someone else's process is not ours to report
            continue
        if marker and marker == current and ours(p):
            if pid in named:
                raise ConfigError(f"pid {pid} belongs to the current run {current}",
                                  hint=f"stop the run instead: dflashctl stop {current}")
            continue
        if marker and not ours(p):
            if pid in named:
                add(p, f"named with --pid (marker {marker} of another workspace)", KILL)
            elif p.holds_gpu or pid in gpu_mib:
                add(p, f"holds a GPU; run {marker} is not in this workspace: left alone", SKIP)
            continue
        if marker:
            add(p, f"earlier run {marker}" if current else f"run {marker}, which is not the live run", KILL)
            continue
        if pid in named:
            add(p, "named with --pid (no marker)", KILL)
            continue
        if p.holds_gpu or pid in gpu_mib:
            add(p, "holds a GPU but has no DFLASH_RUN_ID marker: left alone (name it with --pid)", SKIP)
    for pid in named - set(rows):
        p = by_pid[pid]
        if p.state != "Z":
            add(p, "named with --pid", KILL)
    out.rows = sorted(rows.values(), key=lambda r: (r.action != KILL, r.pid))
    return out
