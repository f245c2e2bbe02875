"""The probe's report as typed records, parsed once where the reply arrives (probe.py).

The probe (agent/probe/main.py) replies with one JSON dict; commands read these records instead, so every missing
or malformed value is decided here, once: a number that is not one is None, a flag is a bool, a missing list is
empty, the log's bytes are decoded. The fields are the probe's (see probe.py's docstring for their meaning).
GPU readings stay as sent (model.GpuReport): analysis/gpus.py `from_probe` is the one reader of nvidia-smi text.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflashctl.agent.lib.frame import PROBE_VERSION
from dflashctl.agent.lib.runmeta import RunMeta, as_float, as_int, as_str
from dflashctl.errors import RemoteFailed
from dflashctl.model import GpuReport, HostGpuProc, HostGpuReport, ProcRecord

if TYPE_CHECKING:
    from dflashctl.agent.lib.flightrec import Behind

__all__ = ["DiskReport", "FlightRecorderReport", "LogChunk", "ProbeReport", "RankLayout", "RunMeta", "RunRecord",
           "check_version", "parse_flight_recorder", "parse_gpus", "parse_host_gpu", "parse_layout", "parse_proc",
           "parse_report", "parse_run"]


@dataclass(frozen=True)
class RunRecord:
    """One run directory's state (agent/lib/runstate.py run_state). meta is meta.json as its one typed record
    (agent/lib/runmeta.py); heartbeat and errors are the trainer's own files, kept as the JSON they are (None where
    the file is absent or not an object)."""

    id: str
    dir: str
    pid: int | None
    alive: bool
    exit_code: int | None
    stopped: bool
    meta: RunMeta = field(default_factory=RunMeta)
    heartbeat: dict[str, Any] | None = None
    errors: dict[str, Any] = field(default_factory=dict)  # errors/<thread>.json by thread
    ending: bool = False  # alive, but the trainer is gone: its supervisor is reaping the group
    supervisor_pid: int | None = None
    ended_at: float | None = None  # mtime of exit_code (container clock)
    log_size: int | None = None  # with --runs
    log_tail: bytes = b""  # with --runs: the log's last bytes, for its last step
    stopped_by: dict[str, Any] | None = None  # the `stopped` marker: who stopped the run, and why
    events_tail: bytes = b""  # with --runs: the end of its events.jsonl, for its last event
    restart: dict[str, Any] | None = None  # restart.json: the sentinel asked for another attempt (attempt, why)
    survivors: tuple[dict[str, Any], ...] = ()  # {pid, cmdline} of its tree alive after its end (runstate tree_left)

    def __post_init__(self) -> None:
        if not isinstance(self.meta, RunMeta):  # a meta.json doc (or None) given as it was read
            object.__setattr__(self, "meta", RunMeta.from_record(self.meta))

    @property
    def log_path(self) -> str:
        return f"{self.dir}/train.log"

    def duration_s(self, now: float | None) -> float | None:
        """How long it ran (runs) or has been running (alive), by the container's clock."""
        start = self.meta.started_at_epoch
        if start is None or now is None:
            return None
        end = now if self.alive or self.ended_at is None else self.ended_at
        return max(0.0, end - start)

    def to_record(self, *, verdict: str | None = None, now: float | None = None, last_step: int | None = None,
                  last_event: dict[str, Any] | None = None) -> dict[str, Any]:
        """THE JSON shape of a run: `runs --json` (each run) and `status --json` (its `run`). Every key is
        always there; what the caller did not judge (verdict, last step, last event) is null."""
        m = self.meta
        return {"id": self.id, "name": m.name, "kind": m.kind, "dir": self.dir, "log_path": self.log_path,
                "pid": self.pid, "alive": self.alive, "ending": self.ending, "exit_code": self.exit_code,
                "stopped": self.stopped, "stopped_by": self.stopped_by, "verdict": verdict,
                "started_at": m.started_at, "duration_s": self.duration_s(now), "last_step": last_step,
                "attempt": m.attempt, "restart_of": m.restart_of, "chain": m.chain, "last_event": last_event,
                "survivors": [dict(s) for s in self.survivors]}


@dataclass(frozen=True)
class LogChunk:
    """train.log bytes from `offset` (a rotated or truncated file is read again from 0)."""

    path: str | None
    size: int
    inode: int | None
    mtime: float | None  # when the log last grew
    offset: int
    next_offset: int
    data: bytes
    rotated: bool = False

    @property
    def drained(self) -> bool:
        """Every byte the file had when it was read has been sent."""
        return self.next_offset >= self.size


@dataclass(frozen=True)
class DiskReport:
    path: str | None
    free_mib: float | None
    total_mib: float | None


@dataclass(frozen=True)
class ProbeReport:
    """One probe report. Pieces not asked for are None / empty."""

    probe_version: int
    time: float | None  # the container's clock
    hostname: str | None = None
    run: RunRecord | None = None
    run_requested: str | None = None
    log: LogChunk | None = None
    gpus: GpuReport | None = None
    gpus_series: tuple[GpuReport, ...] = ()  # --watch: every GPU reading since the last report, oldest first
    disk: DiskReport | None = None
    procs: tuple[ProcRecord, ...] = ()
    run_ids: tuple[str, ...] = ()
    runs: tuple[RunRecord, ...] = ()
    host_gpu_procs: HostGpuReport | None = None
    events_data: bytes | None = None  # with --events: the run's events.jsonl (its tail; None: not asked)
    xid: XidReport | None = None  # with --xid: the kernel log's Xid lines
    stacks_capture: dict[str, Any] | None = None  # with --events: the sentinel's newest capture {"path", "doc"}
    layouts: tuple[RankLayout, ...] = ()  # with --events: the trainer's layout per rank (none: another trainer)
    flight_recorder: FlightRecorderReport | None = None  # with --events: the run's flight recorder dumps, judged

    @property
    def log_data(self) -> bytes:
        """The log bytes this report carries (empty when it carries none)."""
        return self.log.data if self.log is not None else b""

    @property
    def log_drained(self) -> bool:
        """No log bytes are left past this report's (true when it carries no log)."""
        return self.log is None or self.log.drained


def _dict(v: object) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None


def _list(v: object) -> list[Any]:
    return v if isinstance(v, list) else []


def _b64(v: object) -> bytes:
    if not isinstance(v, str) or not v:
        return b""
    try:
        return base64.b64decode(v)
    except (binascii.Error, ValueError):
        return b""


@dataclass(frozen=True)
class RankLayout:
    """One rank's `layout` from the dflashctl trainer's heartbeat (trainer/pipeline.py layout_info): which device
    holds what. Another trainer writes none; a malformed one is dropped here, never shown half."""

    kind: str  # "threads" | "processes" (another word is kept as written)
    rank: int
    world_size: int
    devices: tuple[tuple[str, tuple[str, ...]], ...]  # (device as torch names it, what it holds), as written
    uuids: tuple[tuple[str, str], ...] = ()  # (device, its GPU's UUID as nvidia-smi prints it) where recorded


def parse_layout(doc: object) -> RankLayout | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), dict):
        return None
    kind, rank, world = as_str(doc.get("kind")), as_int(doc.get("rank")), as_int(doc.get("world_size"))
    devices = tuple((str(d), tuple(str(x) for x in held)) for d, held in doc["devices"].items()
                    if isinstance(held, list))
    if kind is None or rank is None or world is None or rank < 0 or world < 1 or not devices:
        return None
    raw = doc.get("uuids")
    uuids = tuple((str(d), u) for d, u in raw.items() if isinstance(u, str)) if isinstance(raw, dict) else ()
    return RankLayout(kind, rank, world, devices, uuids)


@dataclass(frozen=True)
class FlightRecorderReport:
    """The run's newest set of flight recorder dumps as the probe judged them where they lie
    (agent/probe/flightdumps.py): how many, of which ranks, those left out, and who is behind where."""

    dir: str | None
    dumps: int
    ranks: tuple[int, ...] = ()
    newest: float | None = None  # the newest dump's mtime (the container's clock)
    skipped: tuple[tuple[str, str], ...] = ()  # (file name, why it was left out), the first few
    skipped_count: int = 0
    behind: tuple[Behind, ...] = ()

    def to_record(self) -> dict[str, Any]:
        return {"dir": self.dir, "dumps": self.dumps, "ranks": list(self.ranks), "newest": self.newest,
                "skipped": [{"name": n, "why": w} for n, w in self.skipped], "skipped_count": self.skipped_count,
                "behind": [{"process_group": b.pg_name or b.pg, "collective": b.op, "seq": b.seq,
                            "behind": list(b.behind), "waiting": list(b.waiting), "summary": b.line()}
                           for b in self.behind]}


def parse_flight_recorder(doc: Mapping[str, Any]) -> FlightRecorderReport:
    behind, listed = [], _list(doc.get("behind"))
    if listed:  # the recorder's reader (and pickle) loads only for a run whose dumps show someone behind
        from dflashctl.agent.lib.flightrec import behind_from_record
    for b in listed:
        try:
            behind.append(behind_from_record(b))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return FlightRecorderReport(
        dir=as_str(doc.get("dir")), dumps=as_int(doc.get("dumps")) or 0,
        ranks=tuple(r for r in _list(doc.get("ranks")) if as_int(r) is not None), newest=as_float(doc.get("newest")),
        skipped=tuple((str(x.get("name")), str(x.get("why"))) for x in _list(doc.get("skipped"))
                      if isinstance(x, dict)),
        skipped_count=as_int(doc.get("skipped_count")) or 0, behind=tuple(behind))


def check_version(doc: Mapping[str, Any]) -> None:
    """A report of another probe version is refused: its fields may mean something else."""
    if doc.get("probe_version") != PROBE_VERSION:
        raise RemoteFailed(f"probe version {doc.get('probe_version')!r} does not match this CLI ({PROBE_VERSION})",
                          hint="the probe is sent with every command; is an old dflashctl on PATH?")


def parse_run(doc: Mapping[str, Any]) -> RunRecord:
    return RunRecord(
        id=str(doc["id"]), dir=str(doc["dir"]), pid=as_int(doc.get("pid")), alive=bool(doc.get("alive")),
        exit_code=as_int(doc.get("exit_code")), stopped=bool(doc.get("stopped")),
        meta=RunMeta.from_record(doc.get("meta")),
        heartbeat=_dict(doc.get("heartbeat")), errors=_dict(doc.get("errors")) or {},
        ending=bool(doc.get("ending")), supervisor_pid=as_int(doc.get("supervisor_pid")),
        ended_at=as_float(doc.get("ended_at")), log_size=as_int(doc.get("log_size")),
        log_tail=_b64(doc.get("log_tail_b64")), stopped_by=_dict(doc.get("stopped_by")) if doc.get("stopped") else None,
        restart=_dict(doc.get("restart")), events_tail=_b64(doc.get("events_tail_b64")),
        survivors=tuple(s for s in doc.get("survivors") or () if isinstance(s, dict) and isinstance(s.get("pid"), int)),
    )


def _parse_log(doc: Mapping[str, Any]) -> LogChunk:
    data = _b64(doc.get("data_b64"))
    offset = as_int(doc.get("offset")) or 0
    next_offset = as_int(doc.get("next_offset"))
    return LogChunk(path=as_str(doc.get("path")), size=as_int(doc.get("size")) or 0, inode=as_int(doc.get("inode")),
                    mtime=as_float(doc.get("mtime")), offset=offset,
                    next_offset=offset + len(data) if next_offset is None else next_offset, data=data,
                    rotated=bool(doc.get("rotated")))


def parse_gpus(doc: Mapping[str, Any]) -> GpuReport:
    return GpuReport(source=as_str(doc.get("source")), nvml=tuple(r for r in _list(doc.get("nvml"))
                                                                  if isinstance(r, dict)),
                     smi_csv=as_str(doc.get("smi_csv")), error=as_str(doc.get("error")), time=as_float(doc.get("time")))


@dataclass(frozen=True)
class XidReport:
    """The kernel log's NVIDIA Xid lines, as the probe read them (agent/probe/xid.py; on the Proxmox host for a
    container host). analysis/xids.py parses the lines."""

    source: str | None  # "dmesg" | "journalctl" | None (could not read the kernel log: see error)
    lines: tuple[str, ...] = ()
    error: str | None = None


def parse_xid(doc: Mapping[str, Any]) -> XidReport:
    lines = tuple(str(x) for x in _list(doc.get("lines")))
    return XidReport(as_str(doc.get("source")), lines, as_str(doc.get("error")))


def parse_proc(doc: Mapping[str, Any]) -> ProcRecord:
    return ProcRecord(pid=int(doc["pid"]), ppid=int(doc["ppid"]), state=str(doc["state"]),
                      run_id=as_str(doc.get("run_id")) or None, cmdline=as_str(doc.get("cmdline")) or "",
                      starttime=int(doc["starttime"]), age_s=as_float(doc.get("age_s")) or 0.0,
                      holds_gpu=bool(doc.get("holds_gpu")), elsewhere=bool(doc.get("elsewhere")))


def parse_host_gpu(doc: Mapping[str, Any]) -> HostGpuReport:
    procs = tuple(HostGpuProc(pid=int(p["pid"]), ns_pid=as_int(p.get("ns_pid")),
                              used_memory_mib=as_float(p.get("used_memory_mib")), gpu_uuid=as_str(p.get("gpu_uuid")),
                              in_container=bool(p.get("in_container")))
                  for p in _list(doc.get("procs")) if isinstance(p, dict))
    return HostGpuReport(procs=procs, error=as_str(doc.get("error")))


def parse_report(doc: Mapping[str, Any]) -> ProbeReport:
    """The typed report of one probe reply's doc; RemoteFailed (exit 106) for another probe version."""
    check_version(doc)
    run, log, gpus, disk, host = (_dict(doc.get(k)) or None for k in ("run", "log", "gpus", "disk", "host_gpu_procs"))
    return ProbeReport(
        probe_version=PROBE_VERSION, time=as_float(doc.get("time")), hostname=as_str(doc.get("hostname")),
        run=parse_run(run) if run is not None else None, run_requested=as_str(doc.get("run_requested")),
        log=_parse_log(log) if log is not None else None, gpus=parse_gpus(gpus) if gpus is not None else None,
        gpus_series=tuple(parse_gpus(g) for g in _list(doc.get("gpus_series")) if isinstance(g, dict)),
        disk=DiskReport(as_str(disk.get("path")), as_float(disk.get("free_mib")), as_float(disk.get("total_mib")))
        if disk is not None else None,
        procs=tuple(parse_proc(p) for p in _list(doc.get("procs")) if isinstance(p, dict)),
        run_ids=tuple(r for r in _list(doc.get("run_ids")) if isinstance(r, str)),
        runs=tuple(parse_run(r) for r in _list(doc.get("runs")) if isinstance(r, dict)),
        host_gpu_procs=parse_host_gpu(host) if host is not None else None,
        events_data=_b64(doc.get("events_b64")) if "events_b64" in doc else None,
        xid=parse_xid(doc["xid"]) if isinstance(doc.get("xid"), dict) else None,
        stacks_capture=_dict(doc.get("stacks_capture")),
        layouts=tuple(x for x in map(parse_layout, _list(doc.get("layouts"))) if x is not None),
        flight_recorder=parse_flight_recorder(doc["flight_recorder"]) if isinstance(doc.get("flight_recorder"), dict)
        else None,
    )
