"""Over the loopback sshd + `pct` into a real container: `status` (one-shot, table and --json) says which GPU holds
what from the heartbeats the trainer's own code writes for the seed's 8-rank process layout, joined with the eight
GPUs' rows (nvidia-smi stand-in), and puts the flight recorder's verdict (real gloo dumps in the run's flightrec/)
right under the header; `status --watch` shows dumps that appear while it watches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashctl.cli import main
from dflashctl.commands import status as status_cmd
from dflashctl.remote import connect
from status.frdumps import gloo_hang_dumps, put_dumps
from status.heartbeats import write_heartbeats
from status.runprog import start_in_container

RUN_ID = "20261203-140000-layout"
BEHIND = ("rank 1 behind: never entered all_reduce #5 of process group default_pg, where rank 0 waits "
          "(rank 1's last: broadcast #4)")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gloo_hang_dumps(tmp_path_factory.mktemp("frdumps"))


def test_status_shows_the_layout_per_gpu_and_the_rank_behind_first(pve, dumps: Path, capsys) -> None:  # noqa: ANN001
    run = start_in_container(pve, RUN_ID)
    write_heartbeats(run, "seed-8gpu.toml", world=8)
    put_dumps(run, dumps)
    pve.set_gpus([{"memory.used": 70000, "utilization.gpu": 95, "power.draw": 600.0}] * 8)
    capsys.readouterr()
    main(["status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    lay = doc["layout"]
    assert lay["summary"] == "processes: 8 ranks, rank r on GPU r (target + drafter)"
    assert lay["gpus"] == [{"gpu": r, "holds": f"rank {r}: target + drafter-{r}"} for r in range(8)]
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    fr = doc["flight_recorder"]
    assert fr["dir"] == f"/workspace/dflash/runs/{RUN_ID}/flightrec" and fr["ranks"] == [0, 1]
    assert [b["summary"] for b in fr["behind"]] == [BEHIND]

    main(["status"])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"flight recorder: {BEHIND}"  # right under the header (no other cause here)
    assert "flight recorder dumps of ranks 0,1" in out[2]
    assert "layout  processes: 8 ranks, rank r on GPU r (target + drafter)" in out
    header = next(ln for ln in out if ln.lstrip().startswith("gpu ") and "holds" in ln)
    rows = out[out.index(header) + 1: out.index(header) + 9]
    assert [r.split()[0] for r in rows] == [str(i) for i in range(8)]
    assert all(r.endswith(f"rank {i}: target + drafter-{i}") for i, r in enumerate(rows)), rows


def test_status_of_another_trainer_shows_no_layout_and_no_recorder(pve, capsys) -> None:  # noqa: ANN001
    run = start_in_container(pve, "20261203-140000-own")
    (run / "heartbeat.json").write_text(json.dumps({"step": 4, "loss": 1.0}))  # a user's own trainer's file
    pve.set_gpus([{"memory.used": 70000, "utilization.gpu": 95}] * 2)
    capsys.readouterr()
    main(["status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert (doc["layout"], doc["flight_recorder"]) == (None, None)
    main(["status"])
    out = capsys.readouterr().out
    assert "GPUs" in out and "layout" not in out and "flight recorder" not in out and "holds" not in out


def test_watch_shows_dumps_that_appear_while_it_watches(pve, dumps: Path) -> None:  # noqa: ANN001
    run = start_in_container(pve, RUN_ID)
    write_heartbeats(run, "seed-8gpu-threads.toml")
    views = status_cmd.watch(lambda: connect(pve.host), interval=0.3)
    try:
        first = next(views)
        assert first.flight_recorder is None
        assert first.layout is not None and first.layout.line() == \
            "threads: target on GPU 0-4 (sharded), 3 drafters on GPU 5-7"
        put_dumps(run, dumps)
        for n, view in enumerate(views):  # the stream's next reports (each interval, or at once on a crash line)
            if view.flight_recorder is not None:
                break
            assert n < 200, "the watch never showed the dumps"
        assert [b.line() for b in view.flight_recorder.behind] == [BEHIND]
        assert view.to_record()["flight_recorder"]["behind"][0]["behind"] == [1]
    finally:
        views.close()
