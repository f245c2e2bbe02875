"""The probe's wait between --watch reports (agent/probe/logwait.py, urgent.py): real files, a real probe process.

Every wait here has a deadline of 600 s against a test timeout of 60 s, so a wait that ends at all ended through
the new path; counts are over a fixed number of log writes, each proved read by the probe (/proc/PID/io rchar),
never over a time window."""

from __future__ import annotations

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness.poll import wait_until

from dflashctl.agent.lib.frame import SENTINEL
from dflashctl.agent.probe.logwait import MIN_GAP_S, LogWaiter
from dflashctl.agent.probe.main import report
from dflashctl.agent.probe.request import ProbeRequest
from dflashctl.agent.probe.urgent import UrgentLines
from dflashctl.analysis import signatures
from status.runprog import new_run_dir

REPO = Path(__file__).resolve().parents[2]
PROGRESS = b"step=%d loss=%.4f tok/s=1834.2 lr=3.00e-04 acc=0.123 acc_len=2.50\n"
TRACEBACK = (b"Exception in thread drafter-0:\nTraceback (most recent call last):\n"
             b'  File "/opt/dflash/trainer/drafter.py", line 88, in run\n    compile_block()\n'
             b"RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function.\n")


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


@pytest.mark.parametrize("rule", [r for r in signatures.RULES if r.examples and not r.sticky],
                         ids=lambda r: r.signature.id)
def test_every_crash_signature_example_wakes_the_probe(rule: signatures.Rule) -> None:
    for example in rule.examples:
        assert UrgentLines().feed(example.encode() + b"\n"), example


def test_progress_lines_and_chatter_do_not_wake_it_and_a_torn_traceback_does_once_whole() -> None:
    u = UrgentLines()
    assert not u.feed(b"".join(PROGRESS % (i, 4.0 / i) for i in range(1, 2000)))
    assert not u.feed(b"[rank0]: step=3 loss=2.0\nINFO loading checkpoint information from /ckpt/step-100\n")
    assert not u.feed(b"{'loss': 1.2031, 'grad_norm': 0.91, 'learning_rate': 1.9e-05, 'epoch': 0.12}\n")
    cut = TRACEBACK.index(b"RuntimeError") + 5
    assert not u.feed(TRACEBACK[:cut])  # the final line is not complete yet
    assert not u.feed(PROGRESS % (5, 1.0))  # another thread's line inside the traceback does not end it
    assert u.feed(TRACEBACK[cut:])


def _waiter(tmp_path: Path, inotify: bool) -> tuple[LogWaiter, Path]:
    run = new_run_dir(tmp_path, "20261201-190100-waiter")
    (run / "train.log").write_bytes(PROGRESS % (1, 4.0))
    args = ProbeRequest(workspace=str(tmp_path), run="latest")
    w = LogWaiter(use_inotify=inotify)
    w.follow(report(args, None, None))
    return w, run


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "stat"])
def test_a_traceback_ends_a_600s_wait_and_progress_does_not(tmp_path: Path, inotify: bool) -> None:
    w, run = _waiter(tmp_path, inotify)
    try:
        assert (w.watch is not None) == inotify
        for i in range(2, 30):  # each write looked at (wait(0) is one look) and none of them is worth a report
            _append(run / "train.log", PROGRESS % (i, 4.0 / i))
            assert not w.wait(0) and not w.pending() and w.pos == (run / "train.log").stat().st_size
        done: queue.Queue[bool] = queue.Queue()
        threading.Thread(target=lambda: done.put(w.wait(time.time() + 600)), daemon=True).start()
        wait_until(lambda: w.looks > 28, what="the waiter in its wait (28 looks were the wait(0) calls)")
        _append(run / "train.log", TRACEBACK)
        assert done.get(timeout=60) is True
    finally:
        w.close()


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "stat"])
def test_exit_code_appearing_and_the_trainer_going_away_end_the_wait(tmp_path: Path, inotify: bool) -> None:
    w, run = _waiter(tmp_path, inotify)
    try:
        done: queue.Queue[bool] = queue.Queue()
        threading.Thread(target=lambda: done.put(w.wait(time.time() + 600)), daemon=True).start()
        wait_until(lambda: w.looks > 0, what="the waiter in its wait")
        (run / "exit_code").write_text("1\n")
        assert done.get(timeout=60) is True
    finally:
        w.close()
    # the trainer (carrying the run's marker, as launch starts it) exits: it stays a zombie until reaped below
    trainer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               env={**os.environ, "DFLASH_RUN_ID": run.name})
    w = LogWaiter(use_inotify=inotify)
    try:
        (run / "exit_code").unlink()
        (run / "pid").write_text(f"{trainer.pid}\n")
        w.follow(report(ProbeRequest(workspace=str(tmp_path), run="latest"), None, None))
        assert w.pid == trainer.pid
        threading.Thread(target=lambda: done.put(w.wait(time.time() + 600)), daemon=True).start()
        wait_until(lambda: w.looks > 0, what="the waiter in its wait")
        assert trainer.stdin is not None
        trainer.stdin.close()
        assert done.get(timeout=60) is True
    finally:
        trainer.kill()
        trainer.wait()
        w.close()


class Probe:
    """The probe program itself, --watch, as a real process on this machine; its reports arrive on a queue."""

    def __init__(self, workspace: Path, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "dflashctl.agent.probe.main", "--workspace", str(workspace),
                                      "--run", "latest", "--watch", "--interval", "600", *extra],
                                     stdout=subprocess.PIPE, cwd=REPO)
        self.docs: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            idx = line.find(SENTINEL.encode())
            if idx >= 0:
                self.docs.put(json.loads(line[idx + len(SENTINEL) + 1:])["doc"])

    def bytes_read(self) -> int:
        """Bytes the probe has read(): between reports only its log wait reads anything."""
        with open(f"/proc/{self.proc.pid}/io") as f:
            return int(next(ln for ln in f if ln.startswith("rchar:")).split()[1])

    def write_seen(self, log: Path, data: bytes) -> None:
        """Append data and wait until the probe has read it."""
        before = self.bytes_read()
        _append(log, data)
        wait_until(lambda: self.bytes_read() >= before + len(data), 60, what="the probe reading the new bytes")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_the_probe_sends_no_report_for_progress_and_at_most_one_per_gap_in_a_crash_storm(tmp_path: Path) -> None:
    run = new_run_dir(tmp_path, "20261201-190200-storm")
    log = run / "train.log"
    log.write_bytes(PROGRESS % (1, 4.0))
    probe = Probe(tmp_path)
    try:
        first = probe.docs.get(timeout=60)
        for i in range(2, 42):  # 40 progress writes, each read by the probe's wait
            probe.write_seen(log, PROGRESS % (i, 4.0 / i))
        for _ in range(20):  # a storm: 20 tracebacks, each read as it lands
            probe.write_seen(log, TRACEBACK)
        docs = [first]
        docs.append(probe.docs.get(timeout=60))
        assert b"step=41 " in base64.b64decode(docs[1]["log"]["data_b64"]), \
            "the first early report carries the progress lines: none of them had a report of its own"
        assert docs[1]["log"]["offset"] == first["log"]["next_offset"]
        _append(log, b"training finished after 41 steps\n")  # the run's end wakes it too
        while docs[-1]["log"]["next_offset"] < log.stat().st_size:
            docs.append(probe.docs.get(timeout=60))
        gaps = [b["time"] - a["time"] for a, b in zip(docs, docs[1:], strict=False)]
        assert min(gaps[1:], default=MIN_GAP_S) >= MIN_GAP_S, gaps  # the storm: never closer than the gap
        assert len(docs) <= 22, len(docs)  # at most one report per traceback (the gap merges most), plus the end
    finally:
        probe.stop()
