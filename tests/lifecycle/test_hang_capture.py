"""A hang's evidence kept together (issue 28 part 5): a real 2-rank gloo job under torchrun, launched with
`launch --exec -- python3 -m torch.distributed.run …`, hangs — rank 0 waits for an all_reduce rank 1 never enters.
Past the host's stall window the run's sentinel saves, once for the stall, every rank's stacks (one file per rank
pid: the ranks are torchrun's children) and the flight-recorder dumps present at that moment in
<run>/captures/1-<stamp>/, and its `stacks` event names that folder.

gloo's recorder never dumps on a timeout by itself (torch writes dumps on an NCCL watchdog timeout): here each rank
asks torch for its dump before the hang, where the variable dflashctl set says, which is the "dumps present" case; the
environment being set is checked from inside rank 0. Stacks are taken by the trainer's dump signal (no py-spy on
this machine's PATH). "Once" is checked after the sentinel has read the GPUs (the nvidia-smi stand-in's call log) at
least twice more with the stall still on — never by a timer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import wait_until
from .userprog import local_box, write_prog

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

HANG = r'''
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, os.environ["TRAINER_ROOT"])
from trainer import threaddump
threaddump.install(Path(os.environ["DFLASH_RUN_DIR"]))
import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
threaddump.note_threads()
names = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")
if rank == 0:
    with open("fr_env.json", "w") as f:
        json.dump({k: os.environ.get(k) for k in names}, f)
t = torch.ones(4)
dist.all_reduce(t)
with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
    f.write(c10d._dump_fr_trace())
dist.all_reduce(t)  # everything slow (torch's lazy imports, the dump) before the first step line
for step in range(1, 3):
    dist.all_reduce(t)
    if rank == 0:
        print(f"step {step} loss {1.0 / step:.3f}", flush=True)


def rank0_waits(work):
    work.wait()


def rank1_elsewhere():
    while True:
        time.sleep(0.1)


if rank == 0:
    work = dist.all_reduce(t, async_op=True)  # rank 1 never joins: the hang
    print("step 3 loss 0.333", flush=True)
    rank0_waits(work)
else:
    rank1_elsewhere()
'''


def test_a_stalled_torchrun_job_gets_every_ranks_stacks_and_the_dumps_saved_together_once(local_host, cli, tmp_path,
                                                                                           monkeypatch) -> None:  # noqa: ANN001
    hosts = tmp_path / "stall-hosts.toml"
    hosts.write_text(local_host.hosts_file.read_text() + 'stall_window = "5s"\n')
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts))
    calls = tmp_path / "smi-calls.jsonl"
    local_host.set_gpus([{"memory.used": 3}])
    local_host.gpus.extra(call_log=str(calls))
    box = local_box(local_host, tmp_path)
    src = write_prog(tmp_path / "myproject")
    (src / "hang.py").write_text(HANG)
    res = cli("launch", "--source", str(src), "--json", "--env", "OMP_NUM_THREADS=1", "--env",
              f"TRAINER_ROOT={REPO}", "--name", "hang", "--exec", "--", "python3", "-m", "torch.distributed.run",
              "--standalone", "--nproc-per-node", "2", "hang.py")
    assert res.code == 0, res.err
    rd = box.run_dir(res.json()["run_id"])

    def stacks_events() -> list[dict]:
        text = (rd / "events.jsonl").read_text() if (rd / "events.jsonl").exists() else ""
        return [e for e in map(json.loads, text.splitlines()) if e.get("kind") == "stacks"]

    ev = wait_until(lambda: stacks_events(), timeout=240, what="the stall's capture")[0]
    folder = Path(ev["capture_dir"])
    assert folder.parent == rd / "captures" and folder.name.startswith("1-"), ev
    assert str(folder) in ev["message"] and "rank(s) 0,1" in ev["message"], ev["message"]

    env = json.loads(next(Path(box.ct_workspace).rglob("fr_env.json")).read_text())
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{rd}/flightrec/nccl_trace_rank_"

    index = json.loads((folder / "index.json").read_text())
    ranks = {s["rank"]: s for s in index["stacks"] if s["rank"] is not None}
    assert sorted(ranks) == [0, 1], index["stacks"]
    for rank, rec in ranks.items():
        assert rec["file"] == f"rank-{rank}.pid-{rec['pid']}.json" and rec["method"] == "faulthandler", rec
    rank0 = json.loads((folder / ranks[0]["file"]).read_text())
    rank1 = json.loads((folder / ranks[1]["file"]).read_text())
    assert " in rank0_waits" in rank0["raw"], rank0["raw"][-1500:]
    assert " in rank1_elsewhere" in rank1["raw"], rank1["raw"][-1500:]
    assert sorted(d["name"] for d in index["dumps"]) == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
    for d in index["dumps"]:
        copied = folder / "flightrec" / d["name"]
        assert copied.read_bytes() == (rd / "flightrec" / d["name"]).read_bytes() and d["bytes"] > 0

    seen = len(calls.read_text().splitlines())
    wait_until(lambda: len(calls.read_text().splitlines()) >= seen + 2, timeout=120,
               what="two more GPU readings by the sentinel, the stall still on")
    status = cli("status", rd.name, "--json")
    assert status.json()["verdict"] == "stalled", status.out[-2000:]
    assert len(stacks_events()) == 1 and len(list((rd / "captures").iterdir())) == 1
    assert cli("stop", rd.name).code == 103
