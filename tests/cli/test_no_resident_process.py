"""Speed never buys a resident process (issue 25, DESIGN §8): after `status`, `runs`, `logs` and `launch` on the
local host no process of ours is left but the run's own (its supervisor, program and sentinel, which carry the
run's marker); over ssh the only one left is the connection master, which `hosts disconnect` ends.

Every command runs as the real console script with a tag of this test in its environment, so whatever it leaves
behind (a forked server, a runner, a daemonised helper) still carries the tag and is found in /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from harness.envs import LocalEnv, PveEnv
from harness.poll import wait_until

REPO = Path(__file__).resolve().parents[2]
DFLASHCTL = Path(sys.executable).parent / "dflashctl"
TAG = "DFLASHCTL_TEST_RESIDENT_TAG"


def left_behind(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of each live process whose environment carries tag and no run marker."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (proc / "stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and f"{TAG}={tag}".encode() in env and not any(e.startswith(b"DFLASH_RUN_ID=") for e in env):
            found.append((int(proc.name), argv))
    return found


def run(tag: str, *argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    res = subprocess.run([str(DFLASHCTL), *argv], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, TAG: tag, "COLUMNS": "200"})
    assert res.returncode in ok, (argv, res.returncode, res.stdout, res.stderr)
    return res


@pytest.mark.slow
def test_no_process_of_ours_outlives_a_command_on_the_local_host(local_host: LocalEnv, tmp_path: Path):
    tag = uuid.uuid4().hex
    source = tmp_path / "src"
    source.mkdir()
    (source / "hello.py").write_text("print('hello from the run')\n")
    run(tag, "status", "--json", ok=(102,))  # no run yet: the documented not-found code
    assert left_behind(tag) == []
    run(tag, "launch", "--exec", "--source", str(source), "--wait-for", "exit", "--timeout", "120", "--no-sentinel",
        "--", sys.executable, "hello.py")
    run(tag, "runs", "--json")
    run(tag, "logs", "latest")
    run(tag, "status", "--json")
    run(tag, "runs")
    assert left_behind(tag) == []


@pytest.mark.slow
def test_over_ssh_only_the_connection_master_stays_and_disconnect_ends_it(pve: PveEnv, fresh_masters: Path):
    tag = uuid.uuid4().hex
    run(tag, "status", "--json", ok=(102,))
    run(tag, "runs", "--json")
    run(tag, "runs")
    stayed = left_behind(tag)
    assert len(stayed) == 1 and "dflashctl.remote.master" in stayed[0][1], stayed
    run(tag, "hosts", "disconnect")
    wait_until(lambda: left_behind(tag) == [], timeout=60, what="the master to end at `hosts disconnect`")
