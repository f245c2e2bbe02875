"""Which GPUs a run leaves out (`launch --exclude-unhealthy-gpus`, issue 28 part 3): those with a finding that says
the next program on them will fail too — an uncorrectable ECC error, a pending or failed row remap (or page
retirement), a GPU that cannot be read, Xid 48/79/94/95 — what remains, and whether that is enough.

ONE rule for the launch's pre-flight (commands/launch.py, each node of a run across hosts) and for every restart
(the sentinel, in the container, runs this same module from its bundle before it asks for the next attempt). Pure:
findings in, a decision out; `decide_report` takes the probe's report as both sides read it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflashctl.agent.lib.gpuleftout import left_out_note
from dflashctl.analysis.gpuhealth import gpu_health, health_findings
from dflashctl.analysis.xids import xid_events
from dflashctl.model import HealthFinding
from dflashctl.report import ProbeReport

EXCLUDE_IDS = ("ecc-uncorrected", "row-remap-pending", "row-remap-failed", "retired-pages-pending", "gpu-unreadable",
               "xid-48", "xid-79", "xid-94", "xid-95")
_NPROC = re.compile(r"^--nproc[-_]per[-_]node(?:=(.*))?$")


@dataclass(frozen=True)
class Exclusion:
    keep: tuple[int, ...]  # the GPUs left, in order
    left_out: dict[int, tuple[str, ...]] = field(default_factory=dict)  # GPU → its findings (`id: evidence`)
    refused: str | None = None  # why the run cannot start on what is left (None: it can)

    def why(self) -> str:
        """`GPU 1 (row-remap-pending: remapped_rows.pending=Yes)`, one per GPU left out."""
        return "; ".join(f"GPU {g} ({', '.join(w)})" for g, w in sorted(self.left_out.items()))

    def visible(self) -> str:
        """CUDA_VISIBLE_DEVICES for what is kept."""
        return ",".join(str(g) for g in self.keep)

    def note(self, who: str = "the attempt") -> str:
        """What a launch or a restart says: which GPUs were left out and what `who` gets ('' when none was)."""
        return left_out_note(self.why(), self.visible(), who) if self.left_out else ""

    def to_record(self) -> dict[str, Any]:
        return {"keep": list(self.keep), "left_out": {str(g): list(w) for g, w in sorted(self.left_out.items())},
                "why": self.why(), "refused": self.refused}


def exclusion(gpus: Sequence[int], findings: Iterable[HealthFinding]) -> Exclusion:
    """gpus less those with a finding in EXCLUDE_IDS."""
    bad: dict[int, list[str]] = {}
    for f in findings:
        if f.gpu is not None and f.gpu in gpus and f.id in EXCLUDE_IDS:
            bad.setdefault(f.gpu, []).append(f"{f.id}: {f.evidence}" if f.evidence else f.id)
    return Exclusion(tuple(g for g in gpus if g not in bad), {g: tuple(w) for g, w in bad.items()})


def decide(gpus: Sequence[int], findings: Iterable[HealthFinding], *, need: int = 1, fixed: bool = False) -> Exclusion:
    """exclusion(), refused when the run cannot do without what was left out: `fixed` (the trainer with the host's
    configured GPUs: its config names physical GPUs, none can be swapped out) and any is unhealthy; none left; or
    fewer left than `need` (torchrun's ranks per node: rank N on a node with fewer GPUs fails at its first CUDA
    call, so the run would only crash later and less clearly)."""
    ex = exclusion(gpus, findings)
    refused = None
    if ex.left_out and fixed:
        refused = f"unhealthy GPUs the trainer is configured to use: {ex.why()}"
    elif ex.left_out and not ex.keep:
        refused = f"no healthy GPU remains: {ex.why()}"
    elif ex.left_out and len(ex.keep) < need:
        refused = (f"{len(ex.keep)} healthy GPU(s) remain ({ex.visible()}), the run needs {need}: "
                   f"left out {ex.why()}")
    return Exclusion(ex.keep, ex.left_out, refused)


def report_findings(doc: ProbeReport) -> list[HealthFinding]:
    """The findings of a probe report's GPU readings and kernel-log Xid lines."""
    return health_findings(gpu_health(doc.gpus), xid_events(doc.xid.lines if doc.xid is not None else ()))


def candidate_gpus(doc: ProbeReport, configured: Sequence[int], visible: str | None) -> tuple[int, ...]:
    """The GPUs the run would use: the host's configured ones, else the user's CUDA_VISIBLE_DEVICES (indices), else
    every GPU the probe saw."""
    if configured:
        return tuple(configured)
    if visible:
        return tuple(int(x) for x in visible.split(",") if x.strip().isdigit())
    return tuple(sorted({h.index for h in gpu_health(doc.gpus)}))


def gpus_needed(argv: Sequence[str]) -> int:
    """How many GPUs the program needs at least: torchrun's `--nproc-per-node N` (one GPU per rank), read among
    torchrun's own options (after `torchrun` or `-m torch.distributed.run`, before its script), else 1 (`gpu`/`auto`
    takes what is visible; a script's own `--nproc-per-node` is not torchrun's)."""
    words = [str(a) for a in argv]
    start = next((i + 1 for i, w in enumerate(words) if w.rsplit("/", 1)[-1] == "torchrun"
                  or w in ("torch.distributed.run", "torch.distributed.launch")), None)
    if start is None:
        return 1
    for i in range(start, len(words)):
        w = words[i]
        if w.endswith(".py") or w == "--":
            break
        m = _NPROC.match(w)
        if m:
            value = m.group(1) if m.group(1) is not None else (words[i + 1] if i + 1 < len(words) else "")
            return int(value) if value.isdigit() and int(value) > 0 else 1
    return 1
