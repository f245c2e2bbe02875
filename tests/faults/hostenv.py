"""A `local` test host whose container answers through tests/faults/hostile.py, with one finished training run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN_ID = "20261203-000000-tiny"


def hostile_host(local_host, tmp_path: Path) -> Path:  # noqa: ANN001 - harness.envs.LocalEnv
    """Point local_host's hosts.toml at the hostile python; make a finished training run; its run dir."""
    wrapper = tmp_path / "hostile-python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "hostile.py"} "$@"\n')
    wrapper.chmod(0o755)
    text = local_host.hosts_file.read_text().replace(f'python = "{sys.executable}"', f'python = "{wrapper}"')
    assert str(wrapper) in text
    local_host.hosts_file.write_text(text)
    run_dir = local_host.workspace_dir / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text(json.dumps({"id": RUN_ID, "name": "tiny", "kind": "train",
                                                   "started_at_epoch": 1}))
    (run_dir / "exit_code").write_text("0\n")
    (run_dir / "train.log").write_text("step 1/1 loss 1.0\n")
    return run_dir
