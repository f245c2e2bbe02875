"""Fixtures of the lifecycle tests: the stand-in trainer, the CLI called in-process, decoy processes.

Runs go through the real code path: deploy (tar on stdin), the launcher (setsid, train.log,
supervisor), the probe; only the trainer is a stand-in (fake_trainer/trainer, same process
contract) so a test can script "train", "exit at once" or "threads crash" in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.poll import wait_until  # noqa: F401 - the lifecycle tests import it from here

from dflashctl.cli import main

HERE = Path(__file__).resolve().parent
FAKE_TRAINER = HERE / "fake_trainer" / "trainer"
DECOY = HERE / "decoy.py"


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out.strip().splitlines()[-1])


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """`cli("launch", "--name", "x")` -> CliResult: the real CLI boundary, in-process."""
    monkeypatch.delenv("DFLASH_RUN_ID", raising=False)  # decoys must not inherit a marker by accident
    monkeypatch.delenv("DFLASH_FAULT", raising=False)  # nor a run a fault meant for another

    def run(*argv: str) -> CliResult:
        capsys.readouterr()
        code = main(list(argv))
        got = capsys.readouterr()
        return CliResult(code, got.out, got.err)

    return run


def write_config(path: Path, **keys: object) -> Path:
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items()))
    return path


def proc_state(pid: int) -> str | None:
    """The /proc state letter (None: gone). Works for local pids and, via pve.exec, for others."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()[0]


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def env_var(pid: int, name: str) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    key = name.encode() + b"="
    for item in env:
        if item.startswith(key):
            return item[len(key):].decode()
    return None


def marker_of(pid: int) -> str | None:
    return env_var(pid, "DFLASH_RUN_ID")


def run_dir(workspace: Path, run_id: str) -> Path:
    return workspace / "runs" / run_id


def python() -> str:
    return sys.executable


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, 9)


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test(tmp_path: Path):
    """Safety net: after each test, end (by pid, after checking the marker) any local process of a run
    whose directory is under this test's tmp_path, so a failing test never leaves a trainer behind. The marker
    alone is not enough: a test in another worker can hold a run of the same id (same name, same second), so the
    process's DFLASH_RUN_DIR must lie under this test's tmp_path too."""
    yield
    ours = {p.name for p in tmp_path.glob("**/runs/*") if p.is_dir() and not p.is_symlink()}
    if not ours:
        return
    for name in os.listdir("/proc"):
        if name.isdigit() and marker_of(int(name)) in ours:
            run_dir = env_var(int(name), "DFLASH_RUN_DIR")
            if run_dir and Path(run_dir).resolve().is_relative_to(tmp_path.resolve()):
                kill_quietly(int(name))
