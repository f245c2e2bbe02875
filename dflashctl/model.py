"""Plain records shared by every layer: hosts, GPU samples, threads, verdicts.

No I/O here and nothing that renders; analysis/ produces these, remote/ fills them from the
probe, commands/ returns them, cli/ draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

MiB = float
Percent = float
Watts = float

SCHEMA = 1  # every JSON document we print carries "schema": SCHEMA

TransportKind = Literal["local", "ssh"]


@dataclass(frozen=True)
class JudgeSettings:
    """How a host's runs are judged, beyond the defaults (analysis/gpuwindow.py Thresholds): hosts.toml `stall_window`
    and `progress_regex`, parsed and checked once (config.py) into this one record, which `status`, `status --watch`,
    `runs`, `logs` and the run's sentinel (launch.json `sentinel.judge`) all receive. analysis/judging.py turns it into
    the engine's thresholds and compiled pattern."""

    stall_window_s: float | None = None  # alive, no new step for this long → stalled (None: the engine's default)
    progress_regex: str | None = None  # the user's trainer's own progress line (named groups step, total, loss …)

    def to_record(self) -> dict[str, object]:
        return {"stall_window_s": self.stall_window_s, "progress_regex": self.progress_regex}

    @classmethod
    def from_record(cls, d: object) -> JudgeSettings:
        """From launch.json (anything malformed: the defaults, as a run with no settings)."""
        get = d.get if isinstance(d, dict) else (lambda _k: None)
        window, regex = get("stall_window_s"), get("progress_regex")
        ok = isinstance(window, int | float) and not isinstance(window, bool) and window > 0
        return cls(float(window) if ok else None, regex if isinstance(regex, str) and regex else None)


@dataclass(frozen=True)
class Host:
    """One entry of hosts.toml. `container` set means every command runs under `pct exec CTID --`."""

    name: str
    transport: TransportKind = "local"
    address: str | None = None
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    container: int | None = None
    workspace: str = "/workspace/dflash"
    python: str = "python3"
    gpus_target: tuple[int, ...] = ()
    gpus_drafters: tuple[int, ...] = ()
    config: str | None = None  # trainer config launched when --config is not given
    accept_new_host_key: bool = False
    persist_s: float = 300.0  # ssh: the connection master's idle time (remote/master.py); 0 = no master
    source: Path | None = None  # the hosts.toml this came from (for error messages)
    code_source: str | None = None  # local directory `deploy` ships when --source is not given (None: our trainer)
    code_max_file_mib: float = 50.0  # deploy refuses a tree with a file bigger than this
    code_max_total_mib: float = 200.0  # ... or more than this in all
    command: tuple[str, ...] | None = None  # what `launch` starts instead of the bundled trainer (argv)
    judge: JudgeSettings = JudgeSettings()  # stall_window, progress_regex: how its runs are judged
    # the run's sentinel (analysis/watchspec.py checks each when hosts.toml is read; `launch` flags override them)
    sentinel: bool = True  # start a sentinel with each run
    sentinel_interval_s: float | None = None
    notify: tuple[str, ...] = ()  # [hosts.X.notify] targets, in --notify's spelling (webhook:URL, ntfy:URL, …)
    notify_on: tuple[str, ...] | None = None  # event kinds notified (None: the default set)
    notify_min_gap_s: float | None = None  # rate limit: one message per this long, the rest batched
    on_worker_failure: str | None = None  # stop | keep
    idle_limit: str | None = None  # e.g. 5%@30m
    stall_limit: str | None = None  # e.g. 20m
    restart_on: tuple[str, ...] | None = None  # crashed, stalled
    max_restarts: int | None = None
    restart_backoff: str | None = None
    node_address: str | None = None  # how the other nodes of a cluster run reach this host's container (rendezvous)

    @property
    def endpoint(self) -> str:
        """How the host is reached, for tables and messages: `root@pve1:2222 via bastion` or this machine."""
        if self.transport == "local":
            return "this machine"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        jump = f" via {self.proxy_jump}" if self.proxy_jump else ""
        return f"{user}{self.address}{port}{jump}"

    @property
    def label(self) -> str:
        where = self.address or "localhost"
        return f"{self.name} ({where}{f' ct {self.container}' if self.container is not None else ''})"


@dataclass(frozen=True)
class Cluster:
    """[clusters.NAME] of hosts.toml (or `launch --host a,b`): one run across these hosts, the first the rendezvous."""

    name: str
    hosts: tuple[str, ...]
    rendezvous_port: int = 29500  # torchrun's --master-port on the first host
    nproc_per_node: int = 1  # torchrun's --nproc-per-node on every host


class Verdict(StrEnum):
    """One verdict per run (DESIGN §5). Values are the JSON contract.

    Ordered as DESIGN §5 lists them (SkyPilot's JobStatus is the model): the live states first, in the order a
    run passes through them and then by how much they need a person, then the ended ones. So every live
    verdict sorts before every ended one, and among live runs `max()` is the one that most needs attention.

    - STARTING: alive, no training step yet (loading, compiling); a run whose launcher has not written its pid.
    - TRAINING: alive and stepping (a job — eval, generate — alive: it logs no steps).
    - DEGRADED: alive, but a worker (drafter thread, rank) has crashed: training goes on with fewer (exit 105).
    - STALLED: alive, no new step for the stall window, or the GPUs show a hang (exit 104).
    - CRASHED: ended with a non-zero exit code, or gone after an uncaught exception (exit 100).
    - FINISHED: ended, exit code 0 (or the trainer's `training finished` line, offline).
    - STOPPED: `dflashctl stop` ended it (the marker is written before the first signal) (exit 103).
    - LOST: gone, and nothing recorded how: killed outright, or the host rebooted (exit 100).
    """

    STARTING = "starting"
    TRAINING = "training"
    DEGRADED = "degraded"
    STALLED = "stalled"
    CRASHED = "crashed"
    FINISHED = "finished"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def exit_code(self) -> int:
        return _VERDICT_EXIT[self]

    @property
    def is_terminal(self) -> bool:
        """Nothing more will happen to the run."""
        return self._rank >= _RANK[Verdict.CRASHED]

    @property
    def is_failure(self) -> bool:
        """What `status --exit-on-failure` stops on, and what a summary counts as failed."""
        return self in (Verdict.DEGRADED, Verdict.STALLED, Verdict.CRASHED, Verdict.LOST)

    @property
    def _rank(self) -> int:
        return _RANK[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Verdict):
            return NotImplemented
        return self._rank < other._rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Verdict):
            return NotImplemented
        return self._rank <= other._rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Verdict):
            return NotImplemented
        return self._rank > other._rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Verdict):
            return NotImplemented
        return self._rank >= other._rank


_RANK = {v: i for i, v in enumerate(Verdict)}
_VERDICT_EXIT = {
    Verdict.STARTING: 0,
    Verdict.TRAINING: 0,
    Verdict.FINISHED: 0,
    Verdict.CRASHED: 100,
    Verdict.LOST: 100,
    Verdict.STOPPED: 103,
    Verdict.STALLED: 104,
    Verdict.DEGRADED: 105,
}


class GpuFinding(StrEnum):
    """What one GPU's readings over the window say (analysis/gpuwindow.py judge_gpus)."""

    BUSY = "busy"
    IDLE = "idle"
    IDLE_ALLOCATED = "idle-allocated"  # memory held at ≈0 % utilisation for the window
    SPINNING = "spinning"  # memory held, ≈100 % utilisation at near-idle power, no new step: a wait kernel spinning
    ORPHANED = "orphaned"


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. None means "not available" (decided once, in the parser)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_used_mib: MiB | None = None
    memory_total_mib: MiB | None = None
    utilization_pct: Percent | None = None
    power_w: Watts | None = None
    timestamp: float | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU, as `nvidia-smi --query-compute-apps` or NVML reports it."""

    pid: int
    used_memory_mib: MiB | None
    gpu_uuid: str | None


@dataclass(frozen=True)
class GpuReport:
    """The probe's `gpus` piece as sent: NVML readings, or nvidia-smi CSV (with its header), or why neither.
    Turned into GpuSamples by analysis/gpus.py `from_probe`, the one nvidia-smi reader."""

    source: str | None  # "nvml" | "nvidia-smi" | None (no GPUs visible: see error)
    nvml: tuple[dict[str, object], ...] = ()
    smi_csv: str | None = None
    error: str | None = None
    time: float | None = None  # when it was read (the probe's clock), in a watch's `gpus_series`


class GpuAction(StrEnum):
    """What a GPU health finding asks for (the JSON contract: these strings). In order of how much of the machine it
    takes away: the program, the GPU, the node's work, the node itself (analysis/gpuhealth.py `worst_action`)."""

    RESTART_PROGRAM = "restart the program"
    RESET_GPU = "reset the GPU"
    DRAIN_NODE = "drain the node"
    REBOOT = "reboot"


class HealthSeverity(StrEnum):
    """How bad a GPU health finding is for the GPU: info (the GPU is fine: a program was stopped, a setting is off),
    warning (degraded or needs a reset when convenient), critical (unusable or untrustworthy until acted on)."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class XidEvent:
    """One NVIDIA driver Xid report from the kernel log (analysis/xids.py). pci is normalised to `0000:18:00`
    (domain:bus:device, as `normalize_pci` makes nvidia-smi's `00000000:18:00.0` too); None where the line had none."""

    xid: int
    pci: str | None
    pid: int | None  # None for pid='<unknown>' or none printed
    process: str | None
    message: str
    raw: str  # the line as read


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health readings (analysis/gpuhealth.py `gpu_health`). None: the driver did not report it (not
    supported, N/A, or an older probe/driver without the field), never a guess."""

    index: int
    pci_bus_id: str | None = None  # normalised `0000:18:00`
    uuid: str | None = None
    name: str | None = None
    temperature_c: float | None = None
    power_w: Watts | None = None
    power_limit_w: Watts | None = None
    persistence_mode: bool | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_correctable: int | None = None
    recovery_action: str | None = None  # none | reset | reboot | drain (the driver's own advice)
    clocks_event_reasons: int | None = None  # NVML's nvmlClocksEventReason* bitmask
    throttle_reasons: tuple[str, ...] = ()  # that mask decoded (nvidia-smi's names: sw_power_cap, hw_slowdown …)
    unsupported: tuple[str, ...] = ()  # fields the driver said it does not support
    read_error: str | None = None  # NVML could not read this GPU at all (its handle failed: lost, reset required)

    def to_record(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class HealthFinding:
    """One thing wrong (or worth knowing) about one GPU. id is the JSON contract (docs/failures.md, "GPU health
    findings"); gpu is None for an Xid whose PCI address matches no GPU the probe saw."""

    id: str
    gpu: int | None
    severity: HealthSeverity
    meaning: str
    action: GpuAction | None  # None: no recovery action; remedy says what to look at
    remedy: str
    evidence: str  # the kernel-log line, or field=value
    count: int = 1  # how many lines/readings said the same thing

    def to_record(self) -> dict[str, object]:
        return {"id": self.id, "gpu": self.gpu, "severity": str(self.severity), "meaning": self.meaning,
                "action": None if self.action is None else str(self.action), "remedy": self.remedy,
                "evidence": self.evidence, "count": self.count}


@dataclass(frozen=True)
class ProcRecord:
    """A container process the probe reported (ours by marker, defunct, a defunct's parent, a GPU holder)."""

    pid: int
    ppid: int
    state: str
    run_id: str | None  # its DFLASH_RUN_ID marker
    cmdline: str
    starttime: int  # clock ticks since boot: with pid, the process's identity (pid reuse)
    age_s: float
    holds_gpu: bool
    elsewhere: bool = False  # its DFLASH_RUN_DIR is another workspace's: a run of the same id, not ours


@dataclass(frozen=True)
class HostGpuProc:
    """A GPU compute process seen from the Proxmox host, mapped to the pid its container sees."""

    pid: int
    ns_pid: int | None  # the pid inside the container (None: not in it)
    used_memory_mib: MiB | None
    gpu_uuid: str | None
    in_container: bool


@dataclass(frozen=True)
class HostGpuReport:
    """The host's GPU process list (`probe --host-gpu-procs`), or why there is none."""

    procs: tuple[HostGpuProc, ...] = ()
    error: str | None = None


@dataclass
class ThreadState:
    name: str
    state: Literal["running", "crashed", "finished"] = "running"
    exception: str | None = None  # type as the traceback prints it, e.g. torch.OutOfMemoryError
    message: str | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class Signature:
    """A known failure: stable id (JSON contract), one-line summary, what to do."""

    id: str
    summary: str
    remedy: str


@dataclass(frozen=True)
class SignatureHit:
    signature: Signature
    line: int  # 1-based line number in the log
    text: str


@dataclass
class ProgressPoint:
    line: int
    values: dict[str, float] = field(default_factory=dict)  # step, loss, tok/s, acc_len, lr ...
    kind: str = "train"  # "eval": a periodic evaluation (`eval step=N acc_len=…`), not a training step
