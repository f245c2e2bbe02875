"""The flight recorder through a real launch (issue 28 part 5): `launch --exec -- torchrun …` gives the program
TORCH_FR_BUFFER_SIZE / TORCH_NCCL_DUMP_ON_TIMEOUT / TORCH_FR_DUMP_TEMP_FILE (dumps under the run directory) unless the
user set them; a 2-rank gloo job hangs because rank 1 leaves out a collective, each rank writes torch's own dump
where the variable says (gloo's recorder does not dump on a timeout by itself: the program asks torch for it), and
`diagnose <run dir>` and `status` name rank 1 as behind and all_reduce as where rank 0 waits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import wait_until
from .userprog import local_box, write_prog

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

HANG = r'''
import json, os, sys
import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
names = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
         "TORCH_FR_DUMP_TEMP_FILE")
if rank == 0:
    with open("fr_env.json", "w") as f:
        json.dump({k: os.environ.get(k) for k in names}, f)
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, 0)
if rank == 0:
    dist.all_reduce(t, async_op=True)  # rank 1 never joins: a hang
prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
if prefix:
    with open(f"{prefix}{rank}", "wb") as f:
        f.write(c10d._dump_fr_trace())
print(f"rank {rank}: dumped to {prefix}", flush=True)
os._exit(0)
'''


def _launch(cli, src: Path, *env: str) -> dict:
    (src / "frhang.py").write_text(HANG)
    opts = [x for kv in ("OMP_NUM_THREADS=1", *env) for x in ("--env", kv)]
    res = cli("launch", "--source", str(src), "--json", *opts, "--name", "frhang", "--exec", "--", "python3", "-m",
              "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "frhang.py")
    assert res.code == 0, res.err
    return res.json()


def _seen_env(box) -> dict:  # noqa: ANN001 - userprog.Box
    """What rank 0 saw (it writes fr_env.json in its working directory: the deployed code under the workspace)."""
    return json.loads(next(Path(box.ct_workspace).rglob("fr_env.json")).read_text())


def test_a_torchrun_launch_has_the_recorder_on_and_diagnose_names_the_rank_behind(local_host, cli, tmp_path):
    box = local_box(local_host, tmp_path)
    src = write_prog(tmp_path / "myproject")
    doc = _launch(cli, src)
    rd = box.run_dir(doc["run_id"])
    wait_until(lambda: (rd / "exit_code").exists(), timeout=240, what="torchrun to end")
    env = _seen_env(box)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].endswith(f"{doc['run_id']}/flightrec/nccl_trace_rank_")
    dumps = sorted(p.name for p in (rd / "flightrec").iterdir())
    assert dumps == ["nccl_trace_rank_0", "nccl_trace_rank_1"], (rd / "train.log").read_text()[-2000:]
    res = cli("diagnose", "--json", str(rd))
    fr = res.json()["flight_recorder"]
    assert [(x["behind"], x["waiting"], x["collective"], x["seq"]) for x in fr] == [([1], [0], "all_reduce", 5)]
    text = cli("diagnose", str(rd)).out
    assert "flight recorder: rank 1 behind: never entered all_reduce #5" in text
    status = cli("status", "--json", doc["run_id"]).json()  # the same verdict, judged in the container
    assert [(x["behind"], x["waiting"], x["collective"], x["seq"]) for x in status["flight_recorder"]["behind"]] == \
        [([1], [0], "all_reduce", 5)]
    assert cli("status", doc["run_id"]).out.splitlines()[1].startswith(
        "flight recorder: rank 1 behind: never entered all_reduce #5")


def test_the_users_own_recorder_settings_are_kept(local_host, cli, tmp_path):
    box = local_box(local_host, tmp_path)
    src = write_prog(tmp_path / "myproject")
    doc = _launch(cli, src, "TORCH_NCCL_TRACE_BUFFER_SIZE=50", "TORCH_NCCL_DUMP_ON_TIMEOUT=0")
    rd = box.run_dir(doc["run_id"])
    wait_until(lambda: (rd / "exit_code").exists(), timeout=240, what="torchrun to end")
    env = _seen_env(box)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and env["TORCH_FR_BUFFER_SIZE"] is None
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].endswith("/flightrec/nccl_trace_rank_")  # not set by the user: ours
