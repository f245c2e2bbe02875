"""A run's meta.json as one typed record, read here and nowhere else (stdlib only: the container's programs and the
laptop read it alike).

The launcher writes meta.json once, when it makes the run directory (agent/launcher.py, agent/lib/adoption.py, both
through `write_meta`): what was started, where, by whom, and how it relates to other runs (a restart's chain, a run
across hosts). Readers get a RunMeta from
`from_record` (the probe sends the file as it is) or `read_meta` (a program in the container). Forward and backward
compatible: a key this version does not know is kept in `extra` and written back unchanged by `to_record`; a key
that is missing or has the wrong type takes its default, so a run written by an older or newer dflashctl, or a
meta.json edited by hand, still reads (never a traceback).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dflashctl.agent.lib.fsutil import write_atomic

META_FILE = "meta.json"
JOB_KINDS = ("eval", "generate")  # runs that are not training: they log no steps (`dflashctl eval` / `generate`)


# A JSON value of the wrong type reads as None (report.py parses probe JSON with these too).
def as_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def as_int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def as_float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _dict(v: object) -> dict[str, Any] | None:
    return dict(v) if isinstance(v, Mapping) else None


@dataclass(frozen=True)
class RunMeta:
    """What meta.json records (DESIGN §4). None: not recorded (an older run, an adopted one, a hand edit)."""

    id: str | None = None
    name: str | None = None
    kind: str = "train"  # train | exec | adopted | eval | generate (a kind a newer version adds: kept as is)
    host: str | None = None  # the hosts.toml name it was launched as
    container: int | None = None
    argv: tuple[str, ...] = ()
    cwd: str | None = None
    started_at: str | None = None  # ISO, UTC
    started_at_epoch: float | None = None  # the container's clock
    code_hash: str | None = None
    git_sha: str | None = None
    job: str | None = None  # eval / generate: one line saying what it does
    config: dict[str, Any] | None = None
    gpus: dict[str, Any] | None = None  # {"target": [..], "drafters": [..]}
    resumed_from: dict[str, Any] | None = None  # {"run", "checkpoint", "step", "linked"}
    adopted: dict[str, Any] | None = None  # an adopted run's process identity {pid, starttime, boot_time, cmdline …}
    restart_of: str | None = None  # the attempt this one restarts
    chain: dict[str, Any] | None = None  # {"first", "previous", "attempt", "attempts_max"} of a launch that restarts
    cluster: dict[str, Any] | None = None  # a run across hosts: {"name", "node_rank", "members": [{host, node_rank}]…}
    extra: dict[str, Any] = field(default_factory=dict)  # every other key, as recorded

    @classmethod
    def from_record(cls, doc: object) -> RunMeta:
        """The record of a parsed meta.json (anything that is not an object reads as an empty record)."""
        if not isinstance(doc, Mapping):
            return cls()
        kind = as_str(doc.get("kind"))
        argv = doc.get("argv")
        return cls(
            id=as_str(doc.get("id")), name=as_str(doc.get("name")), kind=kind or "train",
            host=as_str(doc.get("host")), container=as_int(doc.get("container")),
            argv=tuple(str(a) for a in argv) if isinstance(argv, list) else (),
            cwd=as_str(doc.get("cwd")), started_at=as_str(doc.get("started_at")),
            started_at_epoch=as_float(doc.get("started_at_epoch")), code_hash=as_str(doc.get("code_hash")),
            git_sha=as_str(doc.get("git_sha")), job=as_str(doc.get("job")), config=_dict(doc.get("config")),
            gpus=_dict(doc.get("gpus")), resumed_from=_dict(doc.get("resumed_from")),
            adopted=_dict(doc.get("adopted")),
            restart_of=as_str(doc.get("restart_of")), chain=_dict(doc.get("chain")), cluster=_dict(doc.get("cluster")),
            extra={k: v for k, v in doc.items() if k not in _KNOWN},
        )

    def to_record(self) -> dict[str, Any]:
        """meta.json's JSON: the keys this version knows (None ones left out), then every other key as read."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "extra" and v is not None and v != ():
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return {**out, **self.extra}

    @property
    def is_job(self) -> bool:
        """An evaluation or a data generation: it logs no training steps (exec and adopted runs train)."""
        return self.kind in JOB_KINDS

    @property
    def job_line(self) -> str | None:
        """What a job does, for a person ("evaluating run X"); None for a training run."""
        return (self.job or f"a {self.kind} run") if self.is_job else None

    @property
    def adopted_identity(self) -> dict[str, Any] | None:
        """The process an adopted run is ({pid, starttime, …}; {} when not recorded); None for runs we started
        (their identity is the DFLASH_RUN_ID marker)."""
        return None if self.kind != "adopted" else dict(self.adopted or {})

    @property
    def attempt(self) -> int | None:
        """Which attempt of a launch with --restart-on this run is (None: a launch without restarts)."""
        return as_int((self.chain or {}).get("attempt"))

    @property
    def attempt_label(self) -> str:
        """`2/4 after <previous run>` for a run of a restart chain, else `-`."""
        if self.attempt is None:
            return "-"
        chain = self.chain or {}
        prev = chain.get("previous")
        return f"{self.attempt}/{chain.get('attempts_max') or '?'}" + (f" after {prev}" if prev else "")

    @property
    def members(self) -> list[tuple[str, int]] | None:
        """[(host, node_rank)] of a run across hosts (None: a one-host run, or a `cluster` edited out of shape)."""
        found = (self.cluster or {}).get("members")
        if not isinstance(found, list):
            return None
        try:
            return [(str(m["host"]), int(m["node_rank"])) for m in found] or None
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def lead_rank(self) -> int:
        """The lowest global rank on this node of a run across hosts (node_rank x nproc_per_node); 0 otherwise."""
        c = self.cluster or {}
        try:
            return int(c["node_rank"]) * int(c.get("nproc_per_node") or 1) if "node_rank" in c else 0
        except (TypeError, ValueError):
            return 0


_KNOWN = frozenset(f.name for f in fields(RunMeta)) - {"extra"}


def read_meta(run_dir: str) -> RunMeta:
    """The run's meta.json (an empty record when it is missing or not JSON: the run still lists)."""
    try:
        with open(os.path.join(run_dir, META_FILE), "rb") as f:
            doc = json.loads(f.read(1 << 20).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return RunMeta()
    return RunMeta.from_record(doc)


def write_meta(run_dir: str, record: Mapping[str, Any]) -> RunMeta:
    """Write the run's meta.json from record, through RunMeta (the one writer: known keys typed, others kept as
    given), atomically; the RunMeta written."""
    meta = RunMeta.from_record(record)
    write_atomic(os.path.join(run_dir, META_FILE), (json.dumps(meta.to_record(), indent=2) + "\n").encode())
    return meta
