"""Fixtures and helpers of the end-to-end sentinel tests (test_sentinel_*.py): the lifecycle tests' in-process `cli`
(tests/lifecycle/conftest.py), a user's own program launched with `launch --source DIR --exec -- python3 prog.py`,
and readers of a run's events.jsonl.

The program (PROG) is steered by files in its run directory ($DFLASH_RUN_DIR), so a test decides when things
happen from what it has observed, never from a timer:
  crash   the N doomed worker threads (argv[1], default 1) meet at a threading.Barrier, then each raises
          through a few frames of the program (a real traceback per thread, printed by Python's threading
          excepthook: threads dying at once interleave theirs, even half-lines; with --whole-tracebacks each is
          written in one piece); the main thread lives on
  finish  the main thread prints its last line and exits 0
Until then the main thread logs `step N loss X` lines; `done after N steps` says how many it wrote.

The autouse safety net of the lifecycle tests (`_no_run_outlives_its_test`) is not re-exported here, so the unit
tests of this directory do not get it: each end-to-end module imports it itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from harness.poll import wait_until
from lifecycle.conftest import CliResult, alive, cli, marker_of  # noqa: F401 - fixtures and helpers for the tests

PROG = r'''
import os, sys, threading, time

ctl = os.environ["DFLASH_RUN_DIR"]
doomed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
barrier = threading.Barrier(doomed)
if "--whole-tracebacks" in sys.argv:  # each thread's traceback in one write, as a logging handler writes a record
    import traceback

    def whole(a):
        os.write(2, (f"Exception in thread {a.thread.name}:\n" + "".join(
            traceback.format_exception(a.exc_type, a.exc_value, a.exc_traceback))).encode())

    threading.excepthook = whole


def cue(name):
    return os.path.exists(os.path.join(ctl, name))


def load_batch(i):
    raise RuntimeError(f"worker-{i} got a corrupt batch")


def work(i):
    while not cue("crash"):
        time.sleep(0.02)
    barrier.wait()
    load_batch(i)


for i in range(doomed):
    threading.Thread(target=work, args=(i,), name=f"worker-{i}", daemon=True).start()
step = 0
while not cue("finish"):
    step += 1
    print(f"step {step} loss {4.0 / step:.4f}", flush=True)
    time.sleep(0.05)
print(f"done after {step} steps", flush=True)
'''


def write_prog(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prog.py").write_text(PROG)
    return directory


def launch_prog(run_cli, src: Path, *opts: str, doomed: int = 1, args: tuple[str, ...] = ()) -> dict:  # noqa: ANN001
    """`launch --json --source SRC OPTS… --exec -- python3 prog.py DOOMED ARGS…`: the launch's JSON document."""
    res = run_cli("launch", "--source", str(src), "--json", *opts, "--exec", "--", "python3", "prog.py", str(doomed),
                  *args)
    assert res.code == 0, res.err
    return res.json()


def events(run_dir: Path) -> list[dict]:
    """Every whole record of the run's events.jsonl (a torn last line is skipped)."""
    try:
        text = (run_dir / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def of_kind(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in events(run_dir) if e.get("kind") == kind]


def sentinel_pid(run_dir: Path, timeout: float = 60.0) -> int:
    """The pid the run's sentinel wrote in its `sentinel` event, checked to be that run's `agent.pyz sentinel`."""
    rec = wait_until(lambda: next(iter(of_kind(run_dir, "sentinel")), None), timeout=timeout,
                     what=f"the sentinel event in {run_dir}/events.jsonl")
    pid = int(rec["pid"])
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    at = cmdline.index(str(run_dir / "agent.pyz").encode())
    assert cmdline[at + 1:at + 3] == [b"sentinel", str(run_dir).encode()], cmdline
    assert marker_of(pid) == run_dir.name
    return pid


def cue(run_dir: Path, name: str) -> None:
    (run_dir / name).touch()


def launch_rechecking(run_cli, src: Path, name: str, *command: str, opts: tuple[str, ...] = ()) -> Path:  # noqa: ANN001
    """`launch --exec` whose sentinel re-checks the GPUs before each restart (--exclude-unhealthy-gpus, --restart-on
    crashed, 0.1 s backoff): the first attempt's run directory."""
    res = run_cli("launch", "--source", str(src), "--json", "--name", name, "--exclude-unhealthy-gpus",
                  "--restart-on", "crashed", "--backoff", "0.1s", *opts, "--exec", "--", *command)
    assert res.code == 0, res.err
    return Path(res.json()["run_dir"])


def log_text(run_dir: Path, name: str = "train.log") -> str:
    """A run file's text; empty while its directory is being made."""
    try:
        return (run_dir / name).read_text()
    except FileNotFoundError:
        return ""


def run_dirs(workspace: Path) -> list[str]:
    """The run directories of a workspace (not `latest`, not lock files)."""
    runs = workspace / "runs"
    if not runs.is_dir():
        return []
    return sorted(p.name for p in runs.iterdir() if p.is_dir() and not p.is_symlink())


def exit_code(run_dir: Path) -> int | None:
    try:
        return int((run_dir / "exit_code").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def wait_exit_code(run_dir: Path, timeout: float = 90.0) -> int:
    return wait_until(lambda: (code := exit_code(run_dir)) is not None and (code,), timeout=timeout,
                      what=f"{run_dir}/exit_code")[0]


def gone(pid: int) -> bool:
    return not alive(pid)


def kill_tree_quietly(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
