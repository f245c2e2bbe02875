"""Fixture: start the real trainer as a subprocess; kill whatever is left at teardown."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from trainer_harness import REPO, TINY, Run

INHERIT_NOT = ("DFLASH_FAULT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def start_trainer(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(*args: str, run_dir: Path | None = None, env: dict[str, str] | None = None,
              config: str = TINY, launcher: Sequence[str] = (), log: Path | None = None) -> Run:
        """`python [launcher...] -m trainer …` (launcher: e.g. torchrun's `-m torch.distributed.run …` words);
        no DFLASH_FAULT or torch.distributed variable of this process reaches it unless env gives one."""
        run_dir = run_dir or tmp_path / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        log = log or run_dir / "train.log"
        full_env = {k: v for k, v in os.environ.items() if k not in INHERIT_NOT}
        full_env.update({"DFLASH_RUN_ID": run_dir.name, "DFLASH_RUN_DIR": str(run_dir), **(env or {})})
        with open(log, "ab") as fh:
            proc = subprocess.Popen([sys.executable, *launcher, "-m", "trainer", "--config", config, "--run-dir",
                                     str(run_dir), *args], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=full_env)
        procs.append(proc)
        return Run(run_dir, proc, log)

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
