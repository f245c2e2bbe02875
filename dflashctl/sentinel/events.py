"""The events of a run (<run>/events.jsonl): one JSON object per line, appended by the sentinel (and by the
supervisor for a restart), read by `status --events`, `runs` and `logs --events`.

Record: {"t": container epoch seconds, "kind": one of spec.EVENT_KINDS, "run": run id, "verdict": the verdict at
that moment, "message": one line for a person, …kind's own fields}. Kind fields:
  sentinel        {"pid", "interval_s", "targets": [label], "policy": {...}}
  first-step      {"step"}                                     once: progress first shows a step
  verdict         {"from", "to", "reasons"}                    each change (not for the first view)
  worker-crashed  {"worker", "exception" | None, "exception_message" | None,
                   "signature": {"id", "summary", "remedy"} | None,
                   "first": the root cause of several, "traceback_tail": [its last lines]}   once per crashed
                                                               thread or rank
  stalled         {"reasons", "seconds_since_progress", "stall_shape": "idle-held" | "spinning" | None,
                   "stall_remedy"}                              each time the verdict becomes stalled, and again
                                                               when the GPUs show its shape
  stacks          {"path", "reason", "dumped", "processes": [{"pid", "role", "method", "threads", "error"}],
                   "capture_dir", "capture": {"dir", "stacks": [{"pid", "rank", "file", …}], "dumps", …},
                   "flight_recorder": [who is behind where, as status says it] (when the dumps name one)}
                                                               once per stall, and once on a collective timeout:
                                                               what every thread does, kept with the flight
                                                               recorder's dumps (agent/lib/captures.py)
  idle-gpus       {"gpus": [index], "reasons"}                 each episode of GPUs holding memory at ≈0 %
  signature       {"signature": {"id", "summary", "remedy"}, "line", "text"}   once per id, unless a
                                                               worker-crashed event carried it
  policy          {"action": "stop", "reason": "stalled" | "idle" | "worker-failure", "detail"}
  ended           {"exit_code" | None (nothing recorded one: lost), "reasons"}   once, last
  restart         {"attempt", "next_run", "why", "error", "gpus"}   (in the earlier attempt's file; next_run None
                   and error set: no attempt started — with --exclude-unhealthy-gpus, too few healthy GPUs: the
                   sentinel writes that one; gpus: sentinel/gpurecheck.py's record)
  notify-failed   {"target", "error", "attempts", "kinds"}

`EventTracker` turns the StatusViews of one run (analysis/watcher.py, the engine `status` uses) into the events
above, each said once; policy.py decides the `policy` ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dflashctl.analysis.cause import tail_lines
from dflashctl.analysis.events import Event
from dflashctl.analysis.verdict import EndWatch, ProcessState
from dflashctl.analysis.watchspec import Policy
from dflashctl.model import GpuFinding, Signature, SignatureHit, ThreadState, Verdict

if TYPE_CHECKING:
    from dflashctl.analysis.watcher import StatusView

# -- from views to events ---------------------------------------------------------------------------------------

MESSAGE_MAX = 200  # a message's crash line is cut here (a notification title, a line in `status --events`)
HOLD_S = 3.0  # a crashed worker whose exception line has not arrived yet (its traceback is being written) waits
PROGRAMS = ("exec", "adopted")  # meta.json kinds of a program that is not our trainer


def one_line(text: str, limit: int = MESSAGE_MAX) -> str:
    """Whitespace (newlines too) folded to single spaces, cut at `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def gpu_ranges(indices: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5] → "0-3,5" (how `status` names a set of GPUs)."""
    xs, parts = sorted(set(indices)), []
    while xs:
        j = 0
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[0]) if j == 0 else f"{xs[0]}-{xs[j]}")
        xs = xs[j + 1:]
    return ",".join(parts)


def gpus_label(indices: Iterable[int]) -> str:
    xs = sorted(set(indices))
    return f"GPU{'s' if len(xs) > 1 else ''} {gpu_ranges(xs)}"


def fmt_duration(seconds: float) -> str:
    """1800 → "30m 0s", 45 → "45s", 5400 → "1h 30m": a span a person reads."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h {m}m" if h else f"{m}m {sec}s" if m else f"{sec}s"


def signature_record(sig: Signature) -> dict[str, str]:
    return {"id": sig.id, "summary": sig.summary, "remedy": sig.remedy}


def _is_evidence(hit: SignatureHit, worker: ThreadState) -> bool:
    """Is this hit found in the worker's own traceback? health takes a crashed thread's hits line by line from its
    traceback (or, for its exception type, from the exception line), so the hit's text is one of its lines."""
    if worker.traceback and hit.text in (ln.strip()[:500] for ln in worker.traceback.splitlines()):
        return True
    exc_line = f"{worker.exception}: {worker.message}" if worker.message else worker.exception
    return bool(exc_line) and hit.text == str(exc_line).strip()[:500]


def worker_hit(worker: ThreadState, hits: Sequence[SignatureHit],
               crashed: Sequence[ThreadState] = ()) -> SignatureHit | None:
    """The signature of one crashed worker: the active hit its own traceback is the evidence of, else the first
    active hit that is no other crashed worker's evidence (a rank killed by signal 9 has no traceback, but the
    launcher's line is a host-oom hit), else None."""
    own = next((h for h in hits if _is_evidence(h, worker)), None)
    if own is not None:
        return own
    others = [w for w in crashed if w.name != worker.name]
    return next((h for h in hits if not any(_is_evidence(h, w) for w in others)), None)


def _crash_line(worker: ThreadState) -> str:
    what = ": ".join(x for x in (worker.exception, worker.message) if x)
    return f"{worker.name} crashed" + (f": {what}" if what else "")


@dataclass
class _RunState:
    """What one run's events have said so far."""

    run: str | None
    verdict: Verdict | None = None  # the previous (settled) view's
    stepped: bool = False
    workers: set[str] = field(default_factory=set)  # reported as crashed
    held: dict[str, float] = field(default_factory=dict)  # crashed, exception line not seen yet: since when
    signatures: set[str] = field(default_factory=set)
    stalled: bool = False
    shape: str | None = None  # the stall's shape as last said (a shape found later is said again)
    idle: frozenset[int] = frozenset()  # the GPUs of the idle episode going on (empty: none)
    ended: bool = False
    end: EndWatch = field(default_factory=EndWatch)


class EventTracker:
    """Consecutive StatusViews of one run → the events each adds, each said once. Pure: no clock (time is the
    view's, the container's), no I/O; the sentinel writes the events and the notifier batches them."""

    def __init__(self, run_id: str | None = None, policy: Policy | None = None) -> None:
        self.policy = policy  # only decides the wording: what happens to a program after a worker died
        self._s = _RunState(run_id)

    def update(self, view: StatusView) -> list[Event]:
        """The events this view adds (none for a view without a run, and none after the run's `ended`)."""
        run = view.run
        if run is None:
            return []
        if run.id != self._s.run:  # a different run (the next attempt): what was said of the last one is history
            self._s = _RunState(run.id)
        s = self._s
        if s.ended:
            return []
        h = view.health
        t = 0.0 if view.time is None else view.time
        kind = run.meta.kind
        ending = s.end.see(ProcessState(alive=run.alive, exit_code=run.exit_code), t, supervised=kind != "adopted")
        # gone with no exit code yet: the supervisor may still be writing it; `lost` is not a verdict until then
        settling = view.settling or (h.verdict == Verdict.LOST and ending == "settling")
        out: list[Event] = []

        def emit(kind_: str, message: str, **data: Any) -> None:
            out.append(Event(t, kind_, run.id, h.verdict.value, one_line(message, 2 * MESSAGE_MAX), data))

        step = h.progress.get("step")
        if step is not None and not s.stepped:
            s.stepped = True
            total = h.progress.get("total")
            emit("first-step", f"first step: {step:g}" + (f" of {total:g}" if total else ""), step=_num(step))
        if not settling:
            if s.verdict is not None and h.verdict != s.verdict:
                emit("verdict", f"verdict {s.verdict.value} → {h.verdict.value}"
                     + (f": {h.reasons[0]}" if h.reasons else ""),
                     **{"from": s.verdict.value, "to": h.verdict.value, "reasons": list(h.reasons)})
            s.verdict = h.verdict
        carried, waiting = self._workers(view, kind, t, emit)
        for hit in h.hits:
            sid = hit.signature.id
            if sid in s.signatures or sid in waiting:
                continue
            s.signatures.add(sid)
            if sid not in carried:  # said already, with the worker it killed
                emit("signature", f"{sid}: {hit.signature.summary} (log line {hit.line})",
                     signature=signature_record(hit.signature), line=hit.line, text=hit.text)
        if not settling:
            stalled = h.verdict == Verdict.STALLED
            if stalled and (not s.stalled or (h.stall_shape is not None and h.stall_shape != s.shape)):
                emit("stalled", "run stalled" + (f": {h.reasons[0]}" if h.reasons else ""),
                     reasons=list(h.reasons), seconds_since_progress=h.seconds_since_progress,
                     stall_shape=h.stall_shape, stall_remedy=h.stall_remedy)
            s.stalled, s.shape = stalled, h.stall_shape if stalled else None
        self._idle(view, emit)
        if h.verdict.is_terminal and ending == "ended":
            s.ended = True
            code = run.exit_code
            emit("ended", f"run ended: {h.verdict.value} ({'no exit code' if code is None else f'exit {code}'})",
                 exit_code=code, reasons=list(h.reasons))
        return out

    def _workers(self, view: StatusView, kind: str, t: float, emit: Callable[..., None]) -> tuple[set[str], set[str]]:
        """worker-crashed, once per worker; returns the signature ids these events carried, and those of workers
        still held (their traceback is being written: the exception line, and its signature, come next)."""
        s, h, run = self._s, view.health, view.run
        assert run is not None
        crashed = [w for w in h.threads if w.state == "crashed"]
        carried: set[str] = set()
        waiting: set[str] = set()
        new = [w for w in crashed if w.name not in s.workers]
        bare = {w.name for w in new if w.exception is None and w.message is None and run.alive
                and view.time is not None}
        for name in bare:
            s.held.setdefault(name, t)
        # workers that crashed together are said together (one message for a crash storm): while one of them waits
        # for its exception line, the others wait with it, for at most HOLD_S after the first of them was held
        first = min((s.held[w.name] for w in new if w.name in s.held), default=t)
        together = t - first < HOLD_S and any(t - s.held[n] < HOLD_S for n in bare)
        for w in new:
            if together or (w.name in bare and t - s.held[w.name] < HOLD_S):
                waiting.update(x.signature.id for x in h.hits if _is_evidence(x, w))
                continue
            s.workers.add(w.name)
            s.held.pop(w.name, None)
            hit = worker_hit(w, h.hits, crashed)
            if hit is not None:
                carried.add(hit.signature.id)
            message = one_line(_crash_line(w)) + self._consequence(kind, h.verdict)
            emit("worker-crashed", message, worker=w.name, exception=w.exception, exception_message=w.message,
                 signature=None if hit is None else signature_record(hit.signature),
                 first=w.name == h.root_cause and len(crashed) > 1, traceback_tail=list(tail_lines(w.traceback)))
        return carried, waiting - carried

    def _consequence(self, kind: str, verdict: Verdict) -> str:
        """A program that is not our trainer carries on without the worker: say what happens next."""
        if kind not in PROGRAMS or verdict != Verdict.DEGRADED:
            return ""
        how = self.policy.on_worker_failure if self.policy is not None else None
        if how == "stop":
            return "; the sentinel stops the run (--on-worker-failure stop)"
        if how == "keep":
            return "; the program keeps running without it (--on-worker-failure keep)"
        return ("; the program keeps running without it; dflashctl will not stop it "
                "(launch with --on-worker-failure stop)")

    def _idle(self, view: StatusView, emit: Callable[..., None]) -> None:
        """idle-gpus once per episode: GPUs holding memory at ≈0 % while the run is alive and past its start
        (loading and compiling hold memory at 0 % too); again only once the set was empty, or when it grows."""
        s, h, run = self._s, view.health, view.run
        assert run is not None
        watched = run.alive and h.verdict != Verdict.STARTING and not h.verdict.is_terminal
        now = frozenset(g.index for g in h.gpus if g.finding == GpuFinding.IDLE_ALLOCATED and watched)
        if now - s.idle:
            emit("idle-gpus", f"{gpus_label(now)} {'hold' if len(now) > 1 else 'holds'} memory at ≈0 % utilisation",
                 gpus=sorted(now), reasons=list(h.reasons))
        s.idle = s.idle | now if now else frozenset()


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x
