"""Python stacks of a process, read from outside it (stdlib only): py-spy, or our trainer's dump signal.

py-spy reads the interpreter's memory (ptrace); `dump --json` gives every thread with its name and native id. Without
it, a process that registered the trainer's dump signal (trainer/threaddump.py: faulthandler on SIGUSR1, all
threads, into <run>/stacks/faulthandler-<pid>.txt, with stacks/threads-<pid>.json naming each thread ident) is
signalled and its file read. A process is signalled only when both hold: the map exists AND /proc/PID/status says it
catches SIGUSR1 (its default action would end it). Neither tool prints a frame's line of code, so it is read here,
in the container, where the files are.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile

from dflashctl.agent.lib.fsutil import read_bytes, read_json
from dflashctl.agent.lib.procfs import proc_stat

DUMP_SIGNAL = signal.SIGUSR1
STACKS_DIR = "stacks"  # in the run directory
PY_SPY_TIMEOUT_S = 10.0  # per process, both attempts together
DUMP_WAIT_S = 5.0  # for the dump file to grow after the signal
MAX_CODE_LINES = 4000
_FH_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in ')


def find_py_spy() -> str | None:
    """py-spy on PATH, else beside this interpreter (a venv's bin/, which PATH may not name)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None


def py_spy_version(exe: str) -> str | None:
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.decode("utf-8", "replace").strip() or None


def _live(pid: int, starttime: int | None) -> bool:
    st = proc_stat(pid)
    return st is not None and st["state"] not in ("Z", "X") and (starttime is None or st["starttime"] == starttime)


def _state(pid: int) -> str | None:
    st = proc_stat(pid)
    return st["state"] if st else None


def py_spy_error(text: bytes) -> str:
    """py-spy's failure in one line: its `Error: …` line and the first cause (no Rust backtrace)."""
    lines = [ln.strip() for ln in text.decode("utf-8", "replace").splitlines() if ln.strip()]
    first = next((ln[len("Error:"):].strip() for ln in lines if ln.startswith("Error:")), None)
    if first is None:
        return (lines[-1] if lines else "no output")[:300]
    causes = [ln.split(":", 1)[1].strip() for ln in lines if re.match(r"^\d+: ", ln)]
    return (first + (f" ({causes[0]})" if causes else ""))[:300]


def py_spy_dump(exe: str, pid: int, starttime: int | None) -> dict:
    """`py-spy dump --pid PID --json`; on failure once more with --nonblocking (it does not stop the process with
    ptrace, which some containers refuse). {"method", "raw"} or {"error"}; never longer than PY_SPY_TIMEOUT_S."""
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
    deadline = time.monotonic() + PY_SPY_TIMEOUT_S
    errors: list[str] = []
    for extra in ([], ["--nonblocking"]):
        label = " ".join(["py-spy", *extra])
        left = deadline - time.monotonic()
        if left < 0.5 or not _live(pid, starttime):
            break
        before = _state(pid)
        try:
            p = subprocess.run([exe, "dump", "--pid", str(pid), "--json", *extra], capture_output=True, timeout=left,
                               env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            _resume_if_left_stopped(pid, before)
            errors.append(f"{label}: no answer within {PY_SPY_TIMEOUT_S:.0f} s")
            continue
        except OSError as e:
            errors.append(f"{label}: cannot run {exe}: {e.strerror or e}")
            break
        if p.returncode == 0 and p.stdout.lstrip().startswith(b"["):
            return {"method": label, "format": "py-spy-json", "raw": p.stdout.decode("utf-8", "replace"),
                    "notes": errors}
        why = py_spy_error(p.stderr or p.stdout)
        errors.append(f"{label}: {why}")
        if "python version" in why.lower():  # not a Python process: --nonblocking would not change that
            break
    if not _live(pid, starttime):
        errors.append("the process ended")
    return {"error": "; ".join(errors) or f"py-spy: no time left for pid {pid}"}


def _resume_if_left_stopped(pid: int, before: str | None) -> None:
    """A py-spy killed at its timeout may leave the process stopped (py-spy#390): continue it if it was not."""
    if before not in ("T", "t") and _state(pid) in ("T", "t"):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)


def dump_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, STACKS_DIR, f"faulthandler-{pid}.txt")


def threads_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, STACKS_DIR, f"threads-{pid}.json")


def catches(pid: int, sig: int) -> bool:
    """The process has a handler for sig (SigCgt in /proc/PID/status)."""
    for line in (read_bytes(f"/proc/{pid}/status", 1 << 16) or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def has_dump_signal(run_dir: str, pid: int) -> bool:
    """The trainer's dump signal is registered: its thread map exists and it catches SIGUSR1."""
    return os.path.isfile(threads_path(run_dir, pid)) and catches(pid, DUMP_SIGNAL)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def signal_dumps(run_dir: str, targets: dict) -> dict:
    """Send the dump signal to every pid of targets (pid -> start time, re-checked right before the signal) at once
    and read what each appends to its dump file: pid -> {"method", "raw", "threads"} or {"error"}. Waits at most
    DUMP_WAIT_S for all together; a dump is complete once its file has grown and then not grown for two polls."""
    if not targets:
        return {}
    try:
        lock = os.open(os.path.join(run_dir, STACKS_DIR, ".signal.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        lock = None  # a read-only run directory: dump unlocked
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two captures at once (the sentinel's, a user's) would mix their dumps
        return _signal_dumps(run_dir, targets)
    finally:
        if lock is not None:
            os.close(lock)


def _signal_dumps(run_dir: str, targets: dict) -> dict:
    results: dict = {}
    start_size: dict = {}
    for pid, starttime in targets.items():
        if not _live(pid, starttime):
            results[pid] = {"error": "the process ended"}
            continue
        start_size[pid] = _size(dump_path(run_dir, pid))
        try:
            os.kill(pid, DUMP_SIGNAL)
        except OSError as e:
            results[pid] = {"error": f"cannot signal it: {e.strerror or e}"}
            del start_size[pid]
    seen = dict(start_size)
    still = {pid: 0 for pid in start_size}  # polls since the file last grew
    pending = set(start_size)
    deadline = time.monotonic() + DUMP_WAIT_S
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid in sorted(pending):
            size = _size(dump_path(run_dir, pid))
            still[pid] = still[pid] + 1 if size == seen[pid] else 0
            seen[pid] = size
            if size > start_size[pid] and still[pid] >= 2:  # grown, then quiet for 0.1 s: the handler is done
                pending.discard(pid)
    for pid, size0 in start_size.items():
        if seen[pid] <= size0:
            state = _state(pid)
            results[pid] = {"error": f"no dump within {DUMP_WAIT_S:.0f} s of SIGUSR1"
                            + (f" (process state {state})" if state else " (gone)")}
            continue
        raw = _read_from(dump_path(run_dir, pid), size0)
        names = read_json(threads_path(run_dir, pid)) or {}
        results[pid] = {"method": "faulthandler", "format": "faulthandler", "raw": raw,
                        "threads": {k: v for k, v in names.items() if isinstance(v, dict)}}
    return results


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(4 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def frame_locations(fmt: str, raw: str) -> list[tuple[str, int]]:
    """(file, line) of every frame of a dump, to look their code up."""
    found: list[tuple[str, int]] = []
    if fmt == "py-spy-json":
        try:
            threads = json.loads(raw)
        except ValueError:
            return found
        for t in threads if isinstance(threads, list) else []:
            for fr in (t.get("frames") or []) if isinstance(t, dict) else []:
                if isinstance(fr, dict) and isinstance(fr.get("filename"), str) and isinstance(fr.get("line"), int):
                    found.append((fr["filename"], fr["line"]))
    else:
        for line in raw.splitlines():
            m = _FH_FRAME.match(line)
            if m:
                found.append((m.group(1), int(m.group(2))))
    return found


def code_lines(pid: int, locations: list[tuple[str, int]]) -> dict:
    """"file:line" -> that line of code, stripped (linecache; relative paths from the process's cwd). Files that
    cannot be read (`<frozen runpy>`, `<string>`, deleted) are left out. A frame of the agent archive names the
    install it was compiled in (`<ws>/.agent/<sha>.pyz/…`), which an install may have pruned since: then the line is
    read from the process's own archive (a run's supervisor and sentinel run `<run>/agent.pyz`, the same bytes)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    own = _own_archive(pid, cwd)
    out: dict = {}
    checked: set = set()
    for file, line in locations:
        key = f"{file}:{line}"
        if key in out or len(out) >= MAX_CODE_LINES or file.startswith("<"):
            continue
        path = file if os.path.isabs(file) or cwd is None else os.path.join(cwd, file)
        if path not in checked:
            linecache.checkcache(path)  # a long-lived caller (the sentinel) must not serve a file's old text
            checked.add(path)
        text = linecache.getline(path, line).strip() or _zipped_line(path, line, own)
        if text:
            out[key] = text[:300]
    return out


def _own_archive(pid: int, cwd: str | None) -> str | None:
    """The .pyz the process runs (its argv's first one), absolute; None when it runs none."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    for arg in argv[1:]:
        if arg.endswith(".pyz"):
            return arg if os.path.isabs(arg) or cwd is None else os.path.join(cwd, arg)
    return None


def _zipped_line(path: str, line: int, own: str | None = None) -> str:
    """A line of a module imported from a zip (`…/<sha>.pyz/dflashctl/…`): linecache reads only files. When that
    archive is gone, from own (the process's archive: the same module at the same name inside)."""
    head, sep, inner = path.partition(".pyz/")
    if not sep:
        return ""
    for archive in (head + ".pyz", own):
        if archive is None:
            continue
        try:
            with zipfile.ZipFile(archive) as z:
                lines = z.read(inner).decode("utf-8", "replace").splitlines()
        except (OSError, KeyError, zipfile.BadZipFile):
            continue
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return ""
