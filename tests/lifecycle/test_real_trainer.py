"""The real trainer (trainer/, torch on the CPU) through the whole lifecycle: no stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _trainer_present() -> bool:
    root = Path(__file__).resolve().parents[2] / "trainer"
    return (root / "__main__.py").is_file() and (root / "configs" / "tiny-cpu.toml").is_file()


@pytest.mark.skipif(not _trainer_present(), reason="trainer/ with configs/tiny-cpu.toml is not in this tree")
def test_real_trainer_deploy_launch_step_stop_on_local(local_host, cli):
    res = cli("launch", "--name", "real", "--wait-for", "step", "--timeout", "240", "--json", "--",
              "--set", "train.steps=100000")
    assert res.code == 0, res.err
    doc = res.json()
    assert doc["wait"]["reached"] and doc["wait"]["line"].startswith("step=")
    assert any("deployed" in n for n in doc["notes"])
    rd = Path(doc["run_dir"])
    assert (rd / "config.toml").read_text() == (Path(__file__).resolve().parents[2] / "trainer" / "configs"
                                                / "tiny-cpu.toml").read_text()
    assert cli("launch", "--name", "again").code == 2  # refused while the first one trains
    stopped = cli("stop", "--json")
    assert stopped.code == 103 and stopped.json()["exit_code"] == 143  # the trainer's own SIGTERM exit
    assert not alive(doc["pid"])
    log = (rd / "train.log").read_text()
    assert "received SIGTERM" in log and "[dflashctl] trainer exited with code 143" in log
    assert cli("runs", "--json").json()["runs"][0]["verdict"] == "stopped"


@pytest.mark.skipif(not _trainer_present(), reason="trainer/ with configs/tiny-cpu.toml is not in this tree")
def test_real_trainer_stopped_run_resumes_from_its_stop_checkpoint_in_a_new_run(local_host, cli):
    first = cli("launch", "--name", "resumable", "--wait-for", "step", "--timeout", "240", "--json", "--",
                "--set", "train.steps=100000", "--set", "train.log_interval=1")
    assert first.code == 0, first.err
    assert cli("stop").code == 103
    old = Path(first.json()["run_dir"])
    stop_line = next(ln for ln in (old / "train.log").read_text().splitlines() if "stopped by SIGTERM" in ln)
    stopped_at = int(stop_line.split("step=")[1].split()[0])

    again = cli("launch", "--resume-from", "latest", "--wait-for", "step", "--timeout", "240", "--json")
    assert again.code == 0, again.err
    doc = again.json()
    assert doc["resumed_from"]["run"] == old.name and doc["resumed_from"]["step"] == stopped_at
    log = (Path(doc["run_dir"]) / "train.log").read_text()
    assert f"resume: continuing from the checkpoint of step {stopped_at}" in log
    first_step = int(doc["wait"]["line"].split()[0].removeprefix("step="))
    assert first_step == stopped_at + 1  # log_interval=1 (the old run's config): the very next step
    assert cli("stop").code == 103


@pytest.mark.timeout(900)
@pytest.mark.skipif(not _trainer_present(), reason="trainer/ with configs/tiny-cpu.toml is not in this tree")
def test_a_compile_cache_truncated_after_a_first_run_does_not_stop_the_next_launch(local_host, cli):
    """Issue 24: a kill mid-compile leaves 0-byte artefacts in the shared inductor cache; the next launch must still
    reach its first step (the trainer removes the artefact and compiles again once, and says so in its log)."""
    args = ["--", "--set", "train.steps=100000", "--set", 'devices.drafters=["cpu"]',
            "--set", "runtime.compile_strategy=warmup"]
    first = cli("launch", "--name", "cold", "--wait-for", "step", "--timeout", "800", "--json", *args)
    assert first.code == 0, first.err
    assert cli("stop").code == 103
    cache = local_host.workspace_dir / "cache" / "inductor"  # where launched runs compile (docs/usage.md)
    compiled = [p for p in cache.rglob("*") if p.is_file() and p.suffix in (".so", ".py")]
    assert compiled, f"the first run compiled nothing into {cache}"
    for p in compiled:
        p.write_bytes(b"")  # what a kill mid-write leaves
    again = cli("launch", "--name", "after-truncation", "--wait-for", "step", "--timeout", "800", "--json", *args)
    assert again.code == 0, again.err
    log = (Path(again.json()["run_dir"]) / "train.log").read_text()
    assert "compile cache: corrupt artefact " in log and "failed again" not in log, log[-3000:]
    assert cli("stop").code == 103
