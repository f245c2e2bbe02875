"""Thread supervision: a crashed worker is loud (standard traceback + error file) and, by default, fatal.

The seed's failure was three drafter threads dying in torch.compile while the process lived on holding every
GPU at 0 %. Here `threading.excepthook` keeps Python's own output (`Exception in thread NAME:` + traceback on
stderr, which every log scanner already understands), writes `errors/<thread>.json`, marks the thread crashed
and, with on_worker_failure = "abort", tells the main thread to end the process (exit 1) within seconds.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.checkpoint import atomic_write_bytes

RUNNING, CRASHED, FINISHED, STARTING = "running", "crashed", "finished", "starting"
_REPORT_LOCK = threading.Lock()


def standard_report(args: threading.ExceptHookArgs) -> str:
    """Exactly what Python's default threading.excepthook prints: the header and the whole traceback."""
    name = args.thread.name if args.thread is not None else threading.get_ident()
    return f"Exception in thread {name}:\n" + "".join(
        traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))


def write_report(args: threading.ExceptHookArgs) -> None:
    """Python's standard output, written in one piece under a lock: the default hook writes line by line, so
    threads crashing at the same moment interleave their tracebacks in the log (seen in real runs)."""
    text = standard_report(args)
    with _REPORT_LOCK:
        stream = sys.stderr
        if stream is None:
            return
        stream.write(text)
        stream.flush()


def exc_type_name(exc_type: type[BaseException]) -> str:
    """The type as a traceback prints it: `RuntimeError`, `torch.OutOfMemoryError`, `pkg.mod.Error`."""
    mod, name = exc_type.__module__, exc_type.__qualname__
    return name if mod in ("builtins", "__main__") else f"{mod}.{name}"


@dataclass
class ThreadInfo:
    name: str
    state: str = STARTING
    step: int = 0


@dataclass
class Supervisor:
    """Shared state between the main thread and the workers: thread states, stop/abort events."""

    run_dir: Path
    on_worker_failure: str = "abort"
    threads: dict[str, ThreadInfo] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    """Set by SIGTERM: finish the current step, checkpoint, exit 143."""
    abort: threading.Event = field(default_factory=threading.Event)
    """Set when a thread crashed and the run cannot (or must not) go on: exit 1 now."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    first_error: str | None = None

    def register(self, name: str) -> ThreadInfo:
        with self.lock:
            info = self.threads[name] = ThreadInfo(name)
            return info

    def set_state(self, name: str, state: str) -> None:
        with self.lock:
            self.threads[name].state = state

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"name": t.name, "state": t.state, "step": t.step} for t in self.threads.values()]

    def record_crash(self, name: str, exc_type: type[BaseException], exc: BaseException | None, tb: Any) -> None:
        """Write errors/<thread>.json (atomically) and decide whether the run must abort."""
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        doc = {"thread": name, "type": exc_type_name(exc_type), "message": str(exc) if exc is not None else "",
               "traceback": text, "time": time.time()}
        err_dir = self.run_dir / "errors"
        err_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(err_dir / f"{name}.json", json.dumps(doc, indent=1).encode())
        with self.lock:
            if name in self.threads:
                self.threads[name].state = CRASHED
            self.first_error = self.first_error or f"{name}: {doc['type']}: {doc['message']}"
            # `continue` goes on while any drafter has not crashed: a peer that already finished its steps counts
            # (it leaves the all-reduce before this hook runs, so at the last step it may finish first)
            fatal = (self.on_worker_failure == "abort" or not name.startswith("drafter-")
                     or not any(n.startswith("drafter-") and t.state != CRASHED for n, t in self.threads.items()))
        if fatal:
            self.abort.set()

    def install(self) -> None:
        """Chain onto threading.excepthook, keeping the original (standard) output first."""
        original = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if args.exc_type is SystemExit:
                return original(args)
            if original is threading.__excepthook__:
                write_report(args)  # `Exception in thread drafter-1:` + the whole traceback, on stderr
            else:
                original(args)  # someone else's hook: theirs decides the output
            name = args.thread.name if args.thread is not None else f"thread-{threading.get_ident()}"
            try:
                self.record_crash(name, args.exc_type, args.exc_value, args.exc_traceback)
            except Exception as e:  # never let the hook itself hide the crash
                print(f"supervise: could not record crash of {name}: {e!r}", flush=True)
                self.abort.set()

        self._original_hook = original
        threading.excepthook = hook

    def uninstall(self) -> None:
        original = getattr(self, "_original_hook", None)
        if original is not None:
            threading.excepthook = original


class Fault:
    """Test-only fault hook: env DFLASH_FAULT="drafter-1@3[:kind],coordinator@5" — `kind` is `error`
    (RuntimeError, default), `oom` (torch.OutOfMemoryError) or `hang` (the thread stops making progress).
    A `R/` prefix ("1/drafter-1@3") limits a point to process rank R of a torch.distributed run."""

    def __init__(self, spec: str | None, rank: int = 0) -> None:
        self.points: dict[tuple[str, int], str] = {}
        for part in filter(None, (p.strip() for p in (spec or "").split(","))):
            where, _, kind = part.partition(":")
            only, slash, where = where.rpartition("/")
            if slash and int(only) != rank:
                continue
            name, _, step = where.partition("@")
            self.points[(name, int(step))] = kind or "error"

    @classmethod
    def from_env(cls, rank: int = 0) -> Fault:
        return cls(os.environ.get("DFLASH_FAULT"), rank)

    def check(self, name: str, step: int, stop: threading.Event | None = None) -> None:
        kind = self.points.get((name, step))
        if kind is None:
            return
        if kind == "oom":
            import torch

            raise torch.OutOfMemoryError(f"DFLASH_FAULT: injected CUDA out of memory in {name} at step {step}")
        if kind == "hang":
            print(f"DFLASH_FAULT: {name} hangs at step {step}", flush=True)
            while stop is None or not stop.is_set():
                time.sleep(0.5)
            return
        raise RuntimeError(f"DFLASH_FAULT: injected fault in {name} at step {step}")
