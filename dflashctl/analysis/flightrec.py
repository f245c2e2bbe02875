"""The flight recorder's dumps (torch.distributed, NCCL and gloo): which rank is behind, in which collective.

The one parser is stdlib-only and lives in agent/lib/flightrec.py, so the status probe runs it in the container on
the dumps where they lie (only its verdict travels) and `diagnose` runs the same code on copied files; this module
is the laptop's name for it.
"""

from __future__ import annotations

from dflashctl.agent.lib.flightrec import (
    Behind,
    Collective,
    DumpError,
    RankTrace,
    behind_from_record,
    dump_rank,
    find_behind,
    load_dump,
    parse_dump,
)
from dflashctl.agent.lib.flightrec_env import DUMP_DIR

__all__ = ["DUMP_DIR", "Behind", "Collective", "DumpError", "RankTrace", "behind", "behind_from_record", "load",
           "parse", "rank_of"]

rank_of = dump_rank
load = load_dump
parse = parse_dump
behind = find_behind
