"""What the sentinel tells a person, and when: `compose` turns a batch of events into one payload (pure), `Notifier`
batches and rate-limits events and delivers each message to every target in the background (deliver.py holds the
wire formats).

Why batch: a crash storm (16 worker threads dying within a second) must reach a phone as one message, not 16; and
after a message, whatever follows within `min_gap_s` goes out as one follow-up, so a flapping run cannot flood a
channel. Why in the background: the sentinel's watch loop must never wait on a slow or dead webhook.

Stdlib only (it runs in the container).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dflashctl.analysis.cause import cause_lines
from dflashctl.analysis.events import Event
from dflashctl.analysis.watchspec import NotifyTarget
from dflashctl.sentinel.deliver import FAILED_VERDICTS, deliver, one_line, redact

# most severe first; "ended-with-failure" is an `ended` event whose run crashed, was lost or stopped, or exited ≠ 0
SEVERITY = ("worker-crashed", "policy", "stalled", "idle-gpus", "signature", "ended-with-failure", "restart",
            "verdict", "ended", "first-step")
MAX_LISTED = 20  # events listed in one message; the rest are counted in "suppressed"
DEADLINE_ERROR = "deadline at the end of the run"
_MAX_PENDING = 1000  # held events beyond this are folded (the most severe and the latest kept), memory stays bounded
_RECHECK_S = 1.0  # the worker re-reads the clock at least this often, so an injected clock is honoured


def ended_badly(event: Event) -> bool:
    code = event.data.get("exit_code")
    return event.kind == "ended" and (event.verdict in FAILED_VERDICTS or (code is not None and code != 0))


def severity(event: Event) -> int:
    """Rank in SEVERITY, 0 the most severe; a kind not in it ranks last."""
    key = "ended-with-failure" if ended_badly(event) else event.kind
    return SEVERITY.index(key) if key in SEVERITY else len(SEVERITY)


def _signature(event: Event) -> dict[str, Any] | None:
    sig = event.data.get("signature")  # worker-crashed and signature events both carry it here
    if isinstance(sig, dict) and sig.get("id"):
        return {"id": str(sig["id"]), "summary": sig.get("summary"), "remedy": sig.get("remedy")}
    return None


def _what(event: Event, batch: Sequence[Event]) -> str:
    """The headline after "HOST run RUN: " — what happened, in a few words."""
    d, kind = event.data, event.kind
    if kind == "worker-crashed":
        what = f"{d.get('worker') or 'a worker'} crashed" + (f" ({d['exception']})" if d.get("exception") else "")
        others = sum(1 for e in batch if e.kind == "worker-crashed") - 1
        return what + (f", +{others} more worker{'s' if others > 1 else ''}" if others > 0 else "")
    if kind == "policy":
        return f"stopped by policy ({d.get('reason') or d.get('action') or 'policy'})"
    if kind == "stalled":
        since = d.get("seconds_since_progress")
        return "stalled" + (f" ({since:.0f} s without progress)" if isinstance(since, int | float) else "")
    if kind == "idle-gpus":
        gpus = [str(g) for g in d.get("gpus") or ()]
        return f"GPU{'s' if len(gpus) != 1 else ''} {','.join(gpus)} idle with memory held" if gpus else "GPUs idle"
    if kind == "signature" and (sig := _signature(event)):
        return sig["id"] + (f": {sig['summary']}" if sig["summary"] else "")
    if kind == "ended":
        code = d.get("exit_code")
        if ended_badly(event):
            return f"ended {event.verdict or 'badly'}" + (f" (exit {code})" if code is not None else "")
        return "finished" if event.verdict in ("finished", "") else f"ended ({event.verdict})"
    if kind == "restart" and d.get("error"):  # refused: too few healthy GPUs (gpurecheck.py)
        return f"attempt {d.get('attempt', '?')} not started: {d['error']}"
    if kind == "restart":
        return f"restarting as attempt {d.get('attempt', '?')}" + (f" ({d['next_run']})" if d.get("next_run") else "")
    if kind == "verdict":
        return f"{d.get('from') or '?'} -> {d.get('to') or event.verdict}"
    if kind == "first-step":
        return "first step" + (f" ({d['step']})" if d.get("step") is not None else "")
    return kind


def _cause(head: Event, crash: Event | None, sig: dict[str, Any] | None) -> list[str]:
    """The cause lines every message starts with (issue 28): signature and remedy, the worker that failed first,
    the last lines of its traceback (analysis/cause.py says them the same way `status` does)."""
    d = crash.data if crash is not None else {}
    if sig is None and head.kind == "stalled" and head.data.get("stall_shape"):
        sig = {"id": f"stall: {head.data['stall_shape']}", "summary": None, "remedy": head.data.get("stall_remedy")}
    exception = ": ".join(str(x) for x in (d.get("exception"), d.get("exception_message")) if x) or None
    tail = [str(x) for x in d.get("traceback_tail") or ()]
    return cause_lines(None if sig is None else sig["id"], None if sig is None else sig.get("summary"),
                       None if sig is None else sig.get("remedy"), d.get("worker"), bool(d.get("first")),
                       None if exception is None else one_line(exception), tail)


def compose(events: Sequence[Event], host: str, suppressed: int = 0) -> dict[str, Any]:
    """The payload of one message about `events` (in the order they happened). Its headline is the most severe
    event (the first of equals); `suppressed` counts events folded into this message but not listed."""
    if not events:
        raise ValueError("compose needs at least one event")
    head = min(events, key=severity)
    latest = max(enumerate(events), key=lambda p: (p[1].t, p[0]))[1]
    sig = _signature(head) or next((s for e in events if (s := _signature(e))), None)
    crash = head if head.data.get("worker") else next((e for e in events if e.data.get("worker")), None)
    run = head.run or latest.run
    return {
        "cause": _cause(head, crash, sig),
        "host": host, "run": run, "verdict": latest.verdict, "kind": head.kind,
        "title": f"{host} run {run}: {_what(head, events)}", "message": head.message,
        "worker": None if crash is None else crash.data.get("worker"),
        "exception": None if crash is None else crash.data.get("exception"),
        "signature": sig, "remedy": None if sig is None else sig["remedy"],
        "command": f"dflashctl status --host {shlex.quote(host)} {shlex.quote(run)}",
        "events": [e.to_record() for e in events], "count": len(events) + suppressed, "suppressed": suppressed,
        "time": latest.t,
    }


def select(events: Sequence[Event], limit: int = MAX_LISTED) -> tuple[list[Event], int]:
    """(listed, suppressed): at most `limit` events — the most severe and the latest, in their order — and how many
    were left out. Keeps compose's headline and "verdict" true for the whole batch."""
    if len(events) <= limit:
        return list(events), 0
    keep = {len(events) - 1}
    for i in sorted(range(len(events)), key=lambda i: (severity(events[i]), i)):
        if len(keep) >= limit:
            break
        keep.add(i)
    return [events[i] for i in sorted(keep)], len(events) - len(keep)


@dataclass
class NotifyStats:
    """Counters for tests, the benchmark and the sentinel's own record. A delivery is one message to one target."""

    events: int = 0  # accepted by submit (a notified kind)
    messages: int = 0  # composed and handed to the targets
    delivered: int = 0
    failures: int = 0  # deliveries given up (on_failure called)
    attempts: int = 0
    in_flight: int = 0  # deliveries neither delivered nor given up
    running: int = 0  # delivery threads alive (one given up at a deadline may still be finishing its last try)
    errors: int = 0  # unexpected errors caught in the worker thread or in on_failure
    last_error: str = ""


@dataclass(eq=False)
class _Delivery:
    target: NotifyTarget
    payload: dict[str, Any]
    kinds: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    abort: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None  # time.monotonic() by which flush wants it over
    attempts: int = 0
    last_error: str = ""
    settled: bool = False  # delivered or given up: decided exactly once
    ok: bool = False


class Notifier:
    """Batches, rate-limits and delivers notifications without ever blocking the caller.

    The first event of a quiet period waits `gather_s` for the events that come with it; after a message, events
    wait until `min_gap_s` has passed since it and go out as one follow-up. Each message goes to every target in its
    own thread, `retries` attempts in all with `backoff_s` between them, each attempt bounded by `timeout_s` (a
    socket timeout per connect / read). A target that finally fails calls on_failure once per message.

    `clock` decides batching only (inject one to test the state machine); deadlines of real I/O use real time.
    """

    def __init__(self, targets: Iterable[NotifyTarget], kinds: Iterable[str], host: str, *,
                 on_failure: Callable[[dict[str, Any]], None], gather_s: float = 1.0, min_gap_s: float = 60.0,
                 timeout_s: float = 5.0, retries: int = 3, backoff_s: Sequence[float] = (1.0, 2.0, 4.0),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.targets, self.kinds, self.host = tuple(targets), frozenset(kinds), host
        self.gather_s, self.min_gap_s, self.timeout_s = gather_s, min_gap_s, timeout_s
        self.retries, self.backoff_s = max(1, retries), tuple(backoff_s)
        self._on_failure, self._clock = on_failure, clock
        self._cond = threading.Condition()
        self._pending: list[Event] = []
        self._folded = 0  # events dropped from _pending to bound memory, counted as suppressed
        self._first_at: float | None = None  # clock() when the first pending event came
        self._last_sent: float | None = None  # clock() when the last message went out
        self._inflight: set[_Delivery] = set()
        self._closed = False
        self._stats = NotifyStats()
        self._thread = threading.Thread(target=self._loop, name="sentinel-notify", daemon=True)
        self._thread.start()

    @property
    def stats(self) -> NotifyStats:
        """A snapshot of the counters."""
        with self._cond:
            return replace(self._stats)

    def due_in(self) -> float | None:
        """Seconds (by `clock`) until the held events go out, ≤ 0 when due now; None when nothing is held."""
        with self._cond:
            return self._due_in(self._clock())

    def submit(self, event: Event) -> None:
        """Queue an event (one of `kinds`; others are ignored) and return at once."""
        if event.kind not in self.kinds or not self.targets:
            return
        with self._cond:
            if self._closed:
                return
            if not self._pending:
                self._first_at = self._clock()
            self._pending.append(event)
            self._stats.events += 1
            if len(self._pending) >= _MAX_PENDING:
                kept, dropped = select(self._pending, MAX_LISTED)
                self._pending, self._folded = kept, self._folded + dropped
            self._cond.notify_all()

    def flush(self, deadline_s: float) -> bool:
        """End of the run: send what is held now (no gather / gap wait) and wait at most deadline_s for every
        delivery still under way; retries are cut short by the deadline. True if all of them were delivered; each
        one that was not is reported to on_failure (once) as DEADLINE_ERROR unless it had already failed."""
        end = time.monotonic() + max(0.0, deadline_s)
        with self._cond:
            started = self._take_locked() if self._pending else []
            waiting = list(self._inflight)
            for d in waiting:
                d.deadline = end if d.deadline is None else min(d.deadline, end)
        self._start(started)
        for d in waiting:
            d.done.wait(max(0.0, end - time.monotonic()))
        for d in waiting:
            if not d.done.is_set():
                d.abort.set()
                self._settle(d, self._deadline_error(d))
        return all(d.ok for d in waiting)

    def close(self) -> None:
        """Stop the worker. Held events are dropped (flush first); deliveries under way finish on their own."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    # --- the worker: when a message is due ---

    def _due_in(self, now: float) -> float | None:
        """Seconds until the held events are due (≤ 0: now); None when nothing is held."""
        if not self._pending or self._first_at is None:
            return None
        due = self._first_at + self.gather_s
        if self._last_sent is not None:
            due = max(due, self._last_sent + self.min_gap_s)
        return due - now

    def _loop(self) -> None:
        while True:
            try:
                with self._cond:
                    while not self._closed:
                        wait = self._due_in(self._clock())
                        if wait is not None and wait <= 0:
                            break
                        self._cond.wait(None if wait is None else min(wait, _RECHECK_S))
                    if self._closed:
                        return
                    started = self._take_locked()
                self._start(started)
            except Exception as e:  # the sentinel outlives a bad event: count it, pause (no spinning), carry on
                self._note_error(e)
                with self._cond:
                    self._cond.wait(_RECHECK_S)

    def _take_locked(self) -> list[_Delivery]:
        """Turn the held events into one message and its deliveries (registered, not yet started)."""
        events, folded = self._pending, self._folded
        self._pending, self._folded, self._first_at = [], 0, None
        if not events:
            return []
        self._last_sent = self._clock()
        listed, suppressed = select(events, MAX_LISTED)
        payload = compose(listed, self.host, suppressed + folded)
        kinds = list(dict.fromkeys(e.kind for e in events))
        self._stats.messages += 1
        deliveries = [_Delivery(t, payload, kinds) for t in self.targets]
        self._inflight.update(deliveries)
        self._stats.in_flight += len(deliveries)
        return deliveries

    def _start(self, deliveries: list[_Delivery]) -> None:
        for d in deliveries:
            with self._cond:
                self._stats.running += 1
            try:
                threading.Thread(target=self._run, args=(d,), name=f"notify {d.target.label}", daemon=True).start()
            except RuntimeError as e:  # no thread to be had: this delivery fails, the others still go
                with self._cond:
                    self._stats.running -= 1
                self._settle(d, redact(one_line(f"cannot start a thread: {e}"), d.target))

    # --- one delivery: attempts, backoff, the verdict ---

    def _run(self, d: _Delivery) -> None:
        cut_short = False
        try:
            for n in range(1, self.retries + 1):
                if n > 1 and d.abort.wait(self.backoff_s[min(n - 2, len(self.backoff_s) - 1)] if self.backoff_s
                                          else 0.0):
                    cut_short = True
                    break
                timeout = self.timeout_s if d.deadline is None else min(self.timeout_s, d.deadline - time.monotonic())
                if timeout <= 0:
                    cut_short = True
                    break
                cut_short = timeout < self.timeout_s
                d.attempts = n
                with self._cond:
                    self._stats.attempts += 1
                try:
                    deliver(d.target, d.payload, timeout)
                except Exception as e:
                    d.last_error = redact(one_line(e), d.target) or type(e).__name__
                    continue
                self._settle(d, None)
                return
            self._settle(d, self._deadline_error(d) if cut_short else d.last_error or "not delivered")
        finally:
            with self._cond:
                self._stats.running -= 1

    @staticmethod
    def _deadline_error(d: _Delivery) -> str:
        return DEADLINE_ERROR + (f" (last try: {d.last_error})" if d.last_error else "")

    def _settle(self, d: _Delivery, error: str | None) -> None:
        """Delivered (error None) or given up — the first call decides; a failure is reported to on_failure."""
        with self._cond:
            first = not d.settled
            if first:
                d.settled, d.ok = True, error is None
                self._inflight.discard(d)
                self._stats.in_flight -= 1
                if error is None:
                    self._stats.delivered += 1
                else:
                    self._stats.failures += 1
        if first and error is not None:
            try:
                self._on_failure({"target": d.target.label, "error": error, "attempts": d.attempts,
                                  "kinds": list(d.kinds)})
            except Exception as e:  # the caller's recorder failing must not kill a delivery thread
                self._note_error(e)
        d.done.set()  # after the report: flush() returning means the failure is recorded (the sentinel then exits)

    def _note_error(self, e: BaseException) -> None:
        with self._cond:
            self._stats.errors += 1
            self._stats.last_error = one_line(f"{type(e).__name__}: {e}")
