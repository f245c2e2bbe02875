"""The whole GPU host at a glance (issue 29): each GPU, who holds it (container, pid in there, our run), and what
to do about what is wrong. Pure: the host probe's reply (agent/probe/hostgpus.py) and what the container says of
its runs in, records out.

The driver knows host pids only (it is not PID-namespace aware: nvidia-docker#179, lxd#9755), so the mapping is
done where those pids are real: /proc/PID/cgroup names the container (`/lxc/<CTID>/…` on Proxmox's cgroup v2,
`/lxc.payload.<CTID>/…` with LXC 4+'s default naming, `lxc/<CTID>` in v1 hierarchies), NSpid's last field is the
pid the container sees, DFLASH_RUN_ID names our run. A process's run role: `current` (the live run of this host's
workspace), `earlier` (a run of ours that is not the live one: a zombie, `kill-zombies` ends it), `other` (our
marker, but another container's or another workspace's run: only named), `none` (no marker: never touched).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflashctl.analysis.gpuhealth import gpu_health, health_findings
from dflashctl.analysis.gpus import GpuParseError, csv_number, csv_rows, from_probe, na
from dflashctl.analysis.gpuwindow import GpuSweep, Thresholds, judge_gpus
from dflashctl.analysis.layout import bare_uuid, uuid_index
from dflashctl.model import GpuFinding, GpuProcess, GpuSample, HostGpuProc, HostGpuReport, MiB
from dflashctl.report import parse_gpus

CURRENT, EARLIER, OTHER, NONE, GONE = "current", "earlier", "other", "none", "gone"
_CT_RE = re.compile(r"(?:^|/)lxc(?:\.payload)?[./]([^/\s.]+)(?:/|$)")


@dataclass(frozen=True)
class GpuApp:
    """One row of `nvidia-smi --query-compute-apps`: the pid as the driver knows it (the host's)."""

    pid: int
    process_name: str | None
    used_memory_mib: MiB | None
    gpu_uuid: str | None


def parse_apps(text: str) -> list[GpuApp]:
    """`--query-compute-apps` CSV with its header (any --format variant; `used_memory` and `used_gpu_memory` are
    one column). A process name holding commas is what is left between the pid on the left and the columns after
    it on the right (nvidia-smi does not quote). `[Not Found]`, `[N/A]` are None."""
    out: list[GpuApp] = []
    for line, cells, cols, _ in csv_rows(text, None, {"used_gpu_memory": "used_memory"}):
        if cols is None or "pid" not in cols:
            raise GpuParseError(f"compute-apps row without a header naming its columns: {line[:100]!r}")
        if len(cells) > len(cols) and "process_name" in cols:
            at = cols.index("process_name")
            extra = len(cells) - len(cols)
            cells = [*cells[:at], ", ".join(cells[at:at + extra + 1]), *cells[at + extra + 1:]]
        rec = dict(zip(cols, cells, strict=False))
        pid = csv_number(rec.get("pid"))
        if pid is None:
            raise GpuParseError(f"compute-apps row without a pid: {line[:100]!r}")
        out.append(GpuApp(int(pid), na(rec.get("process_name")), csv_number(rec.get("used_memory"), to_mib=True),
                          na(rec.get("uuid"))))
    return out


def container_of(cgroup: str) -> str | None:
    """The LXC container a process's /proc/PID/cgroup lines put it in (its id), or None (the host's own)."""
    for line in cgroup.splitlines():
        m = _CT_RE.search(line.split(":", 2)[-1])
        if m:
            return m.group(1)
    return None


@dataclass(frozen=True)
class Runs:
    """What the container (or the machine) says of its runs: the live one, and every run id of its workspace."""

    current: str | None = None
    known: frozenset[str] | None = None  # None: not known (every marker in our container counts as ours)


@dataclass
class HostProc:
    """One process holding a GPU, as seen from where the driver's pids are real."""

    pid: int  # the driver's (the host's, or this machine's where no container is involved)
    gpu: int | None
    gpu_uuid: str | None
    container: str | None  # CTID, or None: the host itself
    ns_pid: int | None  # the pid inside its container (None: not in one, or not known)
    user: str | None
    used_memory_mib: MiB | None
    cmdline: str
    run_id: str | None
    role: str  # current | earlier | other | none | gone
    remedy: str | None
    starttime: int | None = None

    @property
    def zombie(self) -> bool:
        return self.role == EARLIER

    def to_record(self) -> dict[str, Any]:
        return {"pid": self.pid, "gpu": self.gpu, "gpu_uuid": self.gpu_uuid, "container": self.container,
                "ns_pid": self.ns_pid, "user": self.user, "used_memory_mib": self.used_memory_mib,
                "cmdline": self.cmdline, "run_id": self.run_id, "run": self.role, "zombie": self.zombie,
                "remedy": self.remedy}


@dataclass
class HostGpu:
    sample: GpuSample
    finding: GpuFinding | None  # the usage finding over the window (gpuwindow.judge_gpus)
    health: list[str] = field(default_factory=list)  # health finding ids (gpuhealth.py), most severe first
    temperature_c: float | None = None
    procs: list[HostProc] = field(default_factory=list)
    remedy: str | None = None
    history: list[float | None] = field(default_factory=list)  # utilisation over the window

    @property
    def ours_mib(self) -> float:
        return sum(p.used_memory_mib or 0.0 for p in self.procs if p.role == CURRENT)

    @property
    def others_mib(self) -> float:
        return sum(p.used_memory_mib or 0.0 for p in self.procs if p.role != CURRENT)

    def to_record(self) -> dict[str, Any]:
        s = self.sample
        return {"index": s.index, "uuid": s.uuid, "name": s.name, "memory_used_mib": s.memory_used_mib,
                "memory_total_mib": s.memory_total_mib, "utilization_pct": s.utilization_pct, "power_w": s.power_w,
                "temperature_c": self.temperature_c, "finding": str(self.finding) if self.finding else None,
                "health": self.health, "remedy": self.remedy, "ours_mib": self.ours_mib,
                "others_mib": self.others_mib, "processes": [p.to_record() for p in self.procs]}


@dataclass
class HostView:
    host: str
    seen_from: str  # "host" (the Proxmox host: every container's processes) | "machine" (no container involved)
    #                 | "container" (only the container: the driver lists no processes here)
    container: str | None  # this host's container (ours)
    runs: Runs
    gpus: list[HostGpu] = field(default_factory=list)
    unplaced: list[HostProc] = field(default_factory=list)  # holders whose GPU nothing can tell (from a container)
    notes: list[str] = field(default_factory=list)  # what it could not see, and why
    time: float | None = None

    @property
    def procs(self) -> list[HostProc]:
        return [p for g in self.gpus for p in g.procs] + self.unplaced

    def to_record(self) -> dict[str, Any]:
        return {"schema": 1, "host": self.host, "seen_from": self.seen_from, "container": self.container,
                "current_run": self.runs.current, "time": self.time, "gpus": [g.to_record() for g in self.gpus],
                "unplaced": [p.to_record() for p in self.unplaced], "notes": self.notes}


def role_of(run_id: str | None, container: str | None, ours: str | None, runs: Runs) -> str:
    """A process's run role from its marker and container (ours: this host's container, None where none is)."""
    if not run_id:
        return NONE
    if container != ours:
        return OTHER
    if run_id == runs.current:
        return CURRENT
    if runs.known is not None and run_id not in runs.known:
        return OTHER  # a marker of another workspace in our container: another user's run
    return EARLIER


def remedy_of(role: str, container: str | None, ours: str | None, pid: int, ns_pid: int | None) -> str | None:
    where = f"container {container}" if container else "the Proxmox host itself"
    if role == EARLIER:
        return "a zombie of an earlier run: `dflashctl kill-zombies`"
    if role == CURRENT:
        return None
    if role == GONE:
        return f"pid {pid} is not visible from here (ended since nvidia-smi listed it, or in another PID namespace)"
    if container != ours or (container is None and ours is not None):
        return f"not ours: ask the owner of {where}" if container else f"not ours: a process of {where}; ask its admin"
    if role == OTHER:
        return "another workspace's run in this container: ask its owner"
    return f"no run of ours: end it yourself, or `dflashctl kill-zombies --pid {ns_pid or pid}` if you are sure"


def _proc(pid: int, gpu: int | None, uuid: str | None, mem: MiB | None, name: str | None,
          info: Mapping[str, Any] | None, ours: str | None, runs: Runs, seen_from: str) -> HostProc:
    if info is None:
        return HostProc(pid, gpu, uuid, None, None, None, mem, name or "", None, GONE,
                        remedy_of(GONE, None, ours, pid, None))
    container = container_of(str(info.get("cgroup") or "")) if seen_from != "container" else ours
    nspid = [int(x) for x in info.get("nspid") or () if isinstance(x, int)]
    ns_pid = nspid[-1] if nspid else None
    if seen_from != "container" and container is None:
        ns_pid = pid
    run_id = info.get("run_id") or None
    role = role_of(run_id, container, ours, runs)
    uid = info.get("uid")
    user = info.get("user") or (f"uid {uid}" if isinstance(uid, int) else None)
    return HostProc(pid, gpu, uuid, container, ns_pid, user, mem, str(info.get("cmdline") or name or ""), run_id,
                    role, remedy_of(role, container, ours, pid, ns_pid), info.get("starttime"))


def _gpu_remedy(g: HostGpu) -> str | None:
    if g.finding not in (GpuFinding.IDLE_ALLOCATED, GpuFinding.ORPHANED):
        return None
    roles = {p.role for p in g.procs}
    if EARLIER in roles:
        return "memory held by a zombie of an earlier run: `dflashctl kill-zombies`"
    if CURRENT in roles:
        return "the live run holds it at ≈0 %: `dflashctl status` says why, `dflashctl stacks` shows where it waits"
    others = sorted({p.container or "host" for p in g.procs if p.role in (OTHER, NONE)})
    if others:
        return "memory held at ≈0 % by " + " and ".join(
            f"container {c} (ask its owner)" if c != "host" else "a process of the Proxmox host (ask its admin)"
            for c in others)
    return "memory held at ≈0 % and no process listed for it"


def build_view(replies: Sequence[Mapping[str, Any]], *, host: str, ours: str | None, runs: Runs,
               seen_from: str, thresholds: Thresholds = Thresholds()) -> HostView:
    """The view from the host probe's replies (oldest first; a watch passes its recent ones, so the GPUs' findings
    look over the window), the last one naming the processes."""
    view = HostView(host, seen_from, ours, runs)
    if not replies:
        view.notes.append("no reading")
        return view
    last = replies[-1]
    view.time = csv_number(str(last.get("time"))) if last.get("time") is not None else None
    sweeps, report = [], None
    for doc in replies:
        rep = parse_gpus(doc.get("gpus") or {})
        samples, err = from_probe(rep)
        if samples:
            t = doc.get("time")
            sweeps.append(GpuSweep(float(t) if isinstance(t, (int, float)) else None, samples))
        report = rep
        if doc is last and err:
            view.notes.append(f"GPU readings: {err}")
    try:
        apps = parse_apps(last.get("apps_csv") or "")
    except GpuParseError as e:
        apps = []
        view.notes.append(f"GPU processes unreadable: {e}")
    if last.get("apps_error") and sweeps:
        view.notes.append(f"GPU processes: {last['apps_error']}")
    procs_info = last.get("procs") if isinstance(last.get("procs"), Mapping) else {}
    samples = sweeps[-1].samples if sweeps else ()
    by_uuid = uuid_index(samples)
    placed = [_proc(a.pid, by_uuid.get(bare_uuid(a.gpu_uuid or "")), a.gpu_uuid, a.used_memory_mib, a.process_name,
                    procs_info.get(str(a.pid)), ours, runs, seen_from) for a in apps]
    if last.get("holders") is not None:
        view.seen_from = "container" if seen_from != "host" else seen_from
        view.unplaced = [_proc(int(p), None, None, None, None, procs_info.get(str(p)), ours, runs, "container")
                         for p in last["holders"] if str(p).isdigit()]
        view.notes.append("the driver lists no processes here (inside a container it cannot map pids): processes "
                          "holding /dev/nvidia* are listed without their GPU or memory; other containers' and the "
                          "host's processes cannot be seen — reach the Proxmox host for the whole picture")
    zombie_apps = [GpuProcess(p.pid, p.used_memory_mib, p.gpu_uuid) for p in placed if p.zombie]
    judged = judge_gpus(sweeps, view.time, run_alive=None, thresholds=thresholds, gpu_processes=zombie_apps,
                        live_pids=frozenset())
    healths = {h.index: h for h in gpu_health(report)} if report is not None else {}
    findings = health_findings(healths.values()) if healths else []
    for st in judged:
        h = healths.get(st.index)
        g = HostGpu(st.sample, st.finding, [f.id for f in findings if f.gpu == st.index],
                    h.temperature_c if h is not None else None,
                    sorted((p for p in placed if p.gpu == st.index), key=lambda p: -(p.used_memory_mib or 0)),
                    history=st.history)
        g.remedy = _gpu_remedy(g)
        view.gpus.append(g)
    view.unplaced += [p for p in placed if p.gpu is None]
    return view


def share(view: HostView, indices: Iterable[int] | None = None) -> dict[int, tuple[float, float]]:
    """GPU index → (MiB held by the live run's processes, MiB held by every other process) on the host view, for
    the GPUs named (all where None): what `status` shows beside a run's GPUs."""
    wanted = None if indices is None else set(indices)
    return {g.sample.index: (g.ours_mib, g.others_mib) for g in view.gpus
            if wanted is None or g.sample.index in wanted}


def host_gpu_report(view: HostView, error: str | None = None) -> HostGpuReport:
    """The view as kill-zombies' classifier reads the host's GPU processes (analysis/zombies.py): this host's
    container's processes by the pid they have in there, every other one marked not in it."""
    procs = tuple(HostGpuProc(p.pid, p.ns_pid if p.container == view.container else None, p.used_memory_mib,
                              p.gpu_uuid, p.container == view.container)
                  for p in view.procs if p.role != GONE)
    return HostGpuReport(procs, error)


def _mib(p: HostProc) -> str:
    return f"{p.used_memory_mib:.0f} MiB" if p.used_memory_mib is not None else "memory unknown"


def named_elsewhere(view: HostView) -> list[str]:
    """One line per GPU process kill-zombies must name and never touch: another container's or the host's, with its
    pid in there, its host pid and its run (our own container's are its rows, by the pid they have in here)."""
    out = []
    for p in view.procs:
        gpu = f"GPU {p.gpu}" if p.gpu is not None else "a GPU"
        run = f"run {p.run_id}" if p.run_id else "no run of ours"
        if p.role == GONE or p.container == view.container:
            continue
        who = f"container {p.container} pid {p.ns_pid} (host pid {p.pid})" if p.container else \
            f"host pid {p.pid} on the Proxmox host"
        out.append(f"{gpu}: {who} holds {_mib(p)}, {run}: not touched; {p.remedy}")
    return out
