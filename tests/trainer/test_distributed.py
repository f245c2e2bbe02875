"""The trainer on torch.distributed: torchrun --nnodes 1 --nproc-per-node 2 (gloo on the CPU), two drafter threads per
process, real processes on loopback. Replicas stay bit-identical, the loss is a single process's with the same global
batch, resume after SIGTERM is exact, and a drafter crash on rank 1 ends both ranks naming rank and thread."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from harness.sshd import free_port
from trainer_harness import FAST, Run

TWO = ["--set", 'devices.drafters=["cpu","cpu"]']
FOUR = ["--set", 'devices.drafters=["cpu","cpu","cpu","cpu"]']
SMALL_BUCKETS = ["--set", "runtime.dist_bucket_mb=0.001"]


@pytest.fixture
def launch(start_trainer, tmp_path):  # noqa: ANN001 - conftest's fixture
    def start(name: str, *args: str, nproc: int = 2, env: dict[str, str] | None = None,
              run_dir: Path | None = None) -> Run:
        """`torchrun ... -m trainer` (nproc = 0: plain `python -m trainer`, no launcher variables)."""
        launcher = (["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr",
                     "127.0.0.1", "--master-port", str(free_port())] if nproc else [])
        return start_trainer(*FAST, *args, run_dir=run_dir or tmp_path / name, env=env, launcher=launcher,
                             log=tmp_path / f"{name}.log")

    return start


def replicas(dump: Path, ranks: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for r in range(ranks):
        state = torch.load(dump / f"rank-{r}.pt", weights_only=True)
        out += [state[k] for k in sorted(state)]
    return out


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_processes_keep_four_replicas_identical_and_match_one_process(launch, tmp_path):
    steps = ["--set", "train.steps=6"]
    dist = launch("dist", *TWO, *steps, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-dist")})
    assert dist.wait(300) == 0, dist.log[-3000:]
    # 1 KiB buckets: ~86 collectives a step in flight at once, each launched as its part of the mean is summed
    buckets = launch("buckets", *TWO, *steps, *SMALL_BUCKETS, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-b")})
    assert buckets.wait(300) == 0, buckets.log[-3000:]
    single = launch("single", *FOUR, *steps, nproc=0, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-one")})
    assert single.wait(300) == 0, single.log[-3000:]

    four = replicas(tmp_path / "dump-dist", 2)
    assert len(four) == 4 and all(identical(four[0], r) for r in four[1:])
    # two ranks: a + b == b + a, so any bucketing gives the one-bucket run's bits, loss lines and all
    assert all(identical(a, b) for a, b in zip(four, replicas(tmp_path / "dump-b", 2), strict=True))
    assert buckets.steps() == dist.steps()
    first = next(line for line in dist.log.splitlines() if line.startswith("trainer starting"))
    assert "rank=0 world_size=2" in first and "drafters=2" in first
    assert any(line.startswith("[rank 1] trainer starting") and "rank=1 world_size=2" in line
               for line in dist.log.splitlines())

    d_steps, s_steps = dist.steps(), single.steps()  # rank 0 alone prints `step=` lines
    assert sorted(d_steps) == sorted(s_steps) == list(range(1, 7))
    for step in s_steps:
        assert float(d_steps[step]) == pytest.approx(float(s_steps[step]), rel=1e-3, abs=1e-4), step
    one = replicas(tmp_path / "dump-one", 1)[0]
    for key in one:  # the same update up to the order of the float sums (two means of two vs one of four)
        torch.testing.assert_close(four[0][key], one[key], rtol=1e-3, atol=1e-4)


def test_resume_after_sigterm_continues_exactly(launch, tmp_path):
    steps = ["--set", "train.steps=8", "--set", "train.checkpoint_interval=0"]
    whole = launch("whole", *TWO, *steps, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-whole")})
    assert whole.wait(300) == 0, whole.log[-3000:]

    # rank 0's coordinator holds step index 4 back until the SIGTERM: once step=4 is logged every rank waits for it,
    # and rank 0's drafters train it with the stop flag set, so the stop lands on step 5 whatever the speed
    part = launch("part", *TWO, *steps, env={"DFLASH_FAULT": "0/coordinator@4:hang"})
    part.wait_for(lambda: "DFLASH_FAULT: coordinator hangs at step 4" in part.log and 4 in part.steps(),
                  timeout=300, what="the hang after step 4")
    part.proc.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks
    part.wait(300)
    assert "training stopped by SIGTERM step=5" in part.log, part.log[-3000:]
    assert "[rank 1] training stopped by SIGTERM step=5" in part.log, part.log[-3000:]
    ckpt = torch.load(part.run_dir / "checkpoints" / "step-00000005.pt", weights_only=True)
    assert ckpt["distributed"] == {"world_size": 2, "drafters_per_process": 2}
    assert [(p["rank"], p["replicas"], p["next_step"]) for p in ckpt["data_positions"]] == [
        (0, [0, 1], 5), (1, [2, 3], 5)]

    rest = launch("rest", *TWO, *steps, "--resume", run_dir=part.run_dir,
                  env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-rest")})
    assert rest.wait(300) == 0, rest.log[-3000:]
    assert "resume: continuing from the checkpoint of step 5" in rest.log
    assert sorted(rest.steps()) == [6, 7, 8]
    for step in (6, 7, 8):
        assert rest.steps()[step] == whole.steps()[step]
    resumed, reference = replicas(tmp_path / "dump-rest", 2), replicas(tmp_path / "dump-whole", 2)
    assert all(identical(a, b) for a, b in zip(resumed, reference, strict=True))


def test_resume_refuses_another_replica_count(launch, tmp_path):
    first = launch("layout", *TWO, "--set", "train.steps=2")
    assert first.wait(300) == 0, first.log[-3000:]
    again = launch("layout-one", *TWO, "--set", "train.steps=4", "--resume", nproc=0, run_dir=first.run_dir)
    assert again.wait(300) == 2
    errors = [line for line in again.log.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1 and "2 process(es) x 2 drafters = 4 replicas" in errors[0], again.log[-2000:]
    assert "Traceback" not in again.log


@pytest.mark.parametrize("buckets", [[], SMALL_BUCKETS], ids=["one-bucket", "1KiB-buckets"])
def test_drafter_crash_on_rank_1_ends_both_ranks_naming_it(launch, tmp_path, buckets):
    # a collective timeout of 15 minutes: ending within the wait below takes the store's failure flag
    crash = launch("crash", *TWO, "--set", "train.steps=50", "--set", "runtime.dist_timeout_s=900", *buckets,
                   env={"DFLASH_FAULT": "1/drafter-1@2"})
    rc = crash.wait(240)
    assert rc != 0
    lines = crash.log.splitlines()
    named = "rank 1 drafter-1 crashed: RuntimeError: DFLASH_FAULT: injected fault in drafter-1 at step 2"
    assert named in lines, crash.log[-3000:]  # rank 0's own line
    assert f"[rank 1] {named}" in lines
    assert any(line.startswith(f"training aborted: {named}") for line in lines)  # rank 0 ran its abort path: exit 1
    assert any(line.startswith(f"[rank 1] training aborted: {named}") for line in lines)
    assert crash.log.count("exitcode  : 1 ") == 2, crash.log[-3000:]  # torchrun's summary: both ranks exited 1
    err = json.loads((crash.run_dir / "rank-1" / "errors" / "drafter-1.json").read_text())
    assert err["thread"] == "drafter-1" and err["type"] == "RuntimeError"
    assert not (crash.run_dir / "checkpoints").exists()


@pytest.mark.parametrize("buckets", [[], SMALL_BUCKETS], ids=["one-bucket", "1KiB-buckets"])
def test_a_hung_rank_fails_the_collective_after_dist_timeout_s(launch, buckets):
    # rank 1's coordinator stops feeding its drafters: rank 0 waits in the all-reduce until runtime.dist_timeout_s
    # (20 s here, torch's default 30 minutes: ending within the wait below takes the configured timeout — once,
    # not once per bucket in flight: 1 KiB buckets are ~86 of them)
    hung = launch("hung", *TWO, "--set", "train.steps=50", "--set", "runtime.dist_timeout_s=20", *buckets,
                  env={"DFLASH_FAULT": "1/coordinator@3:hang"})
    assert hung.wait(240) != 0
    lines = hung.log.splitlines()
    aborted = [line for line in lines if line.startswith("training aborted: rank 0 drafter-")]
    # with several buckets in flight the one that times out closes the pairs, and the bucket waited on first may
    # report that instead (gloo's unbound_buffer.cc: "the exception ... indicates it was another operation")
    timed_out = ("Timed out waiting 20000ms",) + (("Application timeout caused pair closure",) if buckets else ())
    assert aborted and any(t in aborted[0] for t in timed_out), hung.log[-3000:]
    assert any(line.startswith("[rank 1] training aborted: rank 0 drafter-") for line in lines)
    assert not (hung.run_dir / "checkpoints").exists()


@pytest.mark.parametrize(("env", "args", "why"), [
    ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, [], "RANK is not set"),
    ({"WORLD_SIZE": "two"}, [], "WORLD_SIZE='two' is not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     ["--set", "runtime.on_worker_failure=continue"], "is for one process only"),
])
def test_bad_launcher_environment_is_one_line_exit_2(launch, env, args, why):
    run = launch("bad", *TWO, *args, nproc=0, env=env)
    assert run.wait(120) == 2
    lines = [line for line in run.log.splitlines() if line.strip()]
    assert len(lines) == 1 and why in lines[0] and lines[0].startswith("trainer: "), run.log


def test_launcher_layout_and_device_placement():
    from trainer.distributed import Dist, place_devices, read_env
    from trainer.supervise import Fault

    assert read_env({}) == Dist() and not read_env({"WORLD_SIZE": "1"}).active
    d = read_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size) == (3, 4, 1, 2)
    # two processes a node share its GPUs: target and drafters move together, past the highest index of either
    assert place_devices(["cuda:0"], ["cuda:1", "cuda:2"], d) == (["cuda:3"], ["cuda:4", "cuda:5"])
    assert place_devices(["cpu"], ["cpu", "cpu"], d) == (["cpu"], ["cpu", "cpu"])
    assert place_devices(["cuda:0"], ["cuda:1"], Dist()) == (["cuda:0"], ["cuda:1"])
    both = {("drafter-1", 2): "error", ("coordinator", 5): "error"}
    assert Fault("1/drafter-1@2,coordinator@5", rank=1).points == both
    assert Fault("1/drafter-1@2:oom", rank=0).points == {}


def test_stats_read_a_step_late_change_no_result_and_stop_both_ranks_at_one_step(launch, tmp_path):
    """The CUDA path of the threads layout (trainer/train_step.py: a step's stats read one step later, the ranks'
    stop agreed a step late), run on the CPU by DFLASH_DEFER_STATS=1: the same losses and weights as reading them
    at once; a SIGTERM stops both ranks at one step, and resuming from there is exact."""
    steps = ["--set", "train.steps=8", "--set", "train.checkpoint_interval=0"]
    late = {"DFLASH_DEFER_STATS": "1"}
    now = launch("now", *TWO, *steps, env={"DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-now")})
    assert now.wait(300) == 0, now.log[-3000:]
    whole = launch("whole", *TWO, *steps, env={**late, "DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-whole")})
    assert whole.wait(300) == 0, whole.log[-3000:]
    assert whole.steps() == now.steps() and sorted(whole.steps()) == list(range(1, 9))
    note = "step stats: read one step late"
    assert whole.log.count(note) == 2 and note not in now.log  # both ranks took the late path; `now` did not
    reference = replicas(tmp_path / "dump-whole", 2)
    assert all(identical(a, b) for a, b in zip(reference, replicas(tmp_path / "dump-now", 2), strict=True))

    # rank 0's coordinator holds step index 4 back until the SIGTERM; the stop is agreed a step late, alike
    part = launch("part", *TWO, *steps, env={**late, "DFLASH_FAULT": "0/coordinator@4:hang"})
    part.wait_for(lambda: "DFLASH_FAULT: coordinator hangs at step 4" in part.log and 3 in part.steps(),
                  timeout=300, what="the hang at step index 4")
    part.proc.send_signal(signal.SIGTERM)
    part.wait(300)
    stopped = [line for line in part.log.splitlines() if "training stopped by SIGTERM step=" in line]
    assert len(stopped) == 2, part.log[-3000:]
    at = int(stopped[0].split("step=")[1].split()[0])
    assert all(f"training stopped by SIGTERM step={at} " in line for line in stopped) and 4 < at < 8
    rest = launch("rest", *TWO, *steps, "--resume", run_dir=part.run_dir,
                  env={**late, "DFLASH_DUMP_REPLICAS": str(tmp_path / "dump-rest")})
    assert rest.wait(300) == 0, rest.log[-3000:]
    assert sorted(rest.steps()) == list(range(at + 1, 9))
    assert all(rest.steps()[s] == whole.steps()[s] for s in rest.steps())
    assert all(identical(a, b) for a, b in zip(replicas(tmp_path / "dump-rest", 2), reference, strict=True))
