"""The kill-zombies safety scenario, shared by the `local` and the ssh + pct tests.

Decoys: a leftover of an earlier run (marked, must die), a marked parent with a defunct child
(parent must die, child must be reaped), the current run (must live), a look-alike with the very
same command line but no marker (must live), and a marked process of a run that is not in this
workspace (must live). Zero wrong kills.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .conftest import DECOY, FAKE_TRAINER, CliResult, write_config


@dataclass
class Box:
    """Where decoys run and how their state is read: this machine, or inside the test container."""

    # (mode, marker, tag, run_dir) -> pids. A marked decoy names its run directory too, as every process our
    # launcher starts does: a run of the same id in another workspace (another test, in parallel) is not it.
    start: Callable[[str, str | None, str, str | None], list[int]]
    state: Callable[[int], str | None]  # /proc state letter, None when gone

    def alive(self, pid: int) -> bool:
        return self.state(pid) not in (None, "Z", "X")

    def wait_gone(self, pid: int, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(pid) is None:
                return True
            time.sleep(0.1)
        return False


def _wait_pidfile(path: Path, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return [int(x) for x in path.read_text().split()]
        time.sleep(0.05)
    raise AssertionError(f"decoy never wrote {path}")


def local_box(tmp: Path) -> Box:
    def start(mode: str, marker: str | None, tag: str, run_dir: str | None = None) -> list[int]:
        pidfile = tmp / f"decoy-{tag}.pid"
        env = {"PATH": "/usr/bin:/bin", "DECOY_PIDFILE": str(pidfile)}
        if marker:
            env["DFLASH_RUN_ID"] = marker
        if run_dir:
            env["DFLASH_RUN_DIR"] = run_dir
        subprocess.run([sys.executable, str(DECOY), mode], env=env, check=True, timeout=30)
        return _wait_pidfile(pidfile)

    def state(pid: int) -> str | None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return text[text.rfind(")") + 2:].split()[0]

    return Box(start, state)


def pve_box(pve) -> Box:
    def start(mode: str, marker: str | None, tag: str, run_dir: str | None = None) -> list[int]:
        name = f"decoy-{tag}.pid"
        argv = ["env", f"DECOY_PIDFILE=/workspace/{name}"]
        if marker:
            argv.append(f"DFLASH_RUN_ID={marker}")
        if run_dir:
            argv.append(f"DFLASH_RUN_DIR={run_dir}")
        res = pve.exec([*argv, "python3", str(DECOY), mode], timeout=30)
        assert res.returncode == 0, res.stderr
        return _wait_pidfile(Path(pve.workspace_dir) / name)

    def state(pid: int) -> str | None:
        res = pve.exec(["cat", f"/proc/{pid}/stat"])
        if res.returncode != 0:
            return None
        text = res.stdout.decode()
        return text[text.rfind(")") + 2:].split()[0]

    return Box(start, state)


def run_decoy_scenario(cli: Callable[..., CliResult], box: Box, tmp: Path) -> None:
    short = write_config(tmp / "short.toml", mode="train", steps=2, step_s=0.01)
    earlier = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(short), "--name", "earlier",
                  "--wait-for", "exit", "--json")
    assert earlier.code == 0, earlier.err
    earlier_id, earlier_dir = earlier.json()["run_id"], earlier.json()["run_dir"]
    current = cli("launch", "--source", str(FAKE_TRAINER), "--name", "current", "--json")
    assert current.code == 0, current.err
    cur = current.json()
    cur_pid, cur_id = cur["pid"], cur["run_id"]

    leftover = box.start("sleeper", earlier_id, "leftover", earlier_dir)[0]
    parent, defunct = box.start("defunct-parent", earlier_id, "defunct", earlier_dir)
    lookalike = box.start("sleeper", None, "lookalike")[0]
    elsewhere = box.start("sleeper", "20200101-000000-other-workspace", "elsewhere")[0]
    assert box.state(defunct) == "Z"

    dry = cli("kill-zombies", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    doc = dry.json()
    assert doc["current_run"] == cur_id
    to_kill = {z["pid"] for z in doc["zombies"] if z["action"] == "kill"}
    assert to_kill == {leftover, parent}
    listed = {z["pid"]: z for z in doc["zombies"]}
    assert listed[defunct]["action"] == "skip" and f"pid {parent}" in listed[defunct]["why"]
    assert lookalike not in listed and elsewhere not in listed and cur_pid not in listed
    assert all(box.alive(p) for p in (leftover, parent, lookalike, elsewhere, cur_pid))  # dry run: nothing touched

    refused = cli("kill-zombies")  # no --yes and no terminal: refuse rather than kill unasked
    assert refused.code == 2 and box.alive(leftover)

    done = cli("kill-zombies", "--yes", "--json")
    assert done.code == 0, done.err
    outcomes = {z["pid"]: z["outcome"] for z in done.json()["zombies"] if z["action"] == "kill"}
    assert outcomes == {leftover: "terminated", parent: "terminated"}
    assert box.wait_gone(leftover) and box.wait_gone(parent)
    assert box.wait_gone(defunct), "the defunct child is reaped once its parent is gone"
    for pid in (cur_pid, lookalike, elsewhere):  # zero wrong kills
        assert box.alive(pid), pid
    runs = cli("runs", "--json").json()["runs"]
    assert {r["id"]: r["verdict"] for r in runs}[cur_id] == "training"

    # launch's preflight: another leftover of the earlier run blocks a launch until it is cleaned
    assert cli("stop", cur_id).code == 103
    straggler = box.start("sleeper", earlier_id, "straggler", earlier_dir)[0]
    blocked = cli("launch", "--source", str(FAKE_TRAINER), "--name", "next")
    assert blocked.code == 2 and "earlier runs are still alive" in blocked.err and str(straggler) in blocked.err
    assert "--kill-zombies" in blocked.err and box.alive(straggler)
    cleaned = cli("launch", "--source", str(FAKE_TRAINER), "--name", "next", "--kill-zombies", "--json")
    assert cleaned.code == 0, cleaned.err
    assert any("ended 1 zombie" in n for n in cleaned.json()["notes"])
    assert box.wait_gone(straggler)
    assert box.alive(lookalike) and box.alive(elsewhere)
    assert cli("stop").code == 103
    assert cli("kill-zombies", "--pid", str(lookalike), "--yes", "--json").code == 0  # named: it may go
    assert box.wait_gone(lookalike) and box.alive(elsewhere)
    assert cli("kill-zombies", "--pid", str(elsewhere), "--yes", "--json").code == 0
