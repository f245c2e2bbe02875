"""Notifications from the sentinel: the payload (compose), each target's wire format against a real HTTP server on
127.0.0.1, and the Notifier's batching, rate limit, retries, failure reports and end-of-run flush.

Batching and the rate limit run on an injected clock (FakeClock), so no test depends on how fast the machine is;
I/O waits are polled with generous timeouts (harness.poll.wait_until), never a fixed sleep.
"""

from __future__ import annotations

import json
import shlex
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from harness.poll import wait_until

from dflashctl.analysis.events import Event
from dflashctl.analysis.watchspec import NOTIFIABLE, NotifyTarget
from dflashctl.sentinel.deliver import DeliveryError, deliver, text_of
from dflashctl.sentinel.notify import DEADLINE_ERROR, MAX_LISTED, Notifier, compose, select

OOM = {"id": "cuda-oom", "summary": "CUDA out of memory", "remedy": "lower --batch-size or enable checkpointing"}


# --- events ------------------------------------------------------------------------------------------------------

def crash(i: int = 0, t: float = 100.0, sig: dict[str, Any] | None = OOM, run: str = "run-1") -> Event:
    return Event(t=t, kind="worker-crashed", run=run, verdict="degraded",
                 message=f"drafter-{i} crashed: torch.OutOfMemoryError: CUDA out of memory",
                 data={"worker": f"drafter-{i}", "exception": "torch.OutOfMemoryError",
                       "exception_message": "CUDA out of memory", "signature": sig})


def ended(verdict: str = "finished", code: int | None = 0, t: float = 200.0) -> Event:
    return Event(t=t, kind="ended", run="run-1", verdict=verdict, message=f"the run ended: {verdict}",
                 data={"exit_code": code, "reasons": []})


def signature(t: float = 150.0, sig: dict[str, Any] = OOM) -> Event:
    return Event(t=t, kind="signature", run="run-1", verdict="degraded", message=f"diagnosis: {sig['summary']}",
                 data={"signature": sig, "line": 42, "text": "torch.OutOfMemoryError: CUDA out of memory"})


def simple(kind: str, t: float = 50.0, **data: Any) -> Event:
    return Event(t=t, kind=kind, run="run-1", verdict="training", message=kind, data=data)


# --- a real receiver -----------------------------------------------------------------------------------------------

@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """ThreadingHTTPServer on 127.0.0.1, recording every request. /fail answers 500; /gate answers once `gate` is
    set; /hold never answers until the test ends; /redirect307 sends the POST on to /ok; anything else 200."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.arrived: list[str] = []  # paths, on arrival (before any wait)
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.arrived.append(self.path)
                if self.path.startswith("/gate"):
                    outer.gate.wait(60)
                if self.path.startswith("/hold"):
                    outer.release.wait(120)
                with outer.lock:
                    outer.requests.append(Received(self.command, self.path,
                                                   {k.lower(): v for k, v in self.headers.items()}, body))
                if self.path.startswith("/redirect307"):
                    self.send_response(307)
                    self.send_header("Location", "/ok")
                else:
                    self.send_response(500 if self.path.startswith("/fail") else 200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def got(self, path: str | None = None) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if path is None or r.path == path]

    def close(self) -> None:
        self.gate.set()
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def hang_url() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}/hang"
    s.close()


@pytest.fixture
def refused_url() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/refused"


class FakeClock:
    """Batching time under the test's control; the Notifier re-reads it at least once a second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Failures:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, rec: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(rec)

    def by_target(self) -> dict[str, list[dict[str, Any]]]:
        with self.lock:
            out: dict[str, list[dict[str, Any]]] = {}
            for c in self.calls:
                out.setdefault(c["target"], []).append(c)
            return out


def notifier(targets: list[NotifyTarget], failures: Failures, **kw: Any) -> Notifier:
    kw = {"gather_s": 0.05, "min_gap_s": 0.0, "timeout_s": 5.0, "retries": 3, "backoff_s": (0.01, 0.01), **kw}
    return Notifier(targets, NOTIFIABLE, "pve1", on_failure=failures, **kw)


# --- compose -------------------------------------------------------------------------------------------------------

def test_compose_heads_with_the_crash_over_the_end_and_borrows_another_events_remedy() -> None:
    batch = [crash(0, t=1.0, sig=None), signature(t=2.0), ended("crashed", 1, t=3.0)]
    p = compose(batch, "pve1")
    assert p["kind"] == "worker-crashed"
    assert p["title"] == "pve1 run run-1: drafter-0 crashed (torch.OutOfMemoryError)"
    assert p["message"] == batch[0].message
    assert (p["worker"], p["exception"]) == ("drafter-0", "torch.OutOfMemoryError")
    assert p["signature"] == OOM and p["remedy"] == OOM["remedy"]
    assert p["verdict"] == "crashed" and p["time"] == 3.0  # the latest event's
    assert p["command"] == "dflashctl status --host pve1 run-1"
    assert (p["count"], p["suppressed"]) == (3, 0)
    assert p["events"] == [e.to_record() for e in batch]
    assert set(p) == {"cause", "host", "run", "verdict", "kind", "title", "message", "worker", "exception",
                      "signature", "remedy", "command", "events", "count", "suppressed", "time"}


def test_compose_ranks_a_failed_end_above_a_restart_and_a_clean_end_below_a_verdict_change() -> None:
    assert compose([simple("restart", attempt=2, next_run="run-2"), ended("lost", None)], "h")["title"] == \
        "h run run-1: ended lost"
    assert compose([ended("finished", 3)], "h")["title"] == "h run run-1: ended finished (exit 3)"
    p = compose([ended("finished", 0), simple("verdict", **{"from": "training", "to": "stalled"})], "h")
    assert p["kind"] == "verdict" and p["signature"] is None and p["remedy"] is None and p["worker"] is None
    assert compose([simple("first-step", step=1), ended()], "h")["title"] == "h run run-1: finished"
    assert compose([crash(0), crash(1), crash(2)], "h", suppressed=5)["title"].endswith(", +2 more workers")


def test_text_of_says_the_cause_first_then_what_happened_and_where_to_look() -> None:
    lines = text_of(compose([crash(0), crash(1), crash(2)], "pve1", suppressed=2)).splitlines()
    assert lines == [f"cause: cuda-oom — {OOM['summary']}", "in: drafter-0",
                     "  | torch.OutOfMemoryError: CUDA out of memory", f"what to do: {OOM['remedy']}",
                     "pve1 run run-1: drafter-0 crashed (torch.OutOfMemoryError), +2 more workers",
                     crash(0).message, "+4 more events", "look: dflashctl status --host pve1 run-1"]


def test_select_keeps_the_headline_and_the_latest_event() -> None:
    batch = [simple("first-step", t=i) for i in range(40)]
    batch[30] = crash(0, t=30.0)
    listed, suppressed = select(batch, 5)
    assert len(listed) == 5 and suppressed == 35
    assert crash(0, t=30.0) in listed and listed[-1] == batch[-1]
    assert [e.t for e in listed] == sorted(e.t for e in listed)


# --- the wire formats ----------------------------------------------------------------------------------------------

def test_a_webhook_gets_the_json_payload(receiver: Receiver) -> None:
    failures = Failures()
    n = notifier([NotifyTarget("webhook", url=receiver.url("/hook/secret"))], failures)
    try:
        n.submit(crash(3))
        (req,) = wait_until(lambda: receiver.got("/hook/secret"), what="the webhook")
    finally:
        n.close()
    assert req.method == "POST" and req.headers["content-type"] == "application/json"
    body = req.json()
    assert (body["host"], body["run"], body["worker"], body["exception"]) == \
        ("pve1", "run-1", "drafter-3", "torch.OutOfMemoryError")
    assert body["remedy"] == OOM["remedy"] and body["command"] == "dflashctl status --host pve1 run-1"
    assert failures.calls == []


def test_slack_gets_text_with_the_worker_and_the_remedy(receiver: Receiver) -> None:
    deliver(NotifyTarget("slack", url=receiver.url("/slack")), compose([crash(5)], "pve1"), 5.0)
    (req,) = receiver.got("/slack")
    body = req.json()
    assert list(body) == ["text"] and "drafter-5" in body["text"] and OOM["remedy"] in body["text"]


def test_ntfy_gets_a_text_body_and_latin1_safe_headers(receiver: Receiver) -> None:
    payload = compose([crash(1, run="run-✓")], "pve1")
    deliver(NotifyTarget("ntfy", url=receiver.url("/topic")), payload, 5.0)
    deliver(NotifyTarget("ntfy", url=receiver.url("/topic")), compose([ended()], "pve1"), 5.0)
    urgent, done = receiver.got("/topic")
    assert urgent.headers["content-type"] == "text/plain; charset=utf-8"
    assert urgent.body.decode() == text_of(payload)
    assert urgent.headers["title"] == "pve1 run run-?: drafter-1 crashed (torch.OutOfMemoryError)"
    assert (urgent.headers["priority"], urgent.headers["tags"]) == ("urgent", "warning")
    assert (done.headers["priority"], done.headers["tags"]) == ("default", "white_check_mark")


def test_a_command_gets_the_json_on_stdin_and_the_env(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    q = shlex.quote(str(out))
    cmd = (f"cat > {q}/stdin.json; printf '%s\\n' \"$DFLASH_EVENT_KIND\" \"$DFLASH_EVENT_RUN\" "
           f"\"$DFLASH_EVENT_TITLE\" > {q}/env.txt; printf '%s' \"$DFLASH_EVENT_JSON\" > {q}/env.json")
    payload = compose([crash(2)], "pve1")
    deliver(NotifyTarget("command", command=cmd), payload, 10.0)
    assert json.loads((out / "stdin.json").read_text()) == payload
    assert json.loads((out / "env.json").read_text()) == payload
    assert (out / "env.txt").read_text().splitlines() == ["worker-crashed", "run-1", payload["title"]]


def test_a_failing_or_slow_command_is_a_short_error() -> None:
    payload = compose([crash(2)], "pve1")
    with pytest.raises(DeliveryError, match=r"^exit 3: boom$"):
        deliver(NotifyTarget("command", command="echo noise; echo boom >&2; exit 3"), payload, 10.0)
    with pytest.raises(DeliveryError, match="timed out after 0.3 s"):
        deliver(NotifyTarget("command", command="sleep 60"), payload, 0.3)


def test_a_proxy_in_the_environment_does_not_catch_loopback(receiver: Receiver, refused_url: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, refused_url)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    deliver(NotifyTarget("webhook", url=receiver.url("/direct")), compose([ended()], "h"), 5.0)
    assert len(receiver.got("/direct")) == 1


def test_a_307_redirect_repeats_the_post(receiver: Receiver) -> None:
    payload = compose([ended()], "h")
    deliver(NotifyTarget("webhook", url=receiver.url("/redirect307")), payload, 5.0)
    (req,) = receiver.got("/ok")
    assert req.method == "POST" and req.json() == payload


# --- batching and the rate limit (injected clock) ----------------------------------------------------------------

def test_a_crash_storm_is_one_message(receiver: Receiver) -> None:
    clock, failures = FakeClock(), Failures()
    n = notifier([NotifyTarget("webhook", url=receiver.url("/storm"))], failures, gather_s=1.0, min_gap_s=60.0,
                 clock=clock)
    try:
        for i in range(16):
            n.submit(crash(i, t=100.0 + i / 100))
        assert n.due_in() == pytest.approx(1.0)
        clock.advance(1.0)
        wait_until(lambda: n.stats.delivered == 1, what="the storm's message")
        assert n.due_in() is None and n.stats.messages == 1
    finally:
        n.close()
    (req,) = receiver.got("/storm")
    body = req.json()
    assert (body["count"], body["suppressed"], len(body["events"])) == (16, 0, 16)
    assert body["title"] == "pve1 run run-1: drafter-0 crashed (torch.OutOfMemoryError), +15 more workers"


def test_events_within_the_gap_go_out_as_one_follow_up(receiver: Receiver) -> None:
    clock, failures = FakeClock(), Failures()
    n = notifier([NotifyTarget("webhook", url=receiver.url("/gap"))], failures, gather_s=0.2, min_gap_s=0.5,
                 clock=clock)
    try:
        n.submit(simple("first-step", step=1))
        clock.advance(0.2)
        wait_until(lambda: n.stats.delivered == 1, what="the first message")  # sent at clock 0.2
        n.submit(simple("verdict", **{"from": "training", "to": "stalled"}))
        n.submit(simple("stalled", seconds_since_progress=600.0))
        clock.advance(0.2)
        assert n.due_in() == pytest.approx(0.3)  # gathered, but held by the gap (until 0.2 + 0.5)
        for i in range(30):
            n.submit(crash(i, t=300.0 + i))
        clock.advance(0.3)
        wait_until(lambda: n.stats.delivered == 2, what="the follow-up")
        assert n.stats.messages == 2
    finally:
        n.close()
    first, follow = (r.json() for r in receiver.got("/gap"))
    assert (first["kind"], first["count"]) == ("first-step", 1)
    assert follow["kind"] == "worker-crashed" and follow["count"] == 32
    assert (len(follow["events"]), follow["suppressed"]) == (MAX_LISTED, 32 - MAX_LISTED)
    assert follow["events"][-1]["worker"] == "drafter-29"  # the latest is always listed


# --- failing targets -------------------------------------------------------------------------------------------

def test_failing_targets_are_reported_once_and_the_healthy_one_still_gets_the_message(
        receiver: Receiver, refused_url: str, hang_url: str) -> None:
    failures = Failures()
    bad = [NotifyTarget("webhook", url=receiver.url("/fail")), NotifyTarget("webhook", url=refused_url),
           NotifyTarget("ntfy", url=hang_url)]
    good = NotifyTarget("slack", url=receiver.url("/gate"))
    n = notifier([*bad, good], failures, timeout_s=0.5)
    try:
        n.submit(crash(0))
        assert n.stats.delivered == 0 and receiver.got("/gate") == []  # /gate cannot answer before this line
        receiver.gate.set()
        wait_until(lambda: n.stats.running == 0 and n.stats.messages == 1, what="every delivery to end")
    finally:
        n.close()
    assert len(receiver.got("/gate")) == 1 and n.stats.delivered == 1 and n.stats.failures == 3
    got = failures.by_target()
    assert sorted(got) == sorted(t.label for t in bad)
    for t in bad:
        (rec,) = got[t.label]
        assert rec["attempts"] == 3 and rec["kinds"] == ["worker-crashed"] and "\n" not in rec["error"]
    assert got[bad[0].label][0]["error"].startswith("HTTP 500")
    assert "refused" in got[bad[1].label][0]["error"].lower()
    assert "timed out" in got[bad[2].label][0]["error"].lower()
    assert len(receiver.got("/fail")) == 3


def test_a_hanging_target_does_not_hold_back_the_others(receiver: Receiver) -> None:
    failures = Failures()
    n = notifier([NotifyTarget("webhook", url=receiver.url("/hold")), NotifyTarget("webhook", url=receiver.url("/ok"))],
                 failures, timeout_s=60.0)
    try:
        n.submit(crash(0))
        wait_until(lambda: receiver.got("/ok") and "/hold" in receiver.arrived, what="both targets contacted")
        assert receiver.got("/hold") == []  # /hold has not answered: the healthy target did not wait for it
        assert n.stats.in_flight == 1 and failures.calls == []
    finally:
        n.close()


def test_flush_sends_at_once_and_gives_up_on_a_hanging_target_at_its_deadline(receiver: Receiver,
                                                                               hang_url: str) -> None:
    failures = Failures()
    hang = NotifyTarget("webhook", url=hang_url)
    n = notifier([hang, NotifyTarget("webhook", url=receiver.url("/ok"))], failures, gather_s=600.0,
                 min_gap_s=600.0, timeout_s=60.0)
    try:
        n.submit(ended("crashed", 1))
        started = time.monotonic()
        assert n.flush(1.0) is False
        assert time.monotonic() - started < 30
        (req,) = receiver.got("/ok")  # sent by flush, without the 600 s gather
        assert req.json()["count"] == 1
        (rec,) = failures.calls
        assert rec["target"] == hang.label and rec["error"].startswith(DEADLINE_ERROR)
        wait_until(lambda: n.stats.running == 0, what="the hanging attempt to end")  # its timeout was cut to 1 s
        assert len(failures.calls) == 1 and n.stats.failures == 1
    finally:
        n.close()


def test_flush_with_healthy_targets_or_nothing_held_is_true(receiver: Receiver) -> None:
    failures = Failures()
    n = notifier([NotifyTarget("webhook", url=receiver.url("/ok"))], failures, gather_s=600.0)
    try:
        assert n.flush(5.0) is True
        n.submit(ended())
        n.submit(simple("restart", attempt=2, next_run="run-2"))
        assert n.flush(20.0) is True
    finally:
        n.close()
    (req,) = receiver.got("/ok")
    assert req.json()["count"] == 2 and failures.calls == []


def test_kinds_not_asked_for_are_ignored(receiver: Receiver) -> None:
    failures = Failures()
    n = Notifier([NotifyTarget("webhook", url=receiver.url("/ok"))], ("ended",), "pve1", on_failure=failures)
    try:
        n.submit(crash(0))
        assert n.due_in() is None and n.stats.events == 0
    finally:
        n.close()
