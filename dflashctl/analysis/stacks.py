"""Python stack dumps as records: py-spy's `dump --json` (and its text form), and faulthandler's text.

Pure parsing: no I/O. Every parser returns ThreadStack records with the frames innermost first (the order both
tools print); a thread is named as Python names it (MainThread, coordinator, drafter-1) where the dump or the
trainer's thread map says, else by its ident. A line that is neither a header nor a frame is skipped, never an
error: these are diagnostics of a process in trouble, read as far as they go.

Formats (tests/analysis/data/stacks/ holds real ones):
- py-spy JSON: [{"pid", "thread_id", "thread_name", "os_thread_id", "active", "owns_gil", "frames": [{"name",
  "filename", "line", …}]}].
- py-spy text: `Thread 0x7F… (active): "drafter-1"` (or the native id in decimal, or no name in old versions),
  then frames `    run (trainer/pipeline.py:88)`.
- faulthandler: `Thread 0x00007f… (most recent call first):` / `Current thread 0x…`, frames
  `  File "/x.py", line 88 in run`, blocks separated by blank lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int | None
    code: str | None = None  # the line of source, read in the container (None where the file is not readable)

    def to_record(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line, "code": self.code}


@dataclass(frozen=True)
class ThreadStack:
    pid: int | None
    thread: str  # Python's name of the thread, else its ident as the dump prints it
    native_id: int | None  # the OS thread id (Linux TID), where known
    state: str | None  # py-spy: idle / active / active+gil / gil; faulthandler: "current" (the signalled thread)
    frames: list[Frame] = field(default_factory=list)  # innermost first
    ident: str | None = None  # Python's thread ident in hex

    def to_record(self) -> dict[str, Any]:
        return {"pid": self.pid, "thread": self.thread, "native_id": self.native_id, "state": self.state,
                "ident": self.ident, "frames": [f.to_record() for f in self.frames]}


@dataclass(frozen=True)
class ProcessStacks:
    """One process of a capture (the container program's record, agent/stacks.py): its threads, or why none."""

    pid: int
    role: str  # program | child | supervisor | sentinel
    argv: list[str]
    method: str | None  # "py-spy", "py-spy --nonblocking", "faulthandler"; None: not dumped (error says why)
    threads: list[ThreadStack]
    error: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. py-spy's failure where the dump signal then worked

    def to_record(self) -> dict[str, Any]:
        return {"pid": self.pid, "role": self.role, "argv": self.argv, "method": self.method, "error": self.error,
                "notes": self.notes, "threads": [t.to_record() for t in self.threads]}


Code = Mapping[str, str]  # "file:line" -> that line of source


def _frame(function: str, file: str, line: int | None, code: Code | None) -> Frame:
    return Frame(function, file, line, (code or {}).get(f"{file}:{line}") if line is not None else None)


def _state(active: object, gil: object) -> str:
    if active and gil:
        return "active+gil"
    return "active" if active else "gil" if gil else "idle"


def parse_py_spy_json(data: str | Sequence[Any], *, code: Code | None = None) -> list[ThreadStack]:
    """py-spy dump --json (the text, or the decoded list)."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return []
    out = []
    for t in data if isinstance(data, list) else []:
        if not isinstance(t, dict):
            continue
        frames = [_frame(str(f.get("name") or "?"), str(f.get("filename") or f.get("short_filename") or "?"),
                         f.get("line") if isinstance(f.get("line"), int) else None, code)
                  for f in t.get("frames") or [] if isinstance(f, dict)]
        tid = t.get("thread_id")
        ident = f"0x{tid:x}" if isinstance(tid, int) else None
        native = t.get("os_thread_id") if isinstance(t.get("os_thread_id"), int) else None
        name = t.get("thread_name") if isinstance(t.get("thread_name"), str) else None
        out.append(ThreadStack(t.get("pid") if isinstance(t.get("pid"), int) else None, name or ident or "?",
                               native, _state(t.get("active"), t.get("owns_gil")), frames, ident))
    return out


_SPY_PROCESS = re.compile(r"^Process (\d+):")
_SPY_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+)(?: \(([^)]*)\))?(?::\s*"(.*)")?\s*$')
_SPY_FRAME = re.compile(r"^(?: {4}|\t ?)(\S.*?) \(([^()]*?)(?::(\d+))?\)\s*$")


def parse_py_spy_text(text: str, *, code: Code | None = None) -> list[ThreadStack]:
    """py-spy dump's text: the id after `Thread` is the native id when decimal, Python's ident when hex."""
    pid, out = None, []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if m := _SPY_PROCESS.match(line):
            pid = int(m.group(1))
        elif m := _SPY_THREAD.match(line):
            tid, state, name = m.groups()
            hexid = tid.lower().startswith("0x")
            current = {"pid": pid, "thread": name or tid, "native_id": None if hexid else int(tid),
                       "state": state, "frames": [], "ident": tid if hexid else None}
            out.append(current)
        elif current is not None and (m := _SPY_FRAME.match(line)):
            current["frames"].append(_frame(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None, code))
    return [ThreadStack(**t) for t in out]


# Searched, not matched at the line's start: a dump copied out of a log keeps the log's prefix on every line.
_FH_THREAD = re.compile(r"(?:^|\s)(Current thread|Thread) (0x[0-9A-Fa-f]+)(.*?)(?: \(most recent call first\))?:\s*$")
_FH_STACK = re.compile(r"(?:^|\s)Stack \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'(?:^|\s)File "(.*)", line (\d+|\?+) in (.*?)\s*$')
_FH_ANY_FRAME = re.compile(r'File ".*", line \d+ in ')


def _ident_key(ident: str) -> int | None:
    try:
        return int(ident, 16)
    except ValueError:
        return None


def parse_faulthandler(text: str, *, names: Mapping[str, Any] | None = None, pid: int | None = None,
                       code: Code | None = None) -> list[ThreadStack]:
    """faulthandler's dump. names: the trainer's map {"0x00007f…": {"name", "native_id"}} (keys matched by value,
    so any zero padding works); without an entry a thread is named by its ident."""
    by_ident = {_ident_key(k): v for k, v in (names or {}).items() if isinstance(v, Mapping)}
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if m := _FH_THREAD.search(line):
            which, ident, rest = m.groups()
            known = by_ident.get(_ident_key(ident)) or {}
            label = rest.strip().strip("[]").strip() or None  # newer Pythons may print a name after the ident
            native = known.get("native_id")
            current = {"pid": pid, "thread": str(known.get("name") or label or ident),
                       "native_id": native if isinstance(native, int) else None,
                       "state": "current" if which == "Current thread" else None, "frames": [], "ident": ident}
            out.append(current)
        elif _FH_STACK.search(line):
            current = {"pid": pid, "thread": "?", "native_id": None, "state": "current", "frames": [], "ident": None}
            out.append(current)
        elif current is not None and (m := _FH_FRAME.search(line)):
            file, lineno, func = m.groups()
            current["frames"].append(_frame(func, file, int(lineno) if lineno.isdigit() else None, code))
    return [ThreadStack(**t) for t in out]


def parse_dump(raw: str, fmt: str | None = None, *, names: Mapping[str, Any] | None = None, pid: int | None = None,
               code: Code | None = None) -> list[ThreadStack]:
    """Any of the three formats; fmt ("py-spy-json", "faulthandler", "py-spy-text") or guessed from the text."""
    if fmt is None:
        stripped = raw.lstrip()
        fmt = ("py-spy-json" if stripped.startswith("[") else
               "faulthandler" if "most recent call first" in raw or _FH_ANY_FRAME.search(raw) else "py-spy-text")
    if fmt == "py-spy-json":
        threads = parse_py_spy_json(raw, code=code)
    elif fmt == "faulthandler":
        threads = parse_faulthandler(raw, names=names, pid=pid, code=code)
    else:
        threads = parse_py_spy_text(raw, code=code)
    return [t if t.pid is not None or pid is None else ThreadStack(pid, t.thread, t.native_id, t.state, t.frames,
                                                                     t.ident) for t in threads]


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def thread_order(threads: Sequence[ThreadStack]) -> list[ThreadStack]:
    """MainThread first, then by name with numbers in order (drafter-2 before drafter-10), unnamed last."""
    return sorted(threads, key=lambda t: (t.thread != "MainThread", t.thread.startswith("0x") or t.thread == "?",
                                          _natural(t.thread)))


def processes_from_capture(doc: Mapping[str, Any]) -> list[ProcessStacks]:
    """The container program's capture doc (agent/stacks.py) as records, each process's threads in thread_order."""
    out = []
    for rec in doc.get("processes") or []:
        if not isinstance(rec, Mapping) or not isinstance(rec.get("pid"), int):
            continue
        threads: list[ThreadStack] = []
        if rec.get("method") and isinstance(rec.get("raw"), str):
            threads = parse_dump(rec["raw"], rec.get("format"), names=rec.get("threads"), pid=rec["pid"],
                                 code=rec.get("code") if isinstance(rec.get("code"), Mapping) else None)
        error = rec.get("error")
        if rec.get("method") and not threads and not error:
            error = f"{rec['method']} gave no Python thread"
        argv = rec.get("argv")
        out.append(ProcessStacks(rec["pid"], str(rec.get("role") or "child"),
                                 [str(a) for a in argv] if isinstance(argv, list) else [],
                                 rec.get("method") if threads else None, thread_order(threads),
                                 str(error) if error else None, [str(n) for n in rec.get("notes") or []]))
    return out
