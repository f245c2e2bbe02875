"""CUDA graphs are off by default, in the code and in every shipped config; the start-up probe says "not
applicable" on the CPU and a run that asks for graphs there logs the probe's verdict and trains."""

from __future__ import annotations

import tomllib

from trainer_harness import FAST, REPO

from trainer.config import RuntimeConfig, load_config
from trainer.graph_probe import probe


def test_cuda_graphs_are_off_by_default_in_code_and_every_shipped_config():
    assert RuntimeConfig().cuda_graphs is False
    configs = sorted((REPO / "trainer" / "configs").glob("*.toml"))
    assert len(configs) >= 4
    for path in configs:
        assert tomllib.loads(path.read_text()).get("runtime", {}).get("cuda_graphs", False) is False, path.name
    assert load_config(None, ["runtime.cuda_graphs=true"]).runtime.cuda_graphs is True  # still a choice


def test_probe_on_the_cpu_is_not_applicable():
    found = probe("cpu")
    assert found.verdict == "not applicable" and not found.safe and found.pool_mib == 0
    assert found.line("cpu") == "cuda_graphs_probe device=cpu verdict=not-applicable detail=no CUDA graphs on the CPU"


def test_a_cpu_run_asking_for_graphs_logs_the_probe_and_trains(start_trainer):
    run = start_trainer(*FAST, "--set", "runtime.compile_strategy=warmup", "--set", "runtime.cuda_graphs=true",
                        "--set", "train.steps=2")
    assert run.wait(600) == 0, run.log[-3000:]
    assert "cuda_graphs_probe device=cpu verdict=not-applicable" in run.log
    assert sorted(run.steps()) == [1, 2]
