"""The flight recorder on by default under torchrun, its dumps under the run's directory, the user's settings kept."""

from __future__ import annotations

from pathlib import Path

from dflashctl.agent.lib.flightrec_env import recorder_env, under_torchrun


def test_torchrun_in_every_form_is_recognised_and_a_plain_program_is_not() -> None:
    assert under_torchrun(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert under_torchrun(["/opt/venv/bin/torchrun", "train.py"])
    assert under_torchrun(["python3", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"])
    assert under_torchrun(["bash", "-c", "cd /ws && torchrun --nproc-per-node 8 train.py > log 2>&1"])
    assert not under_torchrun(["python3", "train.py", "--torchrun-like-flag"])
    assert not under_torchrun(["python3", "-m", "trainer", "--config", "c.toml"])


def test_under_torchrun_the_recorder_is_on_with_dumps_in_the_run_dir(tmp_path: Path) -> None:
    env = recorder_env(["torchrun", "train.py"], {"PATH": "/usr/bin"}, str(tmp_path))
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "flightrec" / "nccl_trace_rank_")}
    assert (tmp_path / "flightrec").is_dir()


def test_the_users_own_settings_win_in_either_spelling(tmp_path: Path) -> None:
    user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    assert recorder_env(["torchrun", "train.py"], user, str(tmp_path)) == {}
    assert not (tmp_path / "flightrec").exists()


def test_a_program_not_under_torchrun_gets_nothing(tmp_path: Path) -> None:
    assert recorder_env(["python3", "train.py"], {}, str(tmp_path)) == {}
