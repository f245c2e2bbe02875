"""The process layout (runtime.layout = "processes") on the CPU under torchrun: 2 ranks (gloo), each holding the
target and one drafter, gradients reduced by torch DDP (bf16 buckets by default). It trains, shows its layout in
the heartbeat, gives one process's per-step loss for the same global batch, resumes bit-exact after SIGTERM, and a
crash on one rank ends both naming the rank."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from harness.sshd import free_port
from test_distributed import identical, replicas
from trainer_harness import FAST, Run

PROC = ["--set", 'devices.drafters=["cpu"]', "--set", "runtime.layout=processes"]
FP32 = ["--set", "runtime.grad_reduce_dtype=fp32"]
# Tolerances of the per-step loss against one process with both replicas (6 steps): fp32 buckets sum the same two
# gradients in the same order, so equal to print precision; bf16 buckets round each gradient to 8 mantissa bits
# (relative 2^-9) before the mean, and AdamW carries that into the next steps' losses: 1 % relative.
FP32_REL, BF16_REL = 1e-6, 1e-2


@pytest.fixture
def launch(start_trainer, tmp_path):  # noqa: ANN001 - conftest's fixture
    def start(name: str, *args: str, nproc: int = 2, env: dict[str, str] | None = None,
              run_dir: Path | None = None) -> Run:
        launcher = (["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr",
                     "127.0.0.1", "--master-port", str(free_port())] if nproc else [])
        return start_trainer(*FAST, *args, run_dir=run_dir or tmp_path / name, env=env, launcher=launcher,
                             log=tmp_path / f"{name}.log")

    return start


def test_two_ranks_train_show_their_layout_and_match_one_process_with_the_same_global_batch(launch, tmp_path):
    steps = ["--set", "train.steps=6"]
    bf16 = launch("bf16", *PROC, *steps, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-bf16")})
    assert bf16.wait(300) == 0, bf16.log[-3000:]
    fp32 = launch("fp32", *PROC, *FP32, *steps, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-fp32")})
    assert fp32.wait(300) == 0, fp32.log[-3000:]
    single = launch("single", "--set", 'devices.drafters=["cpu","cpu"]', *steps, nproc=0)
    assert single.wait(300) == 0, single.log[-3000:]

    first = next(line for line in bf16.log.splitlines() if line.startswith("trainer starting"))
    assert "layout=processes" in first and "rank=0 world_size=2" in first and "drafters=1" in first
    assert any(line.startswith("warm-up barrier passed") for line in bf16.log.splitlines())
    assert bf16.heartbeat()["layout"] == {"kind": "processes", "rank": 0, "world_size": 2,
                                          "devices": {"cpu": ["target", "drafter-0"]}}
    rank1 = (bf16.run_dir / "rank-1" / "heartbeat.json").read_text()
    assert '"layout": {"kind": "processes", "rank": 1, "world_size": 2, "devices": {"cpu": ["target", "drafter-1"]}}' \
        in rank1
    s_steps = single.steps()
    assert sorted(s_steps) == sorted(bf16.steps()) == sorted(fp32.steps()) == list(range(1, 7))
    for step in s_steps:
        assert float(fp32.steps()[step]) == pytest.approx(float(s_steps[step]), rel=FP32_REL), step
        assert float(bf16.steps()[step]) == pytest.approx(float(s_steps[step]), rel=BF16_REL), step
    # the bf16 buckets are really in use: the weights differ from the fp32 run's (the 4-decimal losses may not)
    b, f = replicas(tmp_path / "dump-bf16", 2), replicas(tmp_path / "dump-fp32", 2)
    assert identical(b[0], b[1]) and identical(f[0], f[1]) and not identical(b[0], f[0])


def test_resume_after_sigterm_is_bit_exact(launch, tmp_path):
    steps = ["--set", "train.steps=8", "--set", "train.checkpoint_interval=0"]
    whole = launch("whole", *PROC, *steps, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-whole")})
    assert whole.wait(300) == 0, whole.log[-3000:]

    # rank 0's coordinator holds step index 4 back until the SIGTERM; step=3's line is printed (a step late) while
    # index 3 trains, so by then every rank is at most at index 4
    part = launch("part", *PROC, *steps, env={"DFLASH_FAULT": "0/coordinator@4:hang"})
    part.wait_for(lambda: "DFLASH_FAULT: coordinator hangs at step 4" in part.log and 3 in part.steps(),
                  timeout=300, what="the hang at step index 4")
    part.proc.send_signal(signal.SIGTERM)
    part.wait(300)
    stopped = [line for line in part.log.splitlines() if "training stopped by SIGTERM step=" in line]
    assert len(stopped) == 2, part.log[-3000:]
    at = int(stopped[0].split("step=")[1].split()[0])
    assert all(f"training stopped by SIGTERM step={at} " in line for line in stopped)  # both ranks, one step
    assert 4 < at < 8

    rest = launch("rest", *PROC, *steps, "--resume", run_dir=part.run_dir,
                  env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-rest")})
    assert rest.wait(300) == 0, rest.log[-3000:]
    assert f"resume: continuing from the checkpoint of step {at}" in rest.log
    assert sorted(rest.steps()) == list(range(at + 1, 9))
    assert all(rest.steps()[s] == whole.steps()[s] for s in rest.steps())
    resumed, reference = replicas(tmp_path / "dump-rest", 2), replicas(tmp_path / "dump-whole", 2)
    assert len(resumed) == 2 and all(identical(a, b) for a, b in zip(resumed, reference, strict=True))
    assert identical(reference[0], reference[1])  # DDP keeps the ranks' replicas identical


def test_a_crash_on_rank_1_ends_both_ranks_naming_it(launch):
    crash = launch("crash", *PROC, "--set", "train.steps=50", "--set", "runtime.dist_timeout_s=900",
                   env={"DFLASH_FAULT": "1/drafter-0@2"})
    assert crash.wait(240) != 0
    lines = crash.log.splitlines()
    named = "rank 1 drafter-0 crashed: RuntimeError: DFLASH_FAULT: injected fault in drafter-0 at step 2"
    assert any(line.startswith(f"training aborted: {named}") for line in lines), crash.log[-3000:]
    assert any(line.startswith(f"[rank 1] training aborted: {named}") for line in lines)
    assert crash.log.count("exitcode  : 1 ") == 2, crash.log[-3000:]
    assert not (crash.run_dir / "checkpoints").exists()
