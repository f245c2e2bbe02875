"""A user's own programs (not our trainer) for the `launch --exec` and `adopt` tests, and where they run.

PROG is a plain Python script with worker threads, written by the tests into a directory of their own: it records
what it was given (argv, environment, cwd, pid) in `seen.json` and is steered by files in its control directory
($DFLASH_RUN_DIR when dflashctl launched it, else its working directory): `crash-thread` makes thread worker-1
raise (the process lives on), `crash-main` makes the main thread raise (exit 1, traceback), `finish` ends it (exit 0).
With `--helper` it first starts a helper process in a session of its own (it inherits the environment, so the
run's marker), whose pid goes to `helper.pid`. DDP is a torch.distributed script for torchrun on the CPU (gloo, 2
ranks) in which rank 1 raises.

`Box` is where runs live: this machine (`local` host) or the test container (`pve` host, reached by `pct exec`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .conftest import wait_until

PROG = r'''
import json, os, signal, subprocess, sys, threading, time

ctl = os.environ.get("DFLASH_RUN_DIR") or os.getcwd()
if "--helper" in sys.argv:
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(ctl, "helper.pid.tmp"), "w") as f:
        f.write(str(helper.pid))
    os.replace(os.path.join(ctl, "helper.pid.tmp"), os.path.join(ctl, "helper.pid"))
seen = {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid(), "pgid": os.getpgid(0)}
with open(os.path.join(ctl, "seen.json.tmp"), "w") as f:
    json.dump(seen, f)
os.replace(os.path.join(ctl, "seen.json.tmp"), os.path.join(ctl, "seen.json"))


def work(i):
    step = 0
    while True:
        step += 1
        if i == 0:
            print(f"step={step} loss={5.0 / step:.4f} worker=worker-0", flush=True)
        if i == 1 and os.path.exists(os.path.join(ctl, "crash-thread")):
            raise RuntimeError("worker-1 exploded on purpose")
        time.sleep(0.1)


for i in range(2):
    threading.Thread(target=work, args=(i,), name=f"worker-{i}", daemon=True).start()
print(f"prog: started pid={os.getpid()} ctl={ctl}", flush=True)
while True:
    if os.path.exists(os.path.join(ctl, "crash-main")):
        raise RuntimeError("main thread died on purpose")
    if os.path.exists(os.path.join(ctl, "finish")):
        print("prog: finished", flush=True)
        sys.exit(0)
    time.sleep(0.05)
'''

DDP = r'''
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank}: step=1 loss={1.0 / (rank + 1):.4f} world={int(t.item())}", flush=True)
if rank == 1:
    raise RuntimeError("rank 1 failed on purpose")
time.sleep(120)  # rank 0 lives on until torchrun ends it
'''


def write_prog(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prog.py").write_text(PROG)
    (directory / "ddp.py").write_text(DDP)
    return directory


@dataclass
class Box:
    """Where runs live. `ct(path)` is this machine's path of a path as the runs see it."""

    name: str
    ct_workspace: str  # the workspace as the container (or this machine) sees it
    ct: Callable[[str], Path]
    sh: Callable[[str, Sequence[str]], subprocess.CompletedProcess]  # `sh -c SCRIPT sh ARGS…` where runs live
    python: str  # what a hand-started program is started with there
    home: str = ""  # where the hand-started program lives, as the runs see it
    started: list[int] = field(default_factory=list)  # pids started by hand, killed when the test ends

    def state(self, pid: int) -> str | None:
        res = self.sh('cat "/proc/$1/stat"', [str(pid)])
        if res.returncode != 0:
            return None
        text = res.stdout.decode()
        return text[text.rfind(")") + 2:].split()[0]

    def alive(self, pid: int) -> bool:
        return self.state(pid) not in (None, "Z", "X")

    def environ(self, pid: int) -> dict[str, str]:
        raw = self.sh('cat "/proc/$1/environ"', [str(pid)]).stdout
        return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)

    def run_dir(self, run_id: str) -> Path:
        return self.ct(f"{self.ct_workspace}/runs/{run_id}")

    def seen(self, directory: Path, timeout: float = 60) -> dict:
        path = directory / "seen.json"
        return wait_until(lambda: path.exists() and json.loads(path.read_text()), timeout=timeout, what=str(path))

    def start_by_hand(self, directory: str, *args: str, log: str = "hand.log") -> int:
        """`cd DIR && setsid nohup PY prog.py ARGS > LOG 2>&1 &` as a person would, unmarked; its pid."""
        local = self.ct(directory)
        with contextlib.suppress(FileNotFoundError):
            (local / "seen.json").unlink()
        script = ('cd "$1" && py="$2" && log="$3" && shift 3 && '
                  'setsid nohup "$py" prog.py "$@" > "$log" 2>&1 < /dev/null &')
        res = self.sh(script, [directory, self.python, log, *args])
        assert res.returncode == 0, res.stderr
        return int(self.seen(local)["pid"])

    def kill(self, pid: int) -> None:
        self.sh('kill -9 "$1" 2>/dev/null; true', [str(pid)])


def local_box(local_host, tmp: Path) -> Box:  # noqa: ANN001 - harness LocalEnv
    clean_env = {"PATH": os.environ["PATH"]}  # a person's shell: no DFLASH_RUN_ID

    def sh(script: str, args: Sequence[str]) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", script, "sh", *args], capture_output=True, timeout=60, env=clean_env)

    return Box("local", str(local_host.workspace_dir), Path, sh, sys.executable)


def pve_box(pve) -> Box:  # noqa: ANN001 - harness PveEnv
    def ct(path: str) -> Path:
        assert path.startswith("/workspace/"), path
        return pve.workspace_dir / path[len("/workspace/"):]

    def sh(script: str, args: Sequence[str]) -> subprocess.CompletedProcess:
        return pve.exec(["sh", "-c", script, "sh", *args])

    return Box("pve", "/workspace/dflash", ct, sh, "python3")


def hand_box(request, tmp_path: Path, write: Callable[[Path], Path]) -> Iterator[Box]:  # noqa: ANN001 - pytest
    """The `box` fixture of the hand-started-program tests (param "local" or "pve"): the program written by `write`
    into the box's home; every pid in `started` is killed at the end (unmarked: the lifecycle safety net would not
    end them)."""
    if request.param == "local":
        b = local_box(request.getfixturevalue("local_host"), tmp_path)
        b.home = str(tmp_path / "hand")
    else:
        b = pve_box(request.getfixturevalue("pve"))
        b.home = "/workspace/hand"
    write(b.ct(b.home))
    yield b
    for pid in b.started:
        b.kill(pid)


def watch_until_failure(trigger: Path) -> tuple[int, dict, str]:
    """`dflashctl status --watch --json --exit-on-failure` as a real process. `trigger` (the program's cue to let a
    worker thread raise) is touched only once the watch has reported the run training, so what the watch says
    afterwards is live detection, not a look at a log that already held the crash. Returns its exit code, its last
    record and everything it printed."""
    watch = subprocess.Popen([sys.executable, "-m", "dflashctl", "status", "--watch", "--json", "--exit-on-failure",
                              "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "COLUMNS": "200"})
    assert watch.stdout is not None
    lines: list[str] = []
    try:
        for raw in watch.stdout:
            lines.append(raw.decode())
            rec = json.loads(lines[-1])
            if rec.get("verdict") == "training" and not trigger.exists():
                trigger.touch()
        code = watch.wait(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert lines and trigger.exists(), "the watch ended before it ever saw the run training"
    err = watch.stderr.read().decode() if watch.stderr else ""
    return code, json.loads(lines[-1]), "".join(lines) + err
