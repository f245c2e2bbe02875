"""`status` says which GPU holds what (issue 27 part 3): the heartbeats the trainer's own code writes for the shipped
configs (5+3 threads, 8 processes, one GPU, the tiny CPU run) go through the real probe (agent/probe/main.report, in
process), report.py and the Watcher into one layout line, a per-GPU `holds` and `status --json`'s `layout`; a
heartbeat without a layout (any other trainer) or with a broken one gives nothing and never fails the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from status.heartbeats import write_heartbeats

from dflashctl.agent.probe.main import report as probe_report
from dflashctl.agent.probe.request import ProbeRequest
from dflashctl.analysis.watcher import Watcher
from dflashctl.report import parse_report

RUN = "20261203-120000-layout"


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "ws" / "runs" / RUN
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"id": RUN, "name": "layout", "started_at_epoch": 1.0}))
    (run / "train.log").write_text("step=7 loss=2.5 tok/s=900.0\n")
    return run


def _status(tmp_path: Path) -> dict:
    """The probe's report for the run, typed and judged as `status` does; its --json record."""
    doc = probe_report(ProbeRequest(workspace=str(tmp_path / "ws"), run=RUN, events=True), None, None)
    json.dumps(doc)  # what travels is JSON
    return Watcher("h").update(parse_report(json.loads(json.dumps(doc)))).to_record()


def test_the_threaded_five_plus_three_layout_shows_target_shards_and_drafters_per_gpu(tmp_path: Path) -> None:
    write_heartbeats(_run_dir(tmp_path), "seed-8gpu-threads.toml")
    lay = _status(tmp_path)["layout"]
    assert lay["summary"] == "threads: target on GPU 0-4 (sharded), 3 drafters on GPU 5-7"
    assert lay["gpus"] == [*({"gpu": i, "holds": "target-shard"} for i in range(5)),
                           {"gpu": 5, "holds": "drafter-0"}, {"gpu": 6, "holds": "drafter-1"},
                           {"gpu": 7, "holds": "drafter-2"}]
    assert (lay["kind"], lay["world_size"], [r["rank"] for r in lay["ranks"]]) == ("threads", 1, [0])


def test_the_process_layout_reads_every_ranks_heartbeat(tmp_path: Path) -> None:
    write_heartbeats(_run_dir(tmp_path), "seed-8gpu.toml", world=8)
    lay = _status(tmp_path)["layout"]
    assert lay["summary"] == "processes: 8 ranks, rank r on GPU r (target + drafter)"
    assert lay["gpus"] == [{"gpu": r, "holds": f"rank {r}: target + drafter-{r}"} for r in range(8)]
    assert [r["devices"] for r in lay["ranks"]][3] == [{"device": "cuda:3", "gpu": 3, "holds": ["target", "drafter-3"]}]


def test_ranks_whose_heartbeat_is_not_written_yet_are_counted_as_missing(tmp_path: Path) -> None:
    write_heartbeats(_run_dir(tmp_path), "seed-8gpu.toml", world=8, ranks=range(3))
    lay = _status(tmp_path)["layout"]
    assert lay["summary"] == "processes: 8 ranks (3 on this host), rank r on GPU r (target + drafter)"
    assert [g["gpu"] for g in lay["gpus"]] == [0, 1, 2]


@pytest.mark.parametrize(("config", "summary"), [
    ("one-gpu.toml", "threads: target + 1 drafter on GPU 0"),
    ("tiny-cpu.toml", "threads: target + 3 drafters on cpu"),
])
def test_one_device_holding_target_and_drafters_is_one_phrase(tmp_path: Path, config: str, summary: str) -> None:
    write_heartbeats(_run_dir(tmp_path), config)
    lay = _status(tmp_path)["layout"]
    assert lay["summary"] == summary
    assert lay["gpus"] == ([{"gpu": 0, "holds": "target + drafter-0"}] if "gpu" in config else [])


def test_two_cpu_ranks_under_torchrun_as_the_trainer_writes_them(tmp_path: Path) -> None:
    """tests/trainer/test_process_layout.py's real heartbeats (processes on the CPU): no GPU to join."""
    run = _run_dir(tmp_path)
    for rank in (0, 1):
        where = run / f"rank-{rank}" if rank else run
        where.mkdir(exist_ok=True)
        (where / "heartbeat.json").write_text(json.dumps({"step": 3, "layout": {
            "kind": "processes", "rank": rank, "world_size": 2, "devices": {"cpu": ["target", f"drafter-{rank}"]}}}))
    lay = _status(tmp_path)["layout"]
    assert (lay["summary"], lay["gpus"]) == ("processes: 2 ranks, each on cpu (target + drafter)", [])


@pytest.mark.parametrize("heartbeat", [
    None,  # no heartbeat at all: most users' own trainers
    {"step": 12, "loss": 1.5},  # a heartbeat of another program, no layout
    {"step": 1, "layout": "threads"},
    {"step": 1, "layout": {"kind": "threads", "rank": 0, "world_size": 1, "devices": ["cuda:0"]}},
    {"step": 1, "layout": {"kind": "threads", "rank": "0", "world_size": 1, "devices": {"cuda:0": ["target"]}}},
    {"step": 1, "layout": {"kind": "processes", "rank": 0, "world_size": 0, "devices": {"cuda:0": ["target"]}}},
    {"step": 1, "layout": {"kind": "threads", "rank": 0, "world_size": 1, "devices": {}}},
])
def test_no_layout_or_a_broken_one_renders_nothing_and_never_fails(tmp_path: Path, heartbeat: dict | None) -> None:
    run = _run_dir(tmp_path)
    if heartbeat is not None:
        (run / "heartbeat.json").write_text(json.dumps(heartbeat))
    rec = _status(tmp_path)
    assert rec["layout"] is None and rec["verdict"] in ("starting", "training", "lost")


def test_a_broken_rank_heartbeat_is_left_out_and_the_others_stay(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    write_heartbeats(run, "seed-8gpu.toml", world=8, ranks=range(3))
    (run / "rank-1" / "heartbeat.json").write_text('{"layout": {"kind": "proc')  # torn (never: written atomically)
    (run / "rank-2" / "heartbeat.json").write_text(json.dumps({"layout": {"kind": "processes", "rank": 2,
                                                                          "world_size": 8, "devices": None}}))
    lay = _status(tmp_path)["layout"]
    assert [r["rank"] for r in lay["ranks"]] == [0]
    assert lay["summary"] == "processes: 8 ranks (1 on this host), rank r on GPU r (target + drafter)"


def test_a_threaded_run_across_hosts_names_this_hosts_rank_and_its_devices(tmp_path: Path) -> None:
    write_heartbeats(_run_dir(tmp_path), "seed-8gpu-threads.toml", world=2, ranks=range(1))
    lay = _status(tmp_path)["layout"]
    assert lay["summary"] == ("threads: 2 ranks (1 on this host); rank 0: target on GPU 0-4 (sharded), "
                              "3 drafters on GPU 5-7")
    assert lay["gpus"][5] == {"gpu": 5, "holds": "rank 0: drafter-0"}


def _uuid(i: int) -> str:
    return f"GPU-0000000{i}-0000-4000-8000-000000000000"


def test_a_rank_whose_cuda_visible_devices_renumbers_its_gpu_is_placed_by_the_gpus_uuid() -> None:
    """Two ranks each seeing one GPU as cuda:0 (CUDA_VISIBLE_DEVICES=1 for rank 0, =0 for rank 1): by name both would
    land on GPU 0; the UUIDs the trainer records put each on the GPU nvidia-smi shows it holding."""
    smi = "".join(f"{i}, {_uuid(i)}, NVIDIA H200, 60000, 143771, 95, 600.00\n" for i in range(2))
    layouts = [{"kind": "processes", "rank": r, "world_size": 2, "devices": {"cuda:0": ["target", f"drafter-{r}"]},
                "uuids": {"cuda:0": _uuid(1 - r).removeprefix("GPU-")}} for r in range(2)]  # torch's bare form
    doc = {"probe_version": 1, "time": 10.0, "hostname": "ct200", "layouts": layouts,
           "run": {"id": RUN, "dir": f"/ws/runs/{RUN}", "meta": {"started_at_epoch": 0.0}, "pid": 42, "alive": True,
                   "exit_code": None, "stopped": False, "heartbeat": None, "errors": {}},
           "gpus": {"source": "nvidia-smi", "nvml": [], "smi_csv": smi, "error": None}}
    lay = Watcher("h").update(parse_report(doc)).to_record()["layout"]
    assert lay["gpus"] == [{"gpu": 0, "holds": "rank 1: target + drafter-1"},
                           {"gpu": 1, "holds": "rank 0: target + drafter-0"}]
    assert lay["summary"] == ("processes: 2 ranks; rank 0: target + 1 drafter on GPU 1; "
                              "rank 1: target + 1 drafter on GPU 0")
    for rec in layouts:
        del rec["uuids"]  # a trainer that recorded none: cuda:N is taken as GPU N
    lay = Watcher("h").update(parse_report(doc)).to_record()["layout"]
    assert lay["gpus"] == [{"gpu": 0, "holds": "rank 0: target + drafter-0; rank 1: target + drafter-1"}]
