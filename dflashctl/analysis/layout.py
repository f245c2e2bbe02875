"""Which GPU holds what, from the layouts the dflashctl trainer writes in each rank's heartbeat (report.RankLayout):
one line for `status` (`threads: target on GPU 0-4, 3 drafters on GPU 5-7`, `processes: 8 ranks, rank r on GPU r
(target + drafter)`), and per GPU what it holds, for the GPU table's rows.

Which nvidia-smi GPU a torch device is: by the GPU's UUID where the trainer recorded it (layout `uuids`, the only
mapping that survives a CUDA_VISIBLE_DEVICES of the trainer's own and CUDA's fastest-first order) and the GPU table
has it; else `cuda:N` is taken as GPU N (true when the trainer sees every GPU in PCI order, as a Proxmox container
sees its passed-through GPUs). Devices that are not CUDA (the CPU) are in the line but hold no GPU row. Pure: records
in, records out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflashctl.model import GpuSample
from dflashctl.report import RankLayout


def gpu_index(device: str) -> int | None:
    """`cuda:3` → 3, `cuda` → 0 (torch's current device, 0 in a trainer that never sets another); else None."""
    kind, _, idx = device.partition(":")
    if kind != "cuda":
        return None
    return int(idx) if idx.isdigit() else 0 if not idx else None


Resolve = Callable[[RankLayout, str], "int | None"]  # (rank, torch device) → nvidia-smi GPU index, or None


def _by_name(_r: RankLayout, device: str) -> int | None:
    return gpu_index(device)


def _where(r: RankLayout, devices: Sequence[str], gpu: Resolve = _by_name) -> str:
    """`GPU 0-4`, `GPU 5,7`, `cpu`: GPU indices as runs (three or more in a row as a range), other devices by name."""
    idx = sorted({i for d in devices if (i := gpu(r, d)) is not None})
    others = sorted({d for d in devices if gpu(r, d) is None})
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs]
    gpus = f"GPU {','.join(parts)}" if parts else ""
    return ", ".join(x for x in (gpus, *others) if x)


def _is_target(role: str) -> bool:
    return role.startswith("target")


def _is_drafter(role: str) -> bool:
    return role.startswith("drafter")


def _holds_both(held: Sequence[str]) -> bool:
    return any(_is_target(x) for x in held) and any(_is_drafter(x) for x in held)


def _rank_line(r: RankLayout, gpu: Resolve = _by_name) -> str:
    """One rank's devices: `target on GPU 0-4 (sharded), 3 drafters on GPU 5-7`, `target + 1 drafter on GPU 0`."""
    target = [d for d, held in r.devices if any(_is_target(x) for x in held)]
    drafters = [x for _, held in r.devices for x in held if _is_drafter(x)]
    drafter_devs = [d for d, held in r.devices if any(_is_drafter(x) for x in held)]
    other = [f"{'+'.join(held)} on {_where(r, [d], gpu)}" for d, held in r.devices
             if not any(_is_target(x) or _is_drafter(x) for x in held)]
    n = f"{len(drafters)} drafter{'s' if len(drafters) != 1 else ''}"
    shard = " (sharded)" if any(x == "target-shard" for _, held in r.devices for x in held) else ""
    if target and sorted(target) == sorted(drafter_devs):
        parts = [f"target{shard} + {n} on {_where(r, target, gpu)}"]
    else:
        parts = ([f"target on {_where(r, target, gpu)}{shard}"] if target else []) + \
                ([f"{n} on {_where(r, drafter_devs, gpu)}"] if drafters else [])
    return ", ".join(parts + other)


@dataclass(frozen=True)
class LayoutView:
    """The run's layout as the ranks of this node reported it."""

    kind: str
    world_size: int
    ranks: tuple[RankLayout, ...]  # by rank, those whose heartbeat carries a layout
    gpu_by_uuid: Mapping[str, int] = field(default_factory=dict)  # the GPU table's bare UUID → nvidia-smi index

    def gpu(self, r: RankLayout, device: str) -> int | None:
        """The nvidia-smi index of rank r's device: by its recorded UUID when the GPU table knows it, else by name."""
        uuid = dict(r.uuids).get(device)
        if uuid is not None and bare_uuid(uuid) in self.gpu_by_uuid:
            return self.gpu_by_uuid[bare_uuid(uuid)]
        return gpu_index(device)

    def line(self) -> str:
        if len(self.ranks) == 1 and self.world_size == 1:
            return f"{self.kind}: {_rank_line(self.ranks[0], self.gpu)}"
        head = f"{self.kind}: {self.world_size} rank{'s' if self.world_size != 1 else ''}"
        if len(self.ranks) != self.world_size:
            head += f" ({len(self.ranks)} on this host)"
        one = [r.devices[0] for r in self.ranks if len(r.devices) == 1]
        both = len(one) == len(self.ranks) and all(_holds_both(held) for _, held in one)
        if both and all(self.gpu(r, d) == r.rank for r, (d, _) in zip(self.ranks, one, strict=True)):
            return f"{head}, rank r on GPU r (target + drafter)"
        if both and len({d for d, _ in one}) == 1 and self.gpu(self.ranks[0], one[0][0]) is None:
            return f"{head}, each on {one[0][0]} (target + drafter)"
        return f"{head}; " + "; ".join(f"rank {r.rank}: {_rank_line(r, self.gpu)}" for r in self.ranks)

    def gpus(self) -> dict[int, str]:
        """GPU index → what it holds (`target-shard`, `drafter-2`, `rank 3: target + drafter-3`)."""
        out: dict[int, list[str]] = {}
        several = len(self.ranks) > 1 or self.world_size > 1
        for r in self.ranks:
            for dev, held in r.devices:
                i = self.gpu(r, dev)
                if i is not None:
                    out.setdefault(i, []).append((f"rank {r.rank}: " if several else "") + " + ".join(held))
        return {i: "; ".join(xs) for i, xs in sorted(out.items())}

    def to_record(self) -> dict[str, Any]:
        """`status --json`'s `layout`."""
        return {"kind": self.kind, "world_size": self.world_size, "summary": self.line(),
                "ranks": [{"rank": r.rank, "devices": [{"device": d, "gpu": self.gpu(r, d), "holds": list(held)}
                                                       for d, held in r.devices]} for r in self.ranks],
                "gpus": [{"gpu": i, "holds": h} for i, h in self.gpus().items()]}


def layout_of(layouts: Sequence[RankLayout], gpus: Iterable[GpuSample] = ()) -> LayoutView | None:
    """The view of a report's layouts (the lead rank's first); None when the trainer wrote none. gpus: the GPU
    table's readings, to place devices the trainer recorded by UUID."""
    if not layouts:
        return None
    lead = layouts[0]
    ranks = {r.rank: r for r in layouts if r.kind == lead.kind}
    return LayoutView(lead.kind, lead.world_size, tuple(ranks[k] for k in sorted(ranks)), uuid_index(gpus))


def uuid_index(gpus: Iterable[GpuSample]) -> dict[str, int]:
    """GPU readings' bare UUID → nvidia-smi index: how a rank's device or a GPU process is placed on a GPU row."""
    return {bare_uuid(s.uuid): s.index for s in gpus if s.uuid}


def bare_uuid(uuid: str) -> str:
    """nvidia-smi prints `GPU-<uuid>`, torch's device properties print the bare `<uuid>`: compared without either."""
    return uuid.strip().lower().removeprefix("gpu-")
