"""The flight recorder's dumps (torch.distributed, NCCL and gloo): which rank is behind, in which collective.
Stdlib only: the one parser, run in the container by the status probe (agent/probe/flightdumps.py) and on the
laptop by `diagnose` (commands/diagnose.py).

Each rank's process group keeps a ring of its latest collectives (TORCH_FR_BUFFER_SIZE, formerly
TORCH_NCCL_TRACE_BUFFER_SIZE) and, on a collective timeout (TORCH_NCCL_DUMP_ON_TIMEOUT) or on request
(`torch._C._distributed_c10d._dump_fr_trace()`), writes it to `<TORCH_FR_DUMP_TEMP_FILE><rank>`: a pickled dict
`{"version", "pg_config", "pg_status", "entries": [...]}` (or the same as JSON). `pg_status[pg]` says how far each
rank got: `last_enqueued_collective`, `last_started_collective`, `last_completed_collective` (sequence numbers).
In a hang the ranks that wait have enqueued collective N; the rank that is behind never enqueued it: its last
enqueued is lower. That rank is what to look at (its stack, its log), and N's op (all_reduce …) is where the others
wait.

Pure: bytes in, records out. Dumps are unpickled with builtins only (a dump holds nothing else; a file that holds
anything else is refused, never executed). Names carry `dump`/`_FR` (they once shared one namespace with the other
agent modules).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_FR_RANK_RE = re.compile(r"(\d+)(?:\.\w+)?$")  # `…/nccl_trace_rank_3`, `…/fr_trace_rank3.json`
_FR_SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool",
                                       "bytes", "complex")}


class DumpError(ValueError):
    """A file that is not a flight recorder dump (one line: what it is instead)."""


class _FrBuiltins(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _FR_SAFE:
            return super().find_class(module, name)
        raise DumpError(f"holds a {module}.{name}, which no flight recorder dump does")


@dataclass(frozen=True)
class Collective:
    seq: int  # collective_seq_id within its process group
    op: str  # `all_reduce`, `broadcast` … (profiling_name without its `nccl:`/`gloo:` prefix)
    state: str  # scheduled | started | completed


@dataclass(frozen=True)
class RankTrace:
    """One rank's dump, per process group: how far it got, and its recorded collectives by sequence number."""

    rank: int
    version: str
    status: dict[str, tuple[int, int, int]]  # pg → (last enqueued, last started, last completed)
    names: dict[str, str]  # pg → its name (`default_pg` …)
    entries: dict[str, dict[int, Collective]] = field(default_factory=dict)  # pg → seq → collective


@dataclass(frozen=True)
class Behind:
    """A hang's shape in one process group: who waits in which collective, who never reached it."""

    pg: str
    pg_name: str
    seq: int  # the collective the waiting ranks are in
    op: str | None  # its op, as a waiting rank recorded it
    waiting: tuple[int, ...]
    behind: tuple[int, ...]
    last: dict[int, Collective | None]  # per behind rank: its last recorded collective

    def line(self) -> str:
        ranks = ", ".join(str(r) for r in self.behind)
        lasts = "; ".join(f"rank {r}'s last: {c.op} #{c.seq}" if c else f"rank {r} recorded none"
                          for r, c in self.last.items())
        return (f"rank{'s' if len(self.behind) > 1 else ''} {ranks} behind: never entered {self.op or 'collective'} "
                f"#{self.seq} of process group {self.pg_name or self.pg}, where "
                + (f"ranks {', '.join(str(r) for r in self.waiting)} wait" if len(self.waiting) > 1
                   else f"rank {self.waiting[0]} waits" if self.waiting else "no rank waits")
                + (f" ({lasts})" if lasts else ""))

    def to_record(self) -> dict[str, Any]:
        """As JSON (the probe's reply; `behind_from_record` reads it back)."""
        return {"pg": self.pg, "pg_name": self.pg_name, "seq": self.seq, "op": self.op, "waiting": list(self.waiting),
                "behind": list(self.behind),
                "last": [[r, None if c is None else {"seq": c.seq, "op": c.op, "state": c.state}]
                         for r, c in self.last.items()]}


def behind_from_record(doc: Mapping[str, Any]) -> Behind:
    """A Behind from its `to_record()`; ValueError/TypeError/KeyError for a doc that is not one."""
    last: dict[int, Collective | None] = {}
    for r, c in doc.get("last") or ():
        last[int(r)] = None if c is None else Collective(int(c["seq"]), str(c["op"]), str(c.get("state") or ""))
    op = doc.get("op")
    return Behind(str(doc["pg"]), str(doc.get("pg_name") or ""), int(doc["seq"]), None if op is None else str(op),
                  tuple(int(r) for r in doc["waiting"]), tuple(int(r) for r in doc["behind"]), last)


def dump_rank(name: str) -> int | None:
    """The rank a dump file's name ends with (`<prefix><rank>`), None when it does not."""
    m = _FR_RANK_RE.search(name)
    return int(m.group(1)) if m else None


def load_dump(data: bytes) -> dict[str, Any]:
    """A dump's dict, from pickle or JSON bytes; DumpError for anything else."""
    doc: Any
    if data[:1] == b"\x80":
        try:
            doc = _FrBuiltins(io.BytesIO(data)).load()
        except DumpError:
            raise
        except Exception as e:  # a truncated or foreign pickle
            raise DumpError(f"not a readable pickle ({type(e).__name__}: {e})") from None
    else:
        try:
            doc = json.loads(data)
        except ValueError:
            raise DumpError("neither a pickle nor JSON") from None
    if not isinstance(doc, Mapping) or "entries" not in doc or "pg_status" not in doc:
        raise DumpError("no entries and pg_status: not a flight recorder dump")
    return dict(doc)


def parse_dump(data: bytes, rank: int) -> RankTrace:
    """One rank's dump (its rank from the file name: dumps do not say it); DumpError for anything else, a dump's
    shape with values of the wrong kind included."""
    doc = load_dump(data)
    try:
        return _fr_trace(doc, rank)
    except (TypeError, ValueError, AttributeError) as e:
        raise DumpError(f"a dump's shape with values of the wrong kind ({type(e).__name__}: {e})") from None


def _fr_trace(doc: dict[str, Any], rank: int) -> RankTrace:
    status: dict[str, tuple[int, int, int]] = {}
    for pg, st in (doc.get("pg_status") or {}).items():
        if isinstance(st, Mapping):
            status[str(pg)] = (_fr_int(st.get("last_enqueued_collective")), _fr_int(st.get("last_started_collective")),
                               _fr_int(st.get("last_completed_collective")))
    names: dict[str, str] = {}
    entries: dict[str, dict[int, Collective]] = {}
    for e in doc.get("entries") or []:
        if not isinstance(e, Mapping) or e.get("is_p2p"):
            continue
        pg_field = e.get("process_group")
        pg = str(pg_field[0]) if isinstance(pg_field, Sequence) and pg_field else str(e.get("pg_id", ""))
        if isinstance(pg_field, Sequence) and len(pg_field) > 1:
            names[pg] = str(pg_field[1])
        op = str(e.get("profiling_name") or "").split(":", 1)[-1] or "collective"
        seq = _fr_int(e.get("collective_seq_id"))
        entries.setdefault(pg, {})[seq] = Collective(seq, op, str(e.get("state") or ""))
    return RankTrace(rank, str(doc.get("version") or ""), status, names, entries)


def find_behind(traces: Sequence[RankTrace]) -> list[Behind]:
    """Per process group whose ranks disagree on how far they got: the ranks at the lowest last-enqueued collective
    are behind; the others wait in the collective after it (the first one the behind ranks never enqueued)."""
    out: list[Behind] = []
    pgs = sorted({pg for t in traces for pg in t.status})
    for pg in pgs:
        got = {t.rank: t.status[pg][0] for t in traces if pg in t.status}
        if len(got) < 2 or len(set(got.values())) < 2:
            continue
        low = min(got.values())
        lagging = tuple(sorted(r for r, s in got.items() if s == low))
        waiting = tuple(sorted(r for r, s in got.items() if s > low))
        seq = low + 1
        by_rank = {t.rank: t for t in traces}
        op = next((c.op for r in waiting if (c := by_rank[r].entries.get(pg, {}).get(seq)) is not None), None)
        name = next((by_rank[r].names[pg] for r in (*waiting, *lagging) if pg in by_rank[r].names), "")
        last = {r: by_rank[r].entries.get(pg, {}).get(low) for r in lagging}
        out.append(Behind(pg, name, seq, op, waiting, lagging, last))
    return out


def _fr_int(v: object) -> int:
    """An int, or one written as a string (the JSON dump writes pg_status's numbers so); -1 for anything else."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return -1
