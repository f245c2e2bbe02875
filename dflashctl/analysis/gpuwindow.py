"""GPU samples over the window (DESIGN §5): each GPU's finding, the two stall shapes, and the watch's reduction of
each report interval to (min, mean, max). Pure, like health.py, which judges the whole run with these.

The two shapes a live run that makes no progress shows on its GPUs, told apart because their causes are:
- `idle-held`: every GPU holding memory at ≈0 % for the window — nothing feeds them (a dead worker, a starved data
  loader, a stuck compile);
- `spinning`: ≈100 % utilisation at near-idle power with no new step — kernels that wait instead of computing (a
  rank died or hangs in a collective and the others spin on it; a spin-wait kernel).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dflashctl.model import GpuFinding, GpuProcess, GpuSample, Signature

Span = tuple[float, float, float]  # (min, mean, max) of one report interval's readings
SERIES = {"util": "utilization_pct", "memory_mib": "memory_used_mib", "power_w": "power_w"}  # key → GpuSample field
StallShape = Literal["idle-held", "spinning"]
IDLE_HELD: StallShape = "idle-held"
SPINNING: StallShape = "spinning"


@dataclass(frozen=True)
class Thresholds:
    """What counts as idle, allocated, spinning, stalled. Defaults suit 80–141 GB training GPUs."""

    idle_util_pct: float = 2.0  # ≤ this utilisation is "≈0 %"
    allocated_mib: float = 1024.0  # ≥ this much memory used is "memory held"
    idle_window_s: float = 60.0  # GPU findings look at samples this recent (all samples when times unknown)
    stall_window_s: float = 300.0  # alive, no new step for this long → stalled
    startup_grace_s: float = 1200.0  # alive, no first step after this long → stalled (compiling takes minutes)
    hang_util_pct: float = 90.0  # spinning: utilisation this high ...
    hang_power_w: float = 150.0  # ... at a power draw this low (a wait kernel spinning, no math)


@dataclass(frozen=True)
class GpuSweep:
    """All GPUs read at one moment."""

    time: float | None
    samples: tuple[GpuSample, ...]


@dataclass
class GpuStatus:
    sample: GpuSample  # the latest reading
    finding: GpuFinding | None  # None: not enough data (utilisation not available)
    history: list[float | None] = field(default_factory=list)  # utilisation % over the window, oldest first
    # watching: each report interval's readings reduced, oldest first, per SERIES key (None: no reading that interval)
    series: dict[str, list[Span | None]] = field(default_factory=dict)

    @property
    def index(self) -> int:
        return self.sample.index


STALL_SHAPES: dict[StallShape, Signature] = {
    IDLE_HELD: Signature(
        IDLE_HELD,
        "Every GPU holding memory sat at ≈0 % utilisation for the window: the run holds its GPUs and gives them "
        "no work.",
        "Nothing feeds the GPUs: a worker thread or rank died (see the threads and the log's last traceback), the "
        "data loader is starved or stuck (slow storage, a dead DataLoader worker, a full or empty queue), or "
        "torch.compile is stuck (still compiling, or waiting on a lock). Look at where every thread of the live "
        "process waits with `dflashctl stacks`.",
    ),
    SPINNING: Signature(
        SPINNING,
        "GPUs at ≈100 % utilisation at near-idle power with no new step for the window: their kernels wait "
        "instead of computing (a dead collective, a spin-wait kernel).",
        "A rank died or hangs in a collective and the others spin on it: check every rank (the one whose log "
        "ends first, or the GPU at ≈0 % beside the spinning ones; `dflashctl stacks` shows where each waits), "
        "rerun with `NCCL_DEBUG=INFO` to see which collective hung, set `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` so a "
        "hung collective ends the run instead of spinning, and give the process group a collective timeout "
        "(`init_process_group(timeout=timedelta(minutes=10))`).",
    ),
}


def window(sweeps: Sequence[GpuSweep], now: float | None, t: Thresholds) -> list[GpuSweep]:
    if not sweeps:
        return []
    if now is None or any(s.time is None for s in sweeps):
        return list(sweeps)
    recent = [s for s in sweeps if s.time is not None and s.time >= now - t.idle_window_s]
    return recent or [sweeps[-1]]  # a single (old) sample counts when that is all there is


def _spins(hist: Sequence[GpuSample], t: Thresholds) -> bool:
    """Busy at low power in every sample of the window: a wait kernel spinning, no math."""
    return all(x.utilization_pct is not None and x.utilization_pct >= t.hang_util_pct
               and x.power_w is not None and x.power_w <= t.hang_power_w for x in hist)


def judge_gpus(
    sweeps: Sequence[GpuSweep],
    now: float | None,
    *,
    run_alive: bool | None,
    thresholds: Thresholds = Thresholds(),
    gpu_processes: Sequence[GpuProcess] = (),
    live_pids: frozenset[int] | None = None,
    stepping: bool = False,
) -> list[GpuStatus]:
    """One GpuStatus per GPU of the latest sweep, judged over the window. stepping: the run logged a new step within
    the window (then a GPU busy at low power is a light workload, not a spin)."""
    t = thresholds
    recent = window(sweeps, now, t)
    if not recent:
        return []
    by_index: dict[int, list[GpuSample]] = {}
    for sw in recent:
        for s in sw.samples:
            by_index.setdefault(s.index, []).append(s)
    foreign_uuids = {p.gpu_uuid for p in gpu_processes if live_pids is not None and p.pid not in live_pids}
    out = []
    for s in recent[-1].samples:
        hist = by_index.get(s.index, [s])
        held = all(x.memory_used_mib is not None and x.memory_used_mib >= t.allocated_mib for x in hist)
        utils = [x.utilization_pct for x in hist]
        finding: GpuFinding | None
        if held and (run_alive is False or (s.uuid is not None and s.uuid in foreign_uuids)):
            finding = GpuFinding.ORPHANED
        elif any(u is None for u in utils):
            finding = None
        elif all(u <= t.idle_util_pct for u in utils if u is not None):
            finding = GpuFinding.IDLE_ALLOCATED if held else GpuFinding.IDLE
        elif held and not stepping and _spins(hist, t):
            finding = GpuFinding.SPINNING
        else:
            finding = GpuFinding.BUSY
        out.append(GpuStatus(s, finding, utils))
    return out


def holding(gpus: Sequence[GpuStatus], t: Thresholds) -> list[GpuStatus]:
    """The GPUs whose latest reading holds memory."""
    return [g for g in gpus if g.sample.memory_used_mib is not None and g.sample.memory_used_mib >= t.allocated_mib]


def stall_shape(gpus: Sequence[GpuStatus], t: Thresholds) -> StallShape | None:
    """The shape every GPU holding memory shows: idle-held (all at ≈0 %), spinning (at least one spins and the rest
    sit at ≈0 %: the spinning ranks wait in a collective for the idle ones), else None (none holds memory, one
    works, or one cannot be read)."""
    held = holding(gpus, t)
    found = {g.finding for g in held}
    if not held:
        return None
    if found == {GpuFinding.IDLE_ALLOCATED}:
        return IDLE_HELD
    if GpuFinding.SPINNING in found and found <= {GpuFinding.SPINNING, GpuFinding.IDLE_ALLOCATED}:
        return SPINNING
    return None


def shape_reason(gpus: Sequence[GpuStatus], shape: StallShape, t: Thresholds) -> str:
    """One reason line naming the shape and its GPUs."""
    idle = ranges(g.index for g in gpus if g.finding == GpuFinding.IDLE_ALLOCATED)
    if shape == IDLE_HELD:
        return f"idle with memory held: every GPU holding memory is at ≈0 % ({idle})"
    spin = ranges(g.index for g in gpus if g.finding == GpuFinding.SPINNING)
    return (f"spinning: GPU(s) {spin} at ≈100 % utilisation at near-idle power (≤ {t.hang_power_w:.0f} W)"
            + (f" while GPU(s) {idle} sit at ≈0 % with memory held" if idle else "")
            + ": the shape of a dead collective or a spin-wait kernel")


def reduce_interval(sweeps: Iterable[Sequence[GpuSample]]) -> dict[int, dict[str, Span | None]]:
    """Each GPU's readings of one report interval → (min, mean, max) per SERIES key; None where none had a value."""
    by_index: dict[int, list[GpuSample]] = {}
    for samples in sweeps:
        for s in samples:
            by_index.setdefault(s.index, []).append(s)
    out: dict[int, dict[str, Span | None]] = {}
    for i, xs in by_index.items():
        out[i] = {}
        for key, attr in SERIES.items():
            vals = [float(v) for v in (getattr(x, attr) for x in xs) if v is not None]
            out[i][key] = (min(vals), sum(vals) / len(vals), max(vals)) if vals else None
    return out


def ranges(indices: Iterable[int]) -> str:
    """[0,1,2,3,5] → '0-3,5'."""
    xs = sorted(set(indices))
    parts = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def markdown(t: Thresholds = Thresholds()) -> list[str]:
    """The stall shapes' section of docs/failures.md (failuredocs.markdown appends it)."""
    how = {
        IDLE_HELD: f"every GPU holding ≥ {t.allocated_mib:.0f} MiB at ≤ {t.idle_util_pct:g} % utilisation in every "
                   f"sample of the GPU window ({t.idle_window_s:.0f} s); the run is `stalled` once no new step came "
                   f"for that window (before its first step: once the {t.startup_grace_s:.0f} s start-up grace is "
                   "over).",
        SPINNING: f"every GPU holding memory at ≥ {t.hang_util_pct:g} % utilisation and ≤ {t.hang_power_w:.0f} W in "
                  f"every sample of the GPU window with no new step in it (some may sit at ≈0 % instead: the ones "
                  f"the others wait for); the run is `stalled` once no new step came for the stall window "
                  f"({t.stall_window_s:.0f} s).",
    }
    out = ["", "## GPU stall shapes", "",
           "Not log signatures: what the GPUs of a live run look like while it makes no progress. When the verdict "
           "is `stalled` and the GPUs show one of these, `status` and `diagnose` name it (`stall_shape` and "
           "`stall_remedy` in `--json`); each GPU's `finding` (`idle-allocated`, `spinning`) says which GPUs show "
           "it. A run with a dead worker stays `degraded`: its idle GPUs are the effect, not the cause.", "",
           "| shape | what happened |", "|---|---|"]
    out += [f"| [`{s.id}`](#{s.id}) | {s.summary} |" for s in STALL_SHAPES.values()]
    for s in STALL_SHAPES.values():
        out += ["", f"### {s.id}", "", s.summary, "", f"**What to do:** {s.remedy}", "", f"Recognised by: {how[s.id]}"]
    return out
