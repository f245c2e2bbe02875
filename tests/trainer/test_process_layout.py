"""The process layout (runtime.layout = "processes") on the CPU under torchrun: 2 ranks (gloo), each holding the
target and one drafter, gradients reduced by torch DDP (bf16 buckets by default). It trains, shows its layout in
the heartbeat, gives one process's per-step loss for the same global batch (also with short responses: replicas
holding different numbers of real labels, trimmed to different block counts), resumes bit-exact after SIGTERM, and
a crash on one rank ends both naming the rank."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
from harness.sshd import free_port
from test_distributed import identical, replicas
from trainer_harness import FAST, Run

from trainer.dataset import GeneratedData, write_shard
from trainer.loss import position_weights, weight_total

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


def _short_responses(out: Path) -> tuple[Path, Path]:
    """A tiny Hugging Face target written here (trainer/hf_tiny.py, never downloaded) and a generated data directory
    in its vocabulary whose responses run from 2 to 40 tokens: most rows have fewer anchor positions than
    train.num_anchors = 4, so batches are trimmed, and replicas hold different numbers of real labels."""
    from trainer.hf_tiny import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(out / "tiny-qwen3", "qwen3")
    rng = random.Random(5)
    samples = [([rng.randrange(300) for _ in range(16)], [rng.randrange(300) for _ in range(n)], True)
               for n in [2, 3, 4, 40, 2, 5, 3, 30, 2, 4, 3, 25, 2, 3, 6, 40]]
    data = out / "data"
    data.mkdir(parents=True)
    (data / "meta.json").write_text(json.dumps({"vocab_size": 385, "pad_token_id": 0}))
    write_shard(data / "shard-00000.pt", list(range(len(samples))), samples)
    return ckpt, data


def test_short_responses_two_ranks_match_one_process_with_the_global_token_weighted_loss(launch, tmp_path):
    """Replicas holding different numbers of real labels (and trimmed to different block counts): the process
    layout (DDP, fp32 buckets) logs the per-step loss of one process with both replicas as threads — both divide
    every replica's label-weighted sum by the global batch's weight sum (trainer/loss.py) — to FP32_REL."""
    ckpt, data = _short_responses(tmp_path / "short")
    gen = GeneratedData(data, 64, 16, 4, 0, 385)
    w = position_weights(16, 7.0)
    per_replica = [[float(weight_total(b.anchors[r * 2:r * 2 + 2], b.ends[r * 2:r * 2 + 2], w)) for r in (0, 1)]
                   for b in (gen.batch(s, 4) for s in range(6))]
    assert any(max(p) > 2 * min(p) for p in per_replica), per_replica  # the per-replica mean would differ
    common = ["--set", f"target.path={ckpt}", "--set", "data.kind=generated", "--set", f"data.dir={data}",
              "--set", "train.steps=6"]
    proc = launch("short-proc", *PROC, *FP32, *common)
    assert proc.wait(300) == 0, proc.log[-3000:]
    # one process, compiled at warm-up: every block count the data can be trimmed to is built there, none later
    single = launch("short-one", "--set", 'devices.drafters=["cpu","cpu"]', *common,
                    "--set", "runtime.compile_strategy=warmup", nproc=0)
    assert single.wait(300) == 0, single.log[-3000:]
    assert "training finished steps=6 recompiles=0" in single.log, single.log[-3000:]
    p_steps, s_steps = proc.steps(), single.steps()
    assert sorted(p_steps) == sorted(s_steps) == list(range(1, 7))
    for step in s_steps:
        assert float(p_steps[step]) == pytest.approx(float(s_steps[step]), rel=FP32_REL), step
