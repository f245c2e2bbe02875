"""Fixture: start the real trainer as a subprocess; kill whatever is left at teardown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_harness import REPO, TINY, Run


@pytest.fixture
def start_trainer(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(*args: str, run_dir: Path | None = None, env: dict[str, str] | None = None,
              config: str = TINY) -> Run:
        run_dir = run_dir or tmp_path / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        log = run_dir / "train.log"
        full_env = {**os.environ, "DFLASH_RUN_ID": run_dir.name, "DFLASH_RUN_DIR": str(run_dir), **(env or {})}
        full_env.pop("DFLASH_FAULT", None) if not (env and "DFLASH_FAULT" in env) else None
        with open(log, "ab") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", config, "--run-dir", str(run_dir),
                                     *args], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=full_env)
        procs.append(proc)
        return Run(run_dir, proc, log)

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
