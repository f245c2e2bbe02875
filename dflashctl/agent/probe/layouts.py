"""Which device of each rank holds what: the `layout` the dflashctl trainer writes in its heartbeat
(trainer/pipeline.py `layout_info`), gathered from every rank's heartbeat for `status` (stdlib only).

Rank 0 (the node's lowest rank) writes `<run>/heartbeat.json`; under the process layout rank r > 0 writes its own in
`<run>/rank-r/heartbeat.json`. Only the `layout` objects travel, as written (report.py types them). A heartbeat
without one (any other trainer) gives nothing, and nothing here can fail a report.
"""

from __future__ import annotations

import os

from dflashctl.agent.lib.fsutil import read_json

LAYOUT_RANKS_MAX = 256  # rank-N/ heartbeats read per report (a node runs 8-16; each is a few hundred bytes)


def rank_layouts(run_dir: str, heartbeat: dict | None) -> list:
    """The lead heartbeat's layout, then every other rank's on this node (by rank); [] when the lead has none."""
    lead = heartbeat.get("layout") if isinstance(heartbeat, dict) else None
    if not isinstance(lead, dict):
        return []
    out = [lead]
    world = lead.get("world_size")
    if not isinstance(world, int) or world < 2:
        return out
    try:
        names = os.listdir(run_dir)
    except OSError:
        return out
    ranks = sorted(int(n[5:]) for n in names if n.startswith("rank-") and n[5:].isdigit())
    for rank in ranks[:LAYOUT_RANKS_MAX]:
        doc = read_json(os.path.join(run_dir, f"rank-{rank}", "heartbeat.json"))
        got = doc.get("layout") if doc else None
        if isinstance(got, dict) and got.get("rank") != lead.get("rank"):
            out.append(got)
    return out
