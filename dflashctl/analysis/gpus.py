"""nvidia-smi and NVML readings → GpuSample / GpuProcess. Pure: text and dicts in, records out.

Accepted (the shapes people actually save and the probe actually returns):
- `nvidia-smi --query-gpu=F,… --format=csv[,noheader][,nounits]`, e.g. the seed's `0, 88283 MiB, 0 %`;
  several samples in one file (`-l SEC` repeats the header, or rows restart at the first index);
- `nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid` (header `used_gpu_memory [MiB]`);
- the plain `nvidia-smi` table (`|  88283MiB /  81559MiB |  0%  Default |`);
- NVML readings as dicts (the probe's `gpus.nvml`); the probe's whole GPU piece (model.GpuReport): from_probe.
`[N/A]`, `[Not Supported]`, `[Unknown Error]`, `[GPU is lost]` … become None, decided here, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from time import strptime
from typing import Any

from dflashctl.model import GpuProcess, GpuReport, GpuSample

# The probe's query (DESIGN §3); also the assumption for headerless rows with this many columns.
PROBE_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu", "power.draw")
SEED_FIELDS = ("index", "memory.used", "utilization.gpu")

_FIELD_ALIASES = {
    "gpu_uuid": "uuid", "gpu_name": "name", "used_gpu_memory": "used_memory", "utilization.gpu": "utilization.gpu",
    "power.draw.instant": "power.draw", "power.draw.average": "power.draw",
}
_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")  # `memory.used [MiB]` → memory.used
_VALUE_UNIT_RE = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|%|W|MHz|C)?\s*$")
_UUID_RE = re.compile(r"^(?:GPU|MIG)-[0-9a-fA-F-]+$")


class GpuParseError(ValueError):
    """Text that is not nvidia-smi output we understand (one line, for the CLI's error message)."""


@dataclass(frozen=True)
class GpuReading:
    """Everything one nvidia-smi/NVML text gave: samples (possibly several sweeps) and processes."""

    samples: tuple[GpuSample, ...]
    processes: tuple[GpuProcess, ...] = ()


def na(value: str | None) -> str | None:
    """The single "not available" decision: bracketed nvidia-smi placeholders and blanks are None."""
    if value is None:
        return None
    v = value.strip()
    if not v or v.startswith("[") or v in ("N/A", "Not Supported", "-"):
        return None
    return v


def csv_number(value: str | None, *, to_mib: bool = False) -> float | None:
    v = na(value)
    if v is None:
        return None
    m = _VALUE_UNIT_RE.match(v)
    if not m:
        return None
    x = float(m.group(1))
    if to_mib and m.group(2) == "GiB":
        x *= 1024
    elif to_mib and m.group(2) == "KiB":
        x /= 1024
    return x


def _timestamp(value: str | None) -> float | None:
    v = na(value)
    if v is None:
        return None
    from calendar import timegm  # (and datetime): only a CSV with a timestamp column, which the probe's has not

    base, _, frac = v.partition(".")
    for fmt in ("%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return timegm(strptime(base, fmt)) + (float("0." + frac) if frac.isdigit() else 0.0)
        except ValueError:
            continue
    return None


def field_name(header_cell: str) -> str:
    name = _UNIT_RE.sub("", header_cell).strip()
    return _FIELD_ALIASES.get(name, name)


def is_header(cells: Sequence[str]) -> bool:
    return any(c.strip() in ("index", "pid", "uuid", "name", "timestamp") or "[" in c and "]" in c
               and not c.strip().startswith("[") for c in cells)


def _guess_fields(cells: Sequence[str]) -> tuple[str, ...]:
    """Headerless rows: name columns by their units (`MiB`, `%`, `W`, `GPU-…`), else by count."""
    if len(cells) == len(PROBE_FIELDS) and _UUID_RE.match(cells[1].strip()):
        return PROBE_FIELDS
    names: list[str] = []
    mib_seen = 0
    for i, c in enumerate(cells):
        v = c.strip()
        if _UUID_RE.match(v):
            names.append("uuid")
        elif v.endswith("MiB"):
            names.append("memory.used" if mib_seen == 0 else "memory.total")
            mib_seen += 1
        elif v.endswith("%"):
            names.append("utilization.gpu")
        elif v.endswith(" W"):
            names.append("power.draw")
        elif i == 0 and v.isdigit():
            names.append("index")
        elif "name" not in names and v and not _VALUE_UNIT_RE.match(v) and na(v) is not None:
            names.append("name")
        else:
            names.append(f"col{i}")
    if "memory.used" not in names and len(cells) == len(SEED_FIELDS):
        return SEED_FIELDS  # `--format=csv,noheader,nounits` of the seed's query
    return tuple(names)


def _sample(rec: Mapping[str, str], position: int) -> GpuSample:
    idx = csv_number(rec.get("index"))
    return GpuSample(
        index=int(idx) if idx is not None else position,
        uuid=na(rec.get("uuid")),
        name=na(rec.get("name")),
        memory_used_mib=csv_number(rec.get("memory.used"), to_mib=True),
        memory_total_mib=csv_number(rec.get("memory.total"), to_mib=True),
        utilization_pct=csv_number(rec.get("utilization.gpu")),
        power_w=csv_number(rec.get("power.draw")),
        timestamp=_timestamp(rec.get("timestamp")),
    )


def csv_rows(text: str, fields: Sequence[str] | None = None,
             aliases: Mapping[str, str] | None = None) -> Iterator[tuple[str, list[str], tuple[str, ...] | None, int]]:
    """(line, cells, column names in force, position since the last header) for each data row of `--query-*` CSV:
    a header line (any --format) names the columns that follow; fields names those of headerless text. The one
    reader of the rows, for the samples here and the health columns (gpuhealth.py)."""
    names = {**_FIELD_ALIASES, **(aliases or {})}
    cols: tuple[str, ...] | None = tuple(names.get(f, f) for f in fields) if fields else None
    position = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")]
        if is_header(cells):
            cols = tuple(names.get(n, n) for n in (field_name(c) for c in cells))
            position = 0
            continue
        yield line, cells, cols, position
        position += 1


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> GpuReading:
    """`--query-gpu` or `--query-compute-apps` CSV (any --format variant); fields names the columns of
    headerless output when known (else a header in the text, else a guess from units and count)."""
    samples: list[GpuSample] = []
    procs: list[GpuProcess] = []
    for line, cells, cols, position in csv_rows(text, fields):
        if len(cells) < 2 and not (cols and len(cols) == 1):
            raise GpuParseError(f"not nvidia-smi CSV: {line[:100]!r}")
        names = cols if cols and len(cols) == len(cells) else _guess_fields(cells)
        rec = dict(zip(names, cells, strict=False))
        if "pid" in rec:
            pid = csv_number(rec["pid"])
            if pid is None:
                raise GpuParseError(f"compute-apps row without a pid: {line[:100]!r}")
            procs.append(GpuProcess(int(pid), csv_number(rec.get("used_memory"), to_mib=True), na(rec.get("uuid"))))
            continue
        if not any(k in rec for k in ("memory.used", "utilization.gpu", "uuid", "power.draw")):
            raise GpuParseError(f"cannot tell which nvidia-smi columns these are: {line[:100]!r}")
        samples.append(_sample(rec, position))
    return GpuReading(tuple(samples), tuple(procs))


_TABLE_MEM_RE = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_TABLE_UTIL_RE = re.compile(r"(\d+|N/A)\s*%\s+(?:Default|E\. Process|Prohibited|Exclusive_Process|N/A)")
_TABLE_POWER_RE = re.compile(r"(\d+(?:\.\d+)?)\s*W\s*/\s*(\d+(?:\.\d+)?)\s*W")
_TABLE_GPU_RE = re.compile(r"^\|\s+(\d+)\s+(\S.*?)\s{2,}")


def parse_table(text: str) -> GpuReading:
    """The plain `nvidia-smi` table: index on the first line of each GPU, memory/util/power on either."""
    samples: list[GpuSample] = []
    index: int | None = None
    name: str | None = None
    for line in text.splitlines():
        g = _TABLE_GPU_RE.match(line)
        if g and ("MiB" in line or "|" in line[5:]):
            index, name = int(g.group(1)), re.sub(r"\s+(?:On|Off)$", "", g.group(2).strip())
        mem = _TABLE_MEM_RE.search(line)
        if mem and index is not None:
            util = _TABLE_UTIL_RE.search(line)
            power = _TABLE_POWER_RE.search(line)
            samples.append(GpuSample(
                index=index, name=name,
                memory_used_mib=float(mem.group(1)), memory_total_mib=float(mem.group(2)),
                utilization_pct=float(util.group(1)) if util and util.group(1) != "N/A" else None,
                power_w=float(power.group(1)) if power else None,
            ))
            index = None
    return GpuReading(tuple(samples))


def parse_nvidia_smi(text: str, fields: Sequence[str] | None = None) -> GpuReading:
    """Any saved nvidia-smi output we know: CSV query output, or the plain table."""
    stripped = text.strip()
    if not stripped:
        return GpuReading(())
    if "No devices were found" in stripped:
        return GpuReading(())
    if "NVIDIA-SMI has failed" in stripped or "couldn't communicate with the NVIDIA driver" in stripped:
        raise GpuParseError("nvidia-smi could not talk to the driver: " + stripped.splitlines()[0][:120])
    if "MiB /" in stripped and "|" in stripped:
        return parse_table(text)
    return parse_query_csv(text, fields)


def from_nvml(readings: Iterable[Mapping[str, Any]], timestamp: float | None = None) -> tuple[GpuSample, ...]:
    """The probe's NVML dicts ({index, uuid, name, memory_used_mib, …}); missing keys are None."""
    out = []
    for i, r in enumerate(readings):
        def num(key: str, r: Mapping[str, Any] = r) -> float | None:
            v = r.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        idx = r.get("index")
        out.append(GpuSample(
            index=int(idx) if isinstance(idx, int) else i,
            uuid=r.get("uuid") or None,
            name=r.get("name") or None,
            memory_used_mib=num("memory_used_mib"),
            memory_total_mib=num("memory_total_mib"),
            utilization_pct=num("utilization_pct"),
            power_w=num("power_w"),
            timestamp=num("time") or timestamp,
        ))
    return tuple(out)


def sweeps(samples: Sequence[GpuSample]) -> list[tuple[GpuSample, ...]]:
    """Split a flat list into per-time sweeps: a new sweep starts when an index repeats (or time moves)."""
    out: list[list[GpuSample]] = []
    seen: set[int] = set()
    for s in samples:
        if not out or s.index in seen:
            out.append([])
            seen = set()
        out[-1].append(s)
        seen.add(s.index)
    return [tuple(x) for x in out]


def from_probe(report: GpuReport | None, now: float | None = None,
               ) -> tuple[tuple[GpuSample, ...] | None, str | None]:
    """The readings in one probe report's GPU piece (NVML records, or nvidia-smi CSV: its header names the columns;
    a headerless one from an older probe is in PROBE_FIELDS order), or why there are none: the one reading of it
    that `status`, `stop` and `launch` share."""
    if report is None:
        return None, None
    try:
        if report.source == "nvml":
            return from_nvml(report.nvml, now), report.error
        if report.source == "nvidia-smi" and report.smi_csv is not None:
            return parse_query_csv(report.smi_csv, PROBE_FIELDS).samples, report.error
    except GpuParseError as e:
        return None, str(e)
    return None, report.error


def memory_by_index(report: GpuReport | None) -> dict[int, float]:
    """GPU index → memory used (MiB) in a probe report's GPU piece; {} when unreadable."""
    samples, _ = from_probe(report)
    return {s.index: s.memory_used_mib for s in samples or () if s.memory_used_mib is not None}
