"""A run's events (<run>/events.jsonl) as records: what the sentinel appends (sentinel/events.py says which kinds
and their fields) and what `status --events`, `runs` and `logs --events` read back. Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EVENTS_FILE = "events.jsonl"
_CORE = ("t", "kind", "run", "verdict", "message")


@dataclass(frozen=True)
class Event:
    t: float
    kind: str
    run: str
    verdict: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "run": self.run, "verdict": self.verdict, "message": self.message,
                **{k: v for k, v in self.data.items() if k not in _CORE}}

    def to_line(self) -> bytes:
        """One line of events.jsonl (short enough for one atomic O_APPEND write in practice)."""
        return (json.dumps(self.to_record(), separators=(",", ":"), default=str) + "\n").encode()

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Event:
        t = rec.get("t")
        return cls(float(t) if isinstance(t, int | float) and not isinstance(t, bool) else 0.0,
                   str(rec.get("kind") or "?"), str(rec.get("run") or ""), str(rec.get("verdict") or ""),
                   str(rec.get("message") or ""), {k: v for k, v in rec.items() if k not in _CORE})


def read_events(text: str | bytes) -> list[Event]:
    """Every whole event in an events.jsonl text, in order; a torn last line (being written) or a line that is not
    an object is skipped."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(Event.from_record(rec))
    return out
