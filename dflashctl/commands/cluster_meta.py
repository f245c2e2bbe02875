"""Which run is a run across hosts: meta.json's `cluster` members, read without the cluster verbs' imports (every
`status` of a run asks it, so it must cost nothing to import)."""

from __future__ import annotations

from typing import Any


def members(meta: dict[str, Any] | None) -> list[tuple[str, int]] | None:
    """[(host, node_rank)] of a run across hosts (None: a one-host run)."""
    c = (meta or {}).get("cluster")
    if not isinstance(c, dict) or not isinstance(c.get("members"), list):
        return None
    try:
        return [(str(m["host"]), int(m["node_rank"])) for m in c["members"]] or None
    except (KeyError, TypeError, ValueError):  # a meta.json edited by hand: read as a one-host run
        return None
