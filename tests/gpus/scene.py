"""A GPU host shared by two containers and the host itself, with real processes in each, for `gpus` and
`kill-zombies`: the nvidia-smi stand-in lists them by HOST pid, as the driver does.

Container A (the test host's own, pve.ctid): the live run's process (GPU 0), a zombie of an earlier run of this
workspace (GPU 1, its run ended: exit_code written), an unmarked process (GPU 0). Container B (another owner): a
process marked with B's own run (GPU 2) and an unmarked one (GPU 2). The host: an unmarked process (GPU 3).
GPU 1 holds memory at 0 % (the zombie's), GPU 3 too (the host's).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from harness.envs import PveEnv
from harness.multict import second_container, start_in, start_on_host

CUR, OLD, THEIRS = "20261203-100000-cur", "20261203-090000-old", "20261203-080000-theirs"
CT_RUNS = "/workspace/dflash/runs"


@dataclass
class Proc:
    name: str
    ns_pid: int | None
    host_pid: int


@dataclass
class Scene:
    pve: PveEnv
    other: PveEnv
    procs: dict[str, Proc] = field(default_factory=dict)

    def close(self) -> None:
        for p in self.procs.values():
            if p.ns_pid is None:
                with contextlib.suppress(OSError):
                    os.kill(p.host_pid, signal.SIGKILL)
        self.other.close()

    def alive(self, name: str) -> bool:
        try:
            state = Path(f"/proc/{self.procs[name].host_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")


def _run_dir(pve: PveEnv, run_id: str) -> Path:
    d = pve.workspace_dir / "dflash" / "runs" / run_id
    d.mkdir(parents=True, exist_ok=True)
    return d


def _marked(run_id: str) -> dict[str, str]:
    return {"DFLASH_RUN_ID": run_id, "DFLASH_RUN_DIR": f"{CT_RUNS}/{run_id}"}


def build(pve: PveEnv, tmp: Path) -> Scene:
    scene = Scene(pve, second_container(pve, tmp / "ct-b"))
    try:
        cur, old = _run_dir(pve, CUR), _run_dir(pve, OLD)
        (old / "exit_code").write_text("0\n")
        ns, host = start_in(pve, ["sleep", "3601"], _marked(CUR))
        scene.procs["current"] = Proc("current", ns, host)
        (cur / "pid").write_text(f"{ns}\n")
        (pve.workspace_dir / "dflash" / "runs" / "latest").symlink_to(CUR)
        scene.procs["zombie"] = Proc("zombie", *start_in(pve, ["sleep", "3602"], _marked(OLD)))
        scene.procs["stray"] = Proc("stray", *start_in(pve, ["sleep", "3603"]))
        _run_dir(scene.other, THEIRS)
        scene.procs["theirs"] = Proc("theirs", *start_in(scene.other, ["sleep", "3604"], _marked(THEIRS)))
        scene.procs["their-stray"] = Proc("their-stray", *start_in(scene.other, ["sleep", "3605"]))
        scene.procs["host"] = Proc("host", None, start_on_host(["sleep", "3606"]).pid)
        p = scene.procs
        pve.set_gpus(
            [{"memory.used": 71000, "utilization.gpu": 97, "power.draw": 610.0},
             {"memory.used": 30500, "utilization.gpu": 0, "power.draw": 90.0},
             {"memory.used": 21000, "utilization.gpu": 45},
             {"memory.used": 9000, "utilization.gpu": 0}],
            processes=[{"pid": p["current"].host_pid, "used_memory": 70000, "gpu": 0},
                       {"pid": p["stray"].host_pid, "used_memory": 1000, "gpu": 0, "process_name": "sleep"},
                       {"pid": p["zombie"].host_pid, "used_memory": 30000, "gpu": 1},
                       {"pid": p["theirs"].host_pid, "used_memory": 20000, "gpu": 2},
                       {"pid": p["their-stray"].host_pid, "used_memory": 1000, "gpu": 2},
                       {"pid": p["host"].host_pid, "used_memory": 9000, "gpu": 3}])
    except BaseException:
        scene.close()
        raise
    return scene
