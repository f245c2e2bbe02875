"""The run's sentinel delivering notifications end to end, on the `local` host: a user's own program launched with
`launch --exec --notify …`, its sentinel (agent.pyz, started by the supervisor) watching it, real HTTP receivers
on 127.0.0.1 (tests/sentinel/receiver.py).

What is proved: targets that fail (500, a hang, a refused connect) cost the run nothing and are each recorded once as
`notify-failed` in events.jsonl while a healthy target gets its message; and a crash storm (16 threads dying at once)
is one message, not sixteen, with no second crash message at the run's end — also when the threads' tracebacks
interleave in the log as Python's own excepthook writes them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lifecycle.conftest import _no_run_outlives_its_test  # noqa: F401 - autouse: no run outlives its test

from .conftest import (
    alive,
    cue,
    exit_code,
    launch_prog,
    of_kind,
    sentinel_pid,
    wait_exit_code,
    wait_until,
    write_prog,
)
from .receiver import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "T0KEN-s3cret"  # in every URL's path: a webhook's path may hold a token, labels must not show it


def label(rx: Receiver) -> str:
    """How events.jsonl names a webhook target: scheme://host:port/… (the path, a possible secret, left out)."""
    return f"webhook http://127.0.0.1:{rx.port}/…"


def steps_in(log: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^step (\d+) loss [\d.]+$", log, re.MULTILINE)]


def watching(run_dir: Path) -> None:
    """The sentinel is up and has seen the program step: what happens next is live detection."""
    sentinel_pid(run_dir)
    wait_until(lambda: of_kind(run_dir, "first-step"), timeout=60, what="the first-step event")


def test_failing_webhooks_are_recorded_once_each_and_neither_harm_the_run_nor_the_healthy_target(
        local_host, cli, tmp_path):
    src = write_prog(tmp_path / "myproject")
    error, hang, closed, good = (Receiver(m).start() for m in ("error", "hang", "closed", "ok"))
    try:
        doc = launch_prog(cli, src, "--name", "delivery", "--notify-on", "worker-crashed",
                          "--notify", error.url(f"/{SECRET}/err"), "--notify", f"webhook:{hang.url(f'/{SECRET}/h')}",
                          "--notify", closed.url(f"/{SECRET}/gone"), "--notify", good.url(f"/{SECRET}/ok"))
        closed.close()  # listening for the launch's reachability check; refused from now on
        rd, pid = Path(doc["run_dir"]), doc["pid"]
        watching(rd)
        cue(rd, "crash")

        msgs = good.wait_for(lambda ms: [m for m in ms if m["kind"] == "worker-crashed"], timeout=90,
                             what="the worker-crashed message")
        assert len(msgs) == 1
        msg = msgs[0]
        assert msg["run"] == doc["run_id"] and msg["worker"] == "worker-0" and msg["exception"] == "RuntimeError"
        assert msg["count"] >= 1 and msg["events"][0]["kind"] == "worker-crashed"
        assert "corrupt batch" in msg["message"]
        failing = (error, hang, closed)
        wait_until(lambda: {e["target"] for e in of_kind(rd, "notify-failed")} >= {label(r) for r in failing},
                   timeout=90, what="a notify-failed record for each failing target")
        assert error.requests and hang.requests  # each failing target was really tried
        assert alive(pid) and exit_code(rd) is None  # the program never waited on a delivery
        cue(rd, "finish")
        assert wait_exit_code(rd) == 0
    finally:
        for rx in (error, hang, closed, good):
            rx.close()

    failed = of_kind(rd, "notify-failed")
    assert sorted(e["target"] for e in failed) == sorted(label(r) for r in failing)  # once each, never the healthy one
    by_target = {e["target"]: e for e in failed}
    assert "HTTP 500" in by_target[label(error)]["error"]
    assert "refused" in by_target[label(closed)]["error"].lower()
    for e in failed:
        assert e["kinds"] == ["worker-crashed"] and e["attempts"] >= 1 and e["error"]
    assert len(error.requests) == 3  # 3 attempts in all
    assert len(good.requests) == 1 and all(r.path == f"/{SECRET}/ok" for r in good.requests)
    assert SECRET not in (rd / "events.jsonl").read_text()  # labels only: the path's token is never written down

    log = (rd / "train.log").read_text()
    last = int(re.search(r"^done after (\d+) steps$", log, re.MULTILINE).group(1))
    assert steps_in(log) == list(range(1, last + 1))  # every step, none lost while deliveries failed
    assert "Exception in thread worker-0" in log and "RuntimeError: worker-0 got a corrupt batch" in log
    assert [e["exit_code"] for e in of_kind(rd, "ended")] == [0]


def storm(cli, tmp_path: Path, rx: Receiver, *args: str) -> tuple[dict, Path, list[dict]]:  # noqa: ANN001
    """16 threads of the program die at once; the test waits for the worker-crashed message, checks the program
    lives on, stops the run, waits for the message carrying the `ended` event (the last one: the sentinel has exited
    after it).
    Returns the launch document, the run directory and every message received."""
    doc = launch_prog(cli, write_prog(tmp_path / "myproject"), "--name", "storm", "--notify", rx.url(f"/{SECRET}"),
                      doomed=16, args=args)
    rd, pid = Path(doc["run_dir"]), doc["pid"]
    watching(rd)
    cue(rd, "crash")
    rx.wait_for(lambda ms: [m for m in ms if m["kind"] == "worker-crashed"], timeout=90, what="the crash message")
    assert alive(pid) and exit_code(rd) is None  # the program keeps going without its workers
    assert cli("stop", doc["run_id"]).code == 103
    assert wait_exit_code(rd) == 143
    rx.wait_for(lambda ms: [m for m in ms if any(e["kind"] == "ended" for e in m["events"])], timeout=60,
                what="the message with the ended event")
    return doc, rd, rx.messages()


def one_crash_message(msgs: list[dict]) -> dict:
    """The storm's one worker-crashed message; the end's message (last) carries none of its events again."""
    kinds = [m["kind"] for m in msgs]
    assert kinds.count("worker-crashed") == 1 and kinds[-1] == "ended", kinds
    crash = msgs[kinds.index("worker-crashed")]
    later = [e["kind"] for m in msgs[kinds.index("worker-crashed") + 1:] for e in m["events"]]
    assert "worker-crashed" not in later, later
    assert msgs[-1]["verdict"] == "stopped"
    return crash


def test_a_crash_storm_of_16_threads_is_one_message_counting_16_and_the_end_brings_no_second_one(
        local_host, cli, tmp_path):
    with Receiver("ok") as rx:
        _doc, rd, msgs = storm(cli, tmp_path, rx, "--whole-tracebacks")
    crash = one_crash_message(msgs)
    assert crash["count"] >= 16, crash["title"]
    listed = [e for e in crash["events"] if e["kind"] == "worker-crashed"]
    assert len(listed) + crash["suppressed"] >= 16
    assert crash["exception"] == "RuntimeError" and "+15 more workers" in crash["title"]
    workers = sorted(e["worker"] for e in of_kind(rd, "worker-crashed"))
    assert workers == sorted(f"worker-{i}" for i in range(16))  # each thread recorded once in events.jsonl
    assert all(e["exception"] == "RuntimeError" for e in of_kind(rd, "worker-crashed"))
    assert of_kind(rd, "notify-failed") == []


def test_a_storm_of_interleaved_tracebacks_is_still_one_message_with_every_crash_the_sentinel_saw(
        local_host, cli, tmp_path):
    """Python's own excepthook: 16 tracebacks written at once interleave down to half-lines, and the log scanner
    recovers most names, not always all of them. Whichever crashes the sentinel recorded, they all went out in
    the one message, each worker once."""
    with Receiver("ok") as rx:
        _doc, rd, msgs = storm(cli, tmp_path, rx)
    crash = one_crash_message(msgs)
    recorded = [e["worker"] for e in of_kind(rd, "worker-crashed")]
    assert recorded and len(set(recorded)) == len(recorded)
    assert crash["count"] == len(recorded)  # every crash the sentinel saw went out in that one message
    assert sorted(e["worker"] for e in crash["events"] if e["kind"] == "worker-crashed") == sorted(recorded)


def test_a_delivery_that_fails_during_the_ends_flush_is_recorded_before_the_exit_code(local_host, cli, tmp_path):
    """The `ended` message goes out while the sentinel flushes, just before it exits: a target failing then is
    still in events.jsonl once the supervisor has written exit_code (it waits for the sentinel)."""
    src = write_prog(tmp_path / "myproject")
    with Receiver("error") as error:
        doc = launch_prog(cli, src, "--name", "flush", "--notify-on", "ended", "--notify", error.url(f"/{SECRET}"))
        rd = Path(doc["run_dir"])
        watching(rd)
        cue(rd, "finish")
        assert wait_exit_code(rd) == 0
        failed = of_kind(rd, "notify-failed")  # read at once: exit_code present means the sentinel is done
    assert [e["target"] for e in failed] == [label(error)], failed
    assert failed[0]["kinds"] == ["ended"] and failed[0]["error"]
    assert error.requests and all(r.json()["kind"] == "ended" for r in error.requests)
