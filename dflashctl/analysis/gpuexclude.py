"""Which GPUs a launch leaves out (`launch --exclude-unhealthy-gpus`, issue 28 part 3): those with a finding that
says the next program on them will fail too — an uncorrectable ECC error, a pending or failed row remap (or page
retirement), a GPU that cannot be read, Xid 48/79/94/95 — and what remains. Pure: findings in, a decision out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dflashctl.model import HealthFinding

EXCLUDE_IDS = ("ecc-uncorrected", "row-remap-pending", "row-remap-failed", "retired-pages-pending", "gpu-unreadable",
               "xid-48", "xid-79", "xid-94", "xid-95")


@dataclass(frozen=True)
class Exclusion:
    keep: tuple[int, ...]  # the GPUs left, in order
    left_out: dict[int, tuple[str, ...]] = field(default_factory=dict)  # GPU → its findings (`id: evidence`)

    def why(self) -> str:
        """`GPU 1 (row-remap-pending: remapped_rows.pending=Yes)`, one per GPU left out."""
        return "; ".join(f"GPU {g} ({', '.join(w)})" for g, w in sorted(self.left_out.items()))


def exclusion(gpus: Sequence[int], findings: Iterable[HealthFinding]) -> Exclusion:
    """gpus less those with a finding in EXCLUDE_IDS."""
    bad: dict[int, list[str]] = {}
    for f in findings:
        if f.gpu is not None and f.gpu in gpus and f.id in EXCLUDE_IDS:
            bad.setdefault(f.gpu, []).append(f"{f.id}: {f.evidence}" if f.evidence else f.id)
    return Exclusion(tuple(g for g in gpus if g not in bad), {g: tuple(w) for g, w in bad.items()})
