"""Running the real trainer as a subprocess, the way the launcher does (stdout+stderr -> train.log)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = "trainer/configs/tiny-cpu.toml"
# small, eager, fast: most end-to-end tests use this and override what they test
FAST = ["--set", "runtime.compile_strategy=off", "--set", "train.batch_size=2", "--set", "train.seq_len=64",
        "--set", "train.log_interval=1", "--set", "runtime.heartbeat_interval_s=0.2"]


class Run:
    def __init__(self, run_dir: Path, proc: subprocess.Popen, log: Path) -> None:
        self.run_dir, self.proc, self.log_path = run_dir, proc, log

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def wait_for(self, pred, timeout: float = 60, what: str = "condition") -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            if self.proc.poll() is not None and not pred():
                raise AssertionError(f"trainer exited ({self.proc.returncode}) before {what}:\n{self.log[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.log[-3000:]}")

    def steps(self) -> dict[int, str]:
        """step -> the loss field as printed, from the key=value log lines."""
        out = {}
        for line in self.log.splitlines():
            if line.startswith("step="):
                kv = dict(p.split("=", 1) for p in line.split())
                out[int(kv["step"])] = kv["loss"]
        return out

    def heartbeat(self) -> dict:
        return json.loads((self.run_dir / "heartbeat.json").read_text())


