"""A program that dies at once gets one report (issue 10), whichever side of the moment the CLI starts watching
it dies on: the one-line error, the first lines of its log, its exit code, the hint — the same text, the same exit
code, the same --json document, for `launch --wait-for`, `eval` and the default `launch`.

The order of events is made explicit, never left to the machine's speed: `before` lets the CLI look at the run
only once the run has recorded its exit code; `after` holds the program (blocked on a trigger file) until the CLI
has received its first log bytes while it was alive, and only then lets it die.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dflashctl.commands import launch as launch_cmd
from dflashctl.commands import waiting

from .conftest import FAKE_TRAINER, run_dir, wait_until, write_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def order(monkeypatch: pytest.MonkeyPatch, local_host):
    """order(side, trigger): wrap waiting.wait so the program dies before or after the CLI starts watching."""
    real_wait = waiting.wait

    def arrange(side: str, trigger: Path) -> None:
        def wait(target, run_id, what, timeout_s, on_log=None):
            if side == "before":  # the run has ended and recorded why before the CLI's first look
                wait_until(lambda: (run_dir(local_host.workspace_dir, run_id) / "exit_code").exists(), 60)
                return real_wait(target, run_id, what, timeout_s, on_log)

            def first_bytes(data: bytes) -> None:  # the CLI saw it alive: now it may die
                trigger.touch()
                if on_log is not None:
                    on_log(data)

            return real_wait(target, run_id, what, timeout_s, first_bytes)

        monkeypatch.setattr(waiting, "wait", wait)

    return arrange


def _same(res, run_ids: list[str]) -> tuple[int, str, str]:
    """The result with run ids and pids made neutral (they differ between two runs by construction)."""
    def neutral(text: str) -> str:
        for rid in run_ids:
            text = text.replace(rid, "RUN")
        return re.sub(r"(\bpid\"?:?\s+)\d+", r"\1N", text)

    return res.code, neutral(res.out), neutral(res.err)


def _ids(local_host) -> list[str]:
    return sorted((p.name for p in (local_host.workspace_dir / "runs").iterdir() if not p.is_symlink()),
                  key=len, reverse=True)


@pytest.mark.parametrize("wait_for", ["step", "exit"])
def test_launch_wait_for_reports_a_program_that_dies_at_once_identically_on_both_sides(local_host, cli, order,
                                                                                      tmp_path, wait_for):
    assert cli("deploy", "--source", str(FAKE_TRAINER)).code == 0  # no "deployed" note in only one of the two
    got = {}
    for side in ("before", "after"):
        trigger = tmp_path / f"die-{side}"
        cfg = write_config(tmp_path / "bad.toml", mode="exit-at-once",
                           **({"wait_file": str(trigger)} if side == "after" else {}))
        order(side, trigger)
        text = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "dies",
                   "--wait-for", wait_for)
        doc = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "dies",
                  "--wait-for", wait_for, "--json")
        got[side] = (text, doc)
    ids = _ids(local_host)
    for side, (text, doc) in got.items():
        assert text.code == 100, (side, text.err)
        assert "exited with code 3" in text.err and "first lines of the log:" in text.err, (side, text.err)
        assert "fatal: cannot open dataset /data/missing.jsonl" in text.err and "Traceback" not in text.err
        assert "whole log: dflashctl logs" in text.err
        report = doc.json()
        assert doc.code == 100 and report["launched"] is False and report["exit_code"] == 3
        assert "cannot open dataset" in report["log_head"]
    assert _same(got["before"][0], ids) == _same(got["after"][0], ids)
    assert _same(got["before"][1], ids) == _same(got["after"][1], ids)


def test_eval_reports_a_program_that_dies_at_once_identically_on_both_sides(local_host, cli, order, tmp_path):
    cfg = write_config(tmp_path / "short.toml", mode="train", steps=2, step_s=0.01)
    trained = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "tiny",
                  "--wait-for", "exit")
    assert trained.code == 0, trained.err
    got = {}
    for side in ("before", "after"):
        trigger = tmp_path / f"die-{side}"
        order(side, trigger)
        wait_file = ["--wait-file", str(trigger)] if side == "after" else []
        text = cli("eval", "--source", str(FAKE_TRAINER), "--prompts", str(tmp_path / "nope.jsonl"), "--",
                   *wait_file)
        doc = cli("eval", "--source", str(FAKE_TRAINER), "--prompts", str(tmp_path / "nope.jsonl"), "--json", "--",
                  *wait_file)
        got[side] = (text, doc)
    ids = _ids(local_host)
    for side, (text, doc) in got.items():
        assert text.code == 100 and "Traceback" not in text.err, (side, text.err)
        assert "exited with code 2" in text.err and "first lines of the log:" in text.err, (side, text.err)
        assert "eval: error:" in text.err and "nope.jsonl" in text.err
        assert doc.code == 100 and doc.json()["exit_code"] == 2 and "nope.jsonl" in doc.json()["log_head"]
    before, after = (_same(got[s][0], ids) for s in ("before", "after"))
    assert before == after
    assert _same(got["before"][1], ids) == _same(got["after"][1], ids)


def test_default_launch_reports_a_death_inside_its_alive_window_with_the_same_report(local_host, cli, monkeypatch,
                                                                                   tmp_path):
    """`launch` without --wait-for confirms the program stays up ALIVE_FOR_S. The window is made long here, so the
    program's death (at once) is inside it by construction, and the report is failure()'s, as above."""
    monkeypatch.setattr(launch_cmd, "ALIVE_FOR_S", 600.0)
    monkeypatch.setattr(launch_cmd, "CONFIRM_S", 600.0)
    cfg = write_config(tmp_path / "bad.toml", mode="exit-at-once")
    res = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "dies")
    assert res.code == 100 and "launched run" not in res.out
    assert "exited with code 3" in res.err and "first lines of the log:" in res.err
    assert "fatal: cannot open dataset /data/missing.jsonl" in res.err
    doc = cli("launch", "--source", str(FAKE_TRAINER), "--config", str(cfg), "--name", "dies", "--json").json()
    assert doc["launched"] is False and doc["exit_code"] == 3 and "cannot open dataset" in doc["log_head"]
    assert json.loads(json.dumps(doc))["error"].endswith("exited with code 3")
