"""In-process pipeline checks: the all-reduce keeps replicas bit-identical; torch config is per thread."""

from __future__ import annotations

import threading

import torch
from trainer_harness import REPO, TINY

from trainer.allreduce import AllReduce
from trainer.config import load_config
from trainer.pipeline import Trainer
from trainer.streams import mark, receive, thread_streams
from trainer.supervise import Fault


def small_config(**extra: str):
    sets = {"runtime.compile_strategy": "off", "train.steps": "6", "train.batch_size": "2", "train.seq_len": "64",
            "train.log_interval": "3", "train.checkpoint_interval": "0", **extra}
    return load_config(REPO / TINY, [f"{k}={v}" for k, v in sets.items()])


def test_gradient_averaging_keeps_replicas_bit_identical(tmp_path):
    trainer = Trainer(small_config(), tmp_path, fault=Fault(None))
    before = [p.detach().clone() for p in trainer.replicas[0].parameters()]
    assert trainer.run() == 0
    states = [r.state_dict() for r in trainer.replicas]
    for other in states[1:]:
        assert all(torch.equal(states[0][k], other[k]) for k in states[0])
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.replicas[0].parameters(), strict=True))
    # the drafters saw different data: without the all-reduce their gradients would differ
    b = trainer.data.batch(0, 6)
    assert not torch.equal(b.ids[:2], b.ids[2:4])


def test_allreduce_mean_is_identical_for_every_rank_and_survives_a_leaver():
    ar, abort = AllReduce([0, 1, 2]), threading.Event()
    vals = {0: torch.tensor([1.0, 2.0]), 1: torch.tensor([3.0, 4.0]), 2: torch.tensor([0.1, 0.7])}
    out: dict[int, torch.Tensor] = {}
    stops: dict[int, bool] = {}

    def worker(r: int, stop: bool = False) -> None:
        result, _, stops[r] = ar.mean(r, vals[r], abort, stop)
        out[r] = result.clone()

    # rank 1 alone has seen the stop (SIGTERM): all three agree to stop, on the host
    ts = [threading.Thread(target=worker, args=(r, r == 1)) for r in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert stops == {0: True, 1: True, 2: True}
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    torch.testing.assert_close(out[0], (vals[0] + vals[1] + vals[2]) / 3)
    # rank 2 leaves: ranks 0 and 1 finish a step without it
    ar.leave(2)
    t = threading.Thread(target=worker, args=(1,))
    t.start()
    result, group, stop = ar.mean(0, vals[0], abort)
    t.join(10)
    assert group == (0, 1) and not stop
    torch.testing.assert_close(result, (vals[0] + vals[1]) / 2)


def test_a_broken_group_finishes_no_step_for_a_rank_waiting_or_arriving_later():
    """A crash under the abort policy: the rank already waiting and one arriving afterwards both raise Aborted, and
    the crashed rank's leave() does not complete the step for them (no checkpoint past the crash's step)."""
    from trainer.allreduce import Aborted

    ar, abort = AllReduce([0, 1, 2]), threading.Event()
    raised: list[int] = []

    def waiting() -> None:
        try:
            ar.mean(0, torch.ones(2), abort)
        except Aborted:
            raised.append(0)

    t = threading.Thread(target=waiting)
    t.start()
    while 0 not in ar.slots:  # rank 0 has put its slot and waits for 1 and 2
        threading.Event().wait(0.01)
    ar.break_group()
    ar.leave(1)
    t.join(10)
    try:
        ar.mean(2, torch.ones(2), abort)
    except Aborted:
        raised.append(2)
    assert raised == [0, 2] and ar.generation == 0 and not abort.is_set()


def test_dynamo_config_set_in_main_is_not_seen_by_a_new_thread():
    """Why apply_thread_settings runs inside every thread: torch 2.13 config is per thread (ContextVar)."""
    old = torch._dynamo.config.recompile_limit
    seen: list[int] = []
    try:
        torch._dynamo.config.recompile_limit = old + 17
        t = threading.Thread(target=lambda: seen.append(torch._dynamo.config.recompile_limit))
        t.start()
        t.join()
    finally:
        torch._dynamo.config.recompile_limit = old
    assert seen == [old]


def test_threads_crashing_at_once_leave_whole_standard_tracebacks_in_the_log(tmp_path):
    """Each crash report is Python's standard text, in one piece: no header or frame of another thread
    lands inside it, however many threads die at the same moment."""
    import subprocess
    import sys
    import textwrap

    prog = textwrap.dedent("""
        import threading
        from pathlib import Path
        from trainer.supervise import Supervisor
        sup = Supervisor(Path(%r), on_worker_failure="continue")
        sup.install()
        gate = threading.Barrier(12)
        def work(i):
            gate.wait()
            def inner(depth):
                if depth == 0:
                    raise RuntimeError(f"boom from worker {i}")
                inner(depth - 1)
            inner(12)
        threads = [threading.Thread(target=work, args=(i,), name=f"drafter-{i}") for i in range(12)]
        for t in threads: t.start()
        for t in threads: t.join()
    """) % str(tmp_path)
    log = tmp_path / "train.log"
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-c", prog], stdout=out, stderr=subprocess.STDOUT, check=True, timeout=60)
    text = log.read_text()
    blocks = text.split("Exception in thread ")[1:]
    assert sorted(b.split(":", 1)[0] for b in blocks) == sorted(f"drafter-{i}" for i in range(12))
    shapes = set()
    for block in blocks:
        i = block.split(":", 1)[0].split("-")[1]
        lines = block.rstrip("\n").splitlines()
        assert lines[1] == "Traceback (most recent call last):"
        assert lines[-1] == f"RuntimeError: boom from worker {i}"
        shapes.add(block.replace(f"drafter-{i}", "drafter-N").replace(f"worker {i}", "worker N"))
    assert len(shapes) == 1  # identical reports: nothing of one thread inside another's


def test_stream_handoff_is_a_no_op_off_cuda():
    t = torch.arange(4.0)
    with thread_streams(["cpu", "cpu"]) as streams:
        assert streams == []
        assert mark(t) is None
        assert receive(t, None, "cpu") is t


def test_cuda_streams_setting_leaves_the_cpu_training_bit_identical(tmp_path):
    finals = []
    for flag in ("true", "false"):
        trainer = Trainer(small_config(**{"runtime.cuda_streams": flag}), tmp_path / flag, fault=Fault(None))
        assert trainer.cfg.runtime.cuda_streams is (flag == "true")
        assert trainer.run() == 0
        finals.append(trainer.replicas[0].state_dict())
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_continue_goes_on_when_a_drafter_crashes_after_its_peers_finished(tmp_path):
    """A drafter leaves the all-reduce before its crash is recorded, so at the last step its peers may finish
    first: under `continue` they are survivors (the run ends 0, naming the crash), not 'every drafter dead'."""
    from trainer.supervise import FINISHED, Supervisor

    sup = Supervisor(tmp_path, on_worker_failure="continue")
    for name in ("coordinator", "drafter-0", "drafter-1"):
        sup.register(name)
    sup.set_state("drafter-0", FINISHED)
    for name in ("drafter-1", "drafter-0"):
        try:
            raise RuntimeError(f"boom in {name}")
        except RuntimeError as e:
            sup.record_crash(name, type(e), e, e.__traceback__)
        assert sup.abort.is_set() is (name == "drafter-0")  # the second crash leaves no drafter: abort


def test_each_step_is_settled_once_where_stats_are_read_at_once(tmp_path):
    """The CPU path reports a step's stats right after its optimizer step: one `_settle` per step (plus the drain
    after a thread's last item, which the deferred path needs), not a second one that finds nothing pending."""
    from collections import Counter

    steps = 4
    trainer = Trainer(small_config(**{"train.steps": str(steps)}), tmp_path, fault=Fault(None))
    assert not trainer.defer_stats
    calls: Counter[int] = Counter()
    settle = trainer._settle

    def counting(rank: int) -> bool:
        calls[rank] += 1
        return settle(rank)

    trainer._settle = counting
    assert trainer.run() == 0
    assert dict(calls) == {r: steps + 1 for r in range(trainer.n)}
