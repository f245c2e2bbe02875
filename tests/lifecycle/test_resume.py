"""`launch --resume-from RUN`: a new run directory that starts from an ended run's newest checkpoint, never
touching the old one; bad sources are refused in one line before anything is created."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import FAKE_TRAINER, write_config

pytestmark = pytest.mark.timeout(120)


def finished_run(cli, tmp_path: Path, name: str = "base", *extra: str) -> dict:
    cfg = write_config(tmp_path / f"{name}.toml", mode="train", steps=3, step_s=0.01)
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", name, "--wait-for", "exit",
              "--json", *(["--", *extra] if extra else []))
    assert res.code == 0, res.err
    return res.json()


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under path -> (size, mtime_ns): what 'untouched' means."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()}


def test_resume_starts_a_new_run_from_the_newest_checkpoint_and_leaves_the_old_run_as_it_was(local_host, cli,
                                                                                             tmp_path):
    base = finished_run(cli, tmp_path, "base", "--set", "train.steps=3000", "--set", "train.lr=0.01")
    old = Path(base["run_dir"])
    ck = old / "checkpoints"
    ck.mkdir()
    for step in (10, 20):
        (ck / f"step-{step:08d}.pt").write_bytes(f"weights at {step}".encode())
    (ck / ".step-00000030.pt.tmp-99").write_bytes(b"half-written")  # a temp file is never a checkpoint
    before = tree(old)

    res = cli("launch", "--source", str(FAKE_TRAINER), "--resume-from", base["run_id"], "--wait-for", "exit",
              "--json", "--", "--set", "train.lr=0.001")
    assert res.code == 0, res.err
    doc = res.json()
    new = Path(doc["run_dir"])
    assert new != old and doc["name"] == "base"  # the source run's name and a fresh directory
    taken = new / "checkpoints" / "step-00000020.pt"
    assert os.path.samefile(taken, ck / "step-00000020.pt")  # linked, not copied
    assert sorted(p.name for p in (new / "checkpoints").iterdir()) == ["step-00000020.pt"]
    assert doc["resumed_from"] == {"run": base["run_id"], "checkpoint": str(ck / "step-00000020.pt"), "step": 20,
                                   "linked": True}
    assert any(f"resuming run {base['run_id']} from its checkpoint at step 20" in n for n in doc["notes"])
    # the source run's overrides carry over; the ones given now follow them, so they win
    assert json.loads((new / "argv.json").read_text())["extra"] == [
        "--resume", "--set", "train.steps=3000", "--set", "train.lr=0.01", "--set", "train.lr=0.001"]
    assert (new / "config.toml").read_text() == (old / "config.toml").read_text()  # its config, unless --config
    assert json.loads((new / "meta.json").read_text())["resumed_from"]["step"] == 20
    assert tree(old) == before


def test_resume_refuses_a_run_without_checkpoints_an_unknown_run_and_a_live_run_in_one_line(local_host, cli,
                                                                                            tmp_path):
    base = finished_run(cli, tmp_path)
    runs = local_host.workspace_dir / "runs"
    count = len(list(runs.iterdir()))

    none = cli("launch", "--source", str(FAKE_TRAINER), "--resume-from", base["run_id"])
    assert none.code == 2 and f"run {base['run_id']} has no checkpoint to resume from" in none.err
    assert "Traceback" not in none.err and len(list(runs.iterdir())) == count  # nothing created

    unknown = cli("launch", "--source", str(FAKE_TRAINER), "--resume-from", "20990101-000000-nope")
    assert unknown.code == 102 and "Traceback" not in unknown.err
    assert len(list(runs.iterdir())) == count
    empty = cli("launch", "--source", str(FAKE_TRAINER), "--resume-from", "")
    assert empty.code == 2 and "empty run id" in empty.err and len(list(runs.iterdir())) == count

    cfg = write_config(tmp_path / "long.toml", mode="train", step_s=0.05)
    live = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "live", "--json")
    assert live.code == 0, live.err
    busy = cli("launch", "--source", str(FAKE_TRAINER), "--resume-from", live.json()["run_id"])
    assert busy.code == 2 and "is still running" in busy.err
    assert cli("stop").code == 103
