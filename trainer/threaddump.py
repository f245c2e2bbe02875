"""The trainer's dump signal: SIGUSR1 makes faulthandler write every thread's Python stack to
`<run_dir>/stacks/faulthandler-<pid>.txt` (appended; never train.log). faulthandler writes from C inside the
signal handler, so the dump comes even while every thread is stuck or one holds the GIL in C code.

faulthandler names threads only by ident (`Thread 0x00007f…`), so `stacks/threads-<pid>.json` maps each ident, as
faulthandler prints it, to the thread's name and native id: {"0x00007f…": {"name": "drafter-1", "native_id": 5678}}.
It is rewritten (atomically) whenever the set of threads changed since the last note_threads().

`dflashctl stacks` (without py-spy in the container) signals a process only when that map exists and the process
catches SIGUSR1, so a program without this never gets a signal whose default action would end it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import struct
import threading
from pathlib import Path
from typing import Any

DUMP_SIGNAL = signal.SIGUSR1
_state: dict[str, Any] = {}  # the open dump file (faulthandler writes to its fd for the process's life), the map


def ident_hex(ident: int) -> str:
    """A thread ident as faulthandler prints it: 0x + 2 hex digits per byte of an unsigned long."""
    return f"0x{ident:0{2 * struct.calcsize('L')}x}"


def install(run_dir: Path) -> str | None:
    """Register the dump signal and write the first thread map; a one-line reason when it cannot be."""
    if signal.getsignal(DUMP_SIGNAL) not in (signal.SIG_DFL, None):
        return "stacks: SIGUSR1 already has a handler; no dump signal (install py-spy for `dflashctl stacks`)"
    folder = run_dir / "stacks"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        dump = open(folder / f"faulthandler-{os.getpid()}.txt", "a")  # noqa: SIM115 - open for the process's life
    except OSError as e:
        return f"stacks: cannot open the dump file in {folder}: {e}"
    faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    _state.update(file=dump, folder=folder, seen=None)
    note_threads()
    return None


def note_threads() -> None:
    """Rewrite stacks/threads-<pid>.json if threads started or ended since the last call (cheap otherwise)."""
    folder = _state.get("folder")
    if folder is None:
        return
    now = {ident_hex(t.ident): {"name": t.name, "native_id": t.native_id}
           for t in threading.enumerate() if t.ident is not None}
    if now == _state.get("seen"):
        return
    path = folder / f"threads-{os.getpid()}.json"
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(now, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        return  # the dump still works; its threads are then named by ident only
    _state["seen"] = now
