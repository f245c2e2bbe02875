"""`launch --exclude-unhealthy-gpus` (issue 28 part 3) against the nvidia-smi stand-in on the local host: a program
gets the healthy GPUs as CUDA_VISIBLE_DEVICES and the launch says which it left out and why; the trainer (whose
config names its GPUs) is refused, as is a launch with no healthy GPU left; without the flag nothing changes."""

from __future__ import annotations

import pytest

from .conftest import FAKE_TRAINER
from .userprog import local_box, write_prog

pytestmark = pytest.mark.timeout(240)

REMAP = {"remapped_rows.pending": "Yes"}
ECC = {"ecc.errors.uncorrected.volatile.total": 2}


def _exec(cli, src, *flags):  # noqa: ANN001, ANN202
    return cli("launch", "--source", str(src), "--json", "--wait-for", "exit", *flags, "--exec", "--",
               "python3", "-c", "import os; print('visible=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'))")


def test_a_program_gets_the_healthy_gpus_and_the_launch_says_which_it_left_out(local_host, cli, tmp_path):
    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3, **REMAP}, {"memory.used": 3}])
    src = write_prog(tmp_path / "myproject")
    res = _exec(cli, src, "--exclude-unhealthy-gpus")
    assert res.code == 0, res.err
    doc = res.json()
    assert any(n.startswith("left out GPU 1 (row-remap-pending: remapped_rows.pending=yes") and
               n.endswith("the program gets CUDA_VISIBLE_DEVICES=0,2") for n in doc["notes"]), doc["notes"]
    log = (local_box(local_host, tmp_path).run_dir(doc["run_id"]) / "train.log").read_text()
    assert "visible=0,2" in log


def test_without_the_flag_nothing_is_left_out(local_host, cli, tmp_path):
    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3, **REMAP}])
    src = write_prog(tmp_path / "myproject")
    res = _exec(cli, src)
    assert res.code == 0, res.err
    log = (local_box(local_host, tmp_path).run_dir(res.json()["run_id"]) / "train.log").read_text()
    assert "visible=-" in log


def test_no_healthy_gpu_left_refuses_in_one_line(local_host, cli, tmp_path):
    local_host.set_gpus([{"memory.used": 3, **ECC}, {"memory.used": 3, **REMAP}])
    src = write_prog(tmp_path / "myproject")
    res = _exec(cli, src, "--exclude-unhealthy-gpus")
    assert res.code == 2, res.err
    line = res.err.strip().splitlines()[0]
    assert "no healthy GPU remains: GPU 0 (ecc-uncorrected" in line and "GPU 1 (row-remap-pending" in line


def test_the_trainer_with_an_unhealthy_configured_gpu_is_refused(local_host, cli, tmp_path, monkeypatch):
    hosts = tmp_path / "gpu-hosts.toml"
    hosts.write_text(local_host.hosts_file.read_text() + "gpus = { target = [0], drafters = [1] }\n")
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(hosts))
    local_host.set_gpus([{"memory.used": 3}, {"memory.used": 3, **ECC}])
    res = cli("launch", "--source", str(FAKE_TRAINER), "--exclude-unhealthy-gpus")
    assert res.code == 2 and "unhealthy GPUs the trainer is configured to use: GPU 1 (ecc-uncorrected" in res.err
