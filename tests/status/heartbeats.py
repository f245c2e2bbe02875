"""Heartbeat files as the dflashctl trainer writes them on a GPU host, written by the trainer's own code on the CPU:
`Trainer.layout_info` (trainer/pipeline.py) on a shipped config's devices as `place_devices` gives them to each
rank, and `telemetry.Heartbeat.write` into the run directory (rank 0) or `rank-R/` (the process layout's other
ranks). Only the GPU work is absent: the device statistics are the CPU's."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace as NS

from trainer.distributed import Dist, place_devices
from trainer.pipeline import Trainer
from trainer.telemetry import Heartbeat, Progress

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def layout_for(config: str, rank: int, world: int) -> dict:
    """What rank `rank` of `world` (one node) writes as its heartbeat's `layout` under the shipped config."""
    doc = tomllib.loads((CONFIGS / config).read_text())
    kind = doc.get("runtime", {}).get("layout", "threads")
    d = Dist(rank=rank, world_size=world, local_rank=rank, local_world_size=world)
    target, drafters = place_devices(list(doc["devices"]["target"]), list(doc["devices"]["drafters"]), d)
    trainer = NS(cfg=NS(devices=NS(target=target), runtime=NS(layout=kind)), dist=d, devices=drafters,
                 n=len(drafters))
    return Trainer.layout_info(trainer)


def write_heartbeats(run_dir: Path, config: str, world: int = 1, ranks: range | None = None) -> list[dict]:
    """Every rank's heartbeat.json (those in `ranks`, default all) as the trainer writes it; their layouts."""
    out = []
    for rank in ranks if ranks is not None else range(world):
        layout = layout_for(config, rank, world)
        where = run_dir / f"rank-{rank}" if rank else run_dir
        where.mkdir(parents=True, exist_ok=True)
        Heartbeat(where, ["cpu"], "off", layout=layout).write(Progress(step=7, tok_s=900.0, loss=2.5), [], 0,
                                                              "training")
        assert json.loads((where / "heartbeat.json").read_text())["layout"] == layout
        out.append(layout)
    return out
