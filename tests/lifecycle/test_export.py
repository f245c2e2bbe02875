"""`dflashctl export`: a real trainer run's drafter exported in the container (config.json + model.safetensors, the
reference dflash layout) and copied to the laptop through the command channel, on the `local` host and through
ssh + `pct exec`; checked by sha256, never overwriting, idempotent in the container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(params=["local", pytest.param("pve", marks=[pytest.mark.sshd])])
def host_env(request):
    return request.getfixturevalue("local_host" if request.param == "local" else "pve")


def test_export_copies_a_runs_drafter_here_checked_and_never_overwrites(host_env, cli, tmp_path):
    trained = cli("launch", "--name", "tiny", "--wait-for", "exit", "--timeout", "240", "--json", "--",
                  "--set", "train.steps=12")
    assert trained.code == 0, trained.err
    run_id = trained.json()["run_id"]

    out = tmp_path / "laptop" / "drafter"
    res = cli("export", "--out", str(out), "--dtype", "float32", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["run_id"] == run_id and doc["reused"] is False and doc["local_dir"] == str(out)
    assert doc["remote_dir"].endswith("/exports/step-00000012-float32")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dtype"] == "float32"
    assert (out / "model.safetensors").stat().st_size == doc["files"]["model.safetensors"]["size"]

    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    assert "layers.0.self_attn.q_norm.weight" in weights and "fc.weight" in weights

    again = cli("export", "--out", str(out))
    assert again.code == 2 and "already exists" in again.err and "Traceback" not in again.err
    second = cli("export", run_id, "--out", str(tmp_path / "second"), "--dtype", "float32", "--json")
    assert second.code == 0, second.err
    assert second.json()["reused"] is True  # the container kept the first export
    assert (tmp_path / "second" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert not list((tmp_path / "laptop").glob(".*part*"))  # no temp left behind


def test_export_of_something_that_is_not_a_trained_run_is_one_line(local_host, cli, tmp_path):
    nothing = cli("export")
    assert nothing.code == 102 and "no training run" in nothing.err
    unknown = cli("export", "20990101-000000-nope")
    assert unknown.code == 102 and "Traceback" not in unknown.err
    bad = cli("export", "--dtype", "int8")
    assert bad.code == 2 and "--dtype" in bad.err


def test_export_of_a_checkpoint_the_container_refuses_is_its_one_line_and_exit_2(local_host, cli, tmp_path):
    import torch

    trained = cli("launch", "--name", "old", "--wait-for", "exit", "--timeout", "240", "--json", "--",
                  "--set", "train.steps=4")
    assert trained.code == 0, trained.err
    run_dir = Path(trained.json()["run_dir"])
    (ckpt,) = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    state = torch.load(ckpt, weights_only=True)
    del state["drafter_meta"]  # as the trainer wrote checkpoints before the reference layout
    torch.save(state, ckpt)
    res = cli("export", "--out", str(tmp_path / "d"))
    assert res.code == 2 and "Traceback" not in res.err, res.err
    assert "older trainer" in res.err and not (tmp_path / "d").exists()
