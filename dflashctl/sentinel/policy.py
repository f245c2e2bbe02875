"""The failure policy (spec.Policy): when the sentinel ends a run on its own, so GPUs nobody is using are freed
with nobody's laptop connected.

Pure: it reads consecutive StatusViews (time is the view's, the container's clock) and says at most once per run
what to do; the sentinel does it (the `stopped` marker, then the group, as `dflashctl stop`) and writes the
decision as a `policy` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflashctl.analysis.events import Event
from dflashctl.analysis.health import Thresholds
from dflashctl.analysis.watchspec import Policy
from dflashctl.sentinel.events import fmt_duration, gpus_label, one_line

if TYPE_CHECKING:
    from dflashctl.analysis.watcher import StatusView


@dataclass(frozen=True)
class Decision:
    """What the sentinel does to the run and why (`reason` is what chain.py and `stopped` record)."""

    action: str  # "stop"
    reason: str  # idle | stalled | worker-failure
    detail: str  # one line for a person and the notification

    def to_event(self, view: StatusView) -> Event:
        """The `policy` record of events.jsonl for this decision, taken on this view."""
        return Event(0.0 if view.time is None else view.time, "policy", view.run.id if view.run else "",
                     view.health.verdict.value, f"{self.action} the run: {self.detail}",
                     {"action": self.action, "reason": self.reason, "detail": self.detail})


def limit_spelling(seconds: float) -> str:
    """1800 → "30m", 5400 → "1h30m", 90 → "1m30s": a limit as `--idle-limit` / `--stall-limit` spell it."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v) or "0s"


class PolicyState:
    """The policy applied to one run's views. Rules, checked while the run is alive (not while it is already being
    stopped or reaped):

    - on_worker_failure "stop": any worker (thread or rank) has crashed;
    - stall_limit_s: a step was logged and none is newer than the limit (jobs log no steps: never);
    - idle_limit U%@D: at least one GPU holds memory (≥ Thresholds.allocated_mib) and every such GPU is below U %
      in every view for D seconds; one view otherwise (a busy GPU, no reading, memory freed) starts it over.
    """

    def __init__(self, policy: Policy, thresholds: Thresholds = Thresholds()) -> None:
        self.policy = policy
        self.thresholds = thresholds  # the Watcher's: what "holds memory" means
        self.run: str | None = None
        self.idle_since: float | None = None  # the view time the idle episode going on started
        self.decision: Decision | None = None  # the one taken (then decide says nothing more)

    def decide(self, view: StatusView) -> Decision | None:
        """A Decision the first time a rule fires, else None (and None ever after: the sentinel acts once)."""
        run = view.run
        if run is not None and run.id != self.run:  # the next attempt is judged afresh
            self.run, self.idle_since, self.decision = run.id, None, None
        if self.decision is not None or run is None:
            return None
        if not run.alive or run.ending or run.stopped:
            self.idle_since = None
            return None
        decision = self._worker_failure(view) or self._stall(view) or self._idle(view)
        self.decision = decision
        return decision

    def _worker_failure(self, view: StatusView) -> Decision | None:
        if self.policy.on_worker_failure != "stop":
            return None
        crashed = [w for w in view.health.threads if w.state == "crashed"]
        if not crashed:
            return None
        first = next((w for w in crashed if w.name == view.health.root_cause), crashed[0])
        names = ", ".join(w.name for w in crashed[:3]) + (f" and {len(crashed) - 3} more" if len(crashed) > 3 else "")
        what = ": ".join(x for x in (first.exception, first.message) if x)
        return Decision("stop", "worker-failure", one_line(
            f"{names} crashed" + (f" ({first.name}: {what})" if what else "") + " (on-worker-failure stop)", 300))

    def _stall(self, view: StatusView) -> Decision | None:
        limit, h = self.policy.stall_limit_s, view.health
        since = h.seconds_since_progress
        if limit is None or "step" not in h.progress or since is None or since < limit:
            return None
        return Decision("stop", "stalled", f"no new step for {fmt_duration(since)} after step "
                                           f"{h.progress['step']:g} (stall limit {limit_spelling(limit)})")

    def _idle(self, view: StatusView) -> Decision | None:
        limit = self.policy.idle_limit
        if limit is None:
            return None
        held = [g for g in view.health.gpus
                if g.sample.memory_used_mib is not None and g.sample.memory_used_mib >= self.thresholds.allocated_mib]
        idle = bool(held) and all(g.sample.utilization_pct is not None and g.sample.utilization_pct < limit.util_pct
                                  for g in held)
        if not idle or view.time is None:
            self.idle_since = None
            return None
        if self.idle_since is None:
            self.idle_since = view.time
        elapsed = view.time - self.idle_since
        if elapsed < limit.for_s:
            return None
        return Decision("stop", "idle", f"{gpus_label(g.index for g in held)} below {limit.util_pct:g} % utilisation "
                                        f"with memory held for {fmt_duration(elapsed)} "
                                        f"(idle limit {limit.util_pct:g}%@{limit_spelling(limit.for_s)})")
