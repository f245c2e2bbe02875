"""diagnose: the status engine on copied files — logs, saved nvidia-smi output, a copied run directory.

Offline by design: it reads only the files it is given, so it works on a laptop with a log pasted from
a chat, and gives the same verdict `status` would have given with the same evidence.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashctl.agent.lib import flightrec
from dflashctl.agent.lib.flightrec_env import DUMP_DIR
from dflashctl.analysis.gpus import GpuParseError, parse_nvidia_smi, sweeps
from dflashctl.analysis.health import Evidence, GpuSweep, Health, ProcessState, judge
from dflashctl.analysis.logscan import LogReport, LogScanner
from dflashctl.analysis.progress import ProgressRegexError, custom
from dflashctl.analysis.smiq import looks_like_q
from dflashctl.errors import ConfigError
from dflashctl.model import GpuReport
from dflashctl.remote.masterwire import read_info


@dataclass
class Diagnosis:
    health: Health
    log: LogReport
    sources: list[str] = field(default_factory=list)  # what was read, in order
    behind: list[flightrec.Behind] = field(default_factory=list)  # the flight recorder's dumps: who is behind, where

    def to_record(self) -> dict[str, Any]:
        """`diagnose --json`: the health record, and what the flight recorder's dumps say when any were read."""
        rec = self.health.to_record()
        if self.behind:
            rec["flight_recorder"] = [{"process_group": b.pg_name or b.pg, "collective": b.op, "seq": b.seq,
                                       "behind": list(b.behind), "waiting": list(b.waiting), "summary": b.line()}
                                      for b in self.behind]
        return rec


def _dumps(paths: list[Path]) -> tuple[list[flightrec.RankTrace], list[str]]:
    """The flight recorder dumps among paths (files named `<prefix><rank>`), parsed; a file that is not one is a
    one-line usage error."""
    traces, sources = [], []
    for path in paths:
        rank = flightrec.dump_rank(path.name)
        if rank is None:
            raise ConfigError(f"{path}: a flight recorder dump's name ends with its rank",
                              hint="keep torch's file names (…nccl_trace_rank_3)")
        try:
            traces.append(flightrec.parse_dump(_read(path), rank))
        except flightrec.DumpError as e:
            raise ConfigError(f"{path}: {e}", hint="pass flight recorder dumps as written by torch "
                              "(TORCH_FR_DUMP_TEMP_FILE), or a run directory") from None
        sources.append(str(path))
    return traces, sources


def _is_dump(path: Path) -> bool:
    """A flight recorder dump given as a LOG: torch's own file name (a pickle or JSON trace of one rank)."""
    return path.is_file() and "trace_rank_" in path.name


def user_progress(pattern: str | None) -> re.Pattern[str] | None:
    """A user's progress regex, compiled and checked; a bad one is a one-line usage error (exit 2)."""
    if pattern is None:
        return None
    try:
        return custom(pattern)
    except ProgressRegexError as e:
        example = r"it (?P<step>\d+)/(?P<total>\d+) .*loss (?P<loss>[\d.]+)"
        raise ConfigError(str(e), hint=f"e.g. --progress-regex '{example}'") from None


def _read(path: Path) -> bytes:
    if str(path) == "-":
        return sys.stdin.buffer.read()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}", hint="diagnose reads copied files: LOG… and --gpus FILE") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory", hint="pass a run directory only as a LOG argument") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None


def _feed_file(scanner: LogScanner, path: Path) -> None:
    """Scan a log file mapped, in one go (LogScanner.feed_file: a multi-GB log is never read into memory whole,
    and only its end's progress lines are parsed)."""
    if str(path) == "-":
        scanner.feed(sys.stdin.buffer.read())
        return
    try:
        with path.open("rb") as f:
            scanner.feed_file(f)
    except FileNotFoundError:
        raise ConfigError(f"no such file: {path}", hint="diagnose reads copied files: LOG… and --gpus FILE") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None


def _rotated_logs(run_dir: Path) -> list[Path]:
    """train.log.N … train.log.1, train.log: oldest first, as they were written."""
    def n(p: Path) -> int:
        m = re.search(r"\.(\d+)$", p.name)
        return int(m.group(1)) if m else 0

    rotated = sorted(run_dir.glob("train.log.*"), key=n, reverse=True)
    return [p for p in rotated if n(p) > 0] + ([run_dir / "train.log"] if (run_dir / "train.log").exists() else [])


def diagnose(logs: list[Path], gpu_files: list[Path], *, progress_regex: str | None = None,
             kernel_logs: list[Path] = ()) -> Diagnosis:
    """Judge the given logs (several are read as one, in order), nvidia-smi samples (a --query-gpu CSV with the
    health columns gives their findings too; a saved `nvidia-smi -q` gives health findings only, no memory or
    utilisation samples) and saved kernel logs (`dmesg`, `journalctl -k`: their Xid lines).

    A run directory as a LOG brings its rotated logs, errors/*.json, heartbeat.json and exit_code.
    progress_regex: the user's own progress format (analysis.progress.custom)."""
    if not logs and not gpu_files and not kernel_logs:  # (dumps come as LOGs)
        raise ConfigError("nothing to diagnose", hint="dflashctl diagnose train.log [--gpus nvidia-smi.txt]")
    scanner = LogScanner(user_progress(progress_regex))
    sources: list[str] = []
    errors: dict[str, dict[str, Any]] = {}
    heartbeat: dict[str, Any] | None = None
    process = ProcessState()
    dump_files = [p for p in logs if _is_dump(p)]
    logs = [p for p in logs if p not in dump_files]
    for path in logs:
        if path.is_dir():
            dump_files += sorted(f for f in (path / DUMP_DIR).glob("*") if f.is_file())
            files = _rotated_logs(path)
            if not files and not (path / "errors").is_dir():
                raise ConfigError(f"{path} has no train.log", hint="pass the run directory or its train.log")
            for f in files:
                _feed_file(scanner, f)
                scanner.flush()
                sources.append(str(f))
            for f in sorted((path / "errors").glob("*.json")):
                doc = read_info(f)
                if doc is not None:
                    errors[f.stem] = doc
            heartbeat = read_info(path / "heartbeat.json") or heartbeat
            code = (path / "exit_code").read_text().strip() if (path / "exit_code").exists() else ""
            if code.lstrip("-").isdigit():
                process = ProcessState(alive=False, exit_code=int(code), stopped=(path / "stopped").exists())
            continue
        _feed_file(scanner, path)
        scanner.flush()  # a traceback never spans two files
        sources.append(str(path))
    gpu_sweeps: list[GpuSweep] = []
    last_csv: GpuReport | None = None
    for path in gpu_files:
        text = _read(path).decode("utf-8", "replace")
        if looks_like_q(text):  # `nvidia-smi -q`: its health readings (analysis/smiq.py), no samples to judge
            last_csv = GpuReport(source="nvidia-smi-q", smi_csv=text)
            sources.append(str(path))
            continue
        last_csv = GpuReport(source="nvidia-smi", smi_csv=text)  # the health columns, where the file has them
        try:
            reading = parse_nvidia_smi(text)
        except GpuParseError as e:
            raise ConfigError(f"{path}: {e}", hint="save `nvidia-smi --query-gpu=index,memory.used,"
                              "utilization.gpu --format=csv` or plain `nvidia-smi` output (`nvidia-smi -q`: "
                              "health only)") from None
        for sw in sweeps(list(reading.samples)):
            times = [s.timestamp for s in sw if s.timestamp is not None]
            gpu_sweeps.append(GpuSweep(max(times) if times else None, sw))
        sources.append(str(path))
    report = scanner.report()
    times = [s.time for s in gpu_sweeps if s.time is not None]
    now = max(times) if times and len(times) == len(gpu_sweeps) else None
    xid_lines: list[str] = []
    for path in kernel_logs:
        xid_lines += _read(path).decode("utf-8", "replace").splitlines()
        sources.append(str(path))
    traces, dump_sources = _dumps(dump_files)
    sources += dump_sources
    ev = Evidence(now=now, process=process, log=report, sweeps=gpu_sweeps, errors=errors, heartbeat=heartbeat,
                  gpu_report=last_csv, xid_lines=xid_lines)
    return Diagnosis(judge(ev), report, sources, flightrec.find_behind(traces))
