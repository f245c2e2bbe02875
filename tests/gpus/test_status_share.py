"""status beside the host view (issue 29): the run's GPUs' share (memory held by its processes against every other
process on the same GPU) and its loss and τ as sparklines."""

from __future__ import annotations

import io
import json

from rich.console import Console

from dflashctl.cli import main
from dflashctl.cli.statusview import render_view
from dflashctl.commands.status import status_once

from .scene import CUR

LOG = "".join(f"step={s} loss={6.0 - s * 0.4:.4f} tok/s=1800.0 acc_len={1.0 + s * 0.2:.2f}\n" for s in range(1, 11))


def test_status_shows_the_runs_share_of_its_gpus_and_loss_and_tau_sparklines(scene, capsys):
    (scene.pve.workspace_dir / "dflash" / "runs" / CUR / "train.log").write_text(LOG)
    main(["status", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["id"] == CUR
    share = {g["gpu"]: (g["ours_mib"], g["others_mib"]) for g in doc["gpu_share"]}
    assert share[0] == (70000.0, 1000.0)  # the run's process against the unmarked one beside it
    assert share[1] == (0.0, 30000.0)  # the zombie of the earlier run is not the run's
    assert doc["training"]["loss"] == [round(6.0 - s * 0.4, 4) for s in range(1, 11)]
    assert doc["training"]["acc_len"][-1] == 3.0
    main(["status"])
    out = capsys.readouterr().out
    assert "run / others (host)" in out and "70000 / 1000 MiB" in out
    assert "training" not in out  # the sparklines go beside the GPU histories of a watch
    with scene.pve.connect() as target:
        view = status_once(target)
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(render_view(view, history=True))
    line = next(ln for ln in console.export_text().splitlines() if ln.startswith("training"))
    assert line.rstrip() == "training  loss ██▇▆▅▄▃▂▁▁ 2  τ ▁▁▂▃▄▅▆▇██ 3"  # the loss falls, τ rises
