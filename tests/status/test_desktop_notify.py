"""`status --watch --notify-desktop`: one desktop notification each time the verdict becomes a failure or an end
(not for a run that had already ended when the watch began), through libnotify's notify-send."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dflashctl.cli.status import _Desktop
from dflashctl.cli.timeline import desktop_notify
from dflashctl.commands.status import Watcher
from dflashctl.report import parse_report
from status.test_watcher import report, steps

BIN = Path(__file__).resolve().parents[1] / "harness" / "bin"
pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="macOS notifies through osascript")


@pytest.fixture
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "notify.jsonl"
    monkeypatch.setenv("PATH", f"{BIN}:/usr/bin:/bin")
    monkeypatch.setenv("DFLASH_FAKE_NOTIFY_LOG", str(log))
    return log


def sent(log: Path) -> list[dict]:
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def test_a_watch_notifies_once_on_the_crash_and_once_on_the_end(notes: Path) -> None:
    w, desk = Watcher("pve", live=True), _Desktop()
    data = steps(1, 4)
    tb = b"Exception in thread drafter-1:\nTraceback (most recent call last):\n  File \"t.py\", line 3, in run\n" \
         b"RuntimeError: boom\n"
    for doc in (report(100.0, data), report(101.0, steps(4, 5), offset=len(data)),
                report(102.0, tb, offset=len(data) + len(steps(4, 5))),
                report(103.0, b"", offset=len(data) + len(steps(4, 5)) + len(tb)),
                report(104.0, b"", offset=len(data) + len(steps(4, 5)) + len(tb), alive=False, exit_code=1)):
        desk.see(w.update(parse_report(doc)))
    got = sent(notes)
    assert [n["summary"] for n in got] == ["dflashctl: pve run r1 degraded", "dflashctl: pve run r1 crashed"]
    assert "drafter-1" in got[0]["body"] and "--urgency=critical" in got[0]["options"]


def test_a_run_already_ended_when_the_watch_began_raises_nothing(notes: Path) -> None:
    _Desktop().see(Watcher("pve", live=True).update(parse_report(report(100.0, steps(1, 3), alive=False,
                                                                         exit_code=0))))
    assert sent(notes) == []


def test_without_a_notifier_the_reason_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert desktop_notify("t", "b") == "no desktop notifier here (install libnotify's notify-send)"
