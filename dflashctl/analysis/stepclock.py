"""When did the run last make progress? The watch's timing rules, kept apart from the probe reading them.

The stall rule (health.judge) needs the time of the last new step. A watch sees steps change between probe
reports; a one-shot look sees one step of unknown age. The log file's mtime is when its last bytes were
written, so a step found at the first look is dated by it; a watch started on a live run (`live`) counts a step
it finds at once as fresh; otherwise a step's age is known only once it has stood still for a whole stall window
under our eyes. Pure: "now" and the mtime are the container's clock, from the probe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepClock:
    stall_window_s: float
    live: bool = False  # watching: a step seen at the first look counts as fresh until it stops moving
    step: float | None = None
    seen_at: float | None = None  # when the current step value was first seen
    time_known: bool = False  # False: the step was already there at the first look (its age unknown)

    def reset(self) -> None:
        """A different run: nothing of the last one's steps counts."""
        self.step = self.seen_at = None
        self.time_known = False

    def see(self, step: float | None, now: float | None, log_mtime: float | None) -> float | None:
        """The time of the last new step as far as it is known (None: unknown), after this report's step."""
        if step != self.step:
            first_look = self.step is None
            self.step, self.seen_at = step, now
            self.time_known = not first_look or self.live
            if first_look and log_mtime is not None and step is not None:
                self.seen_at, self.time_known = min(log_mtime, now if now is not None else log_mtime), True
        if self.time_known:
            return self.seen_at
        if self.seen_at is not None and now is not None and now - self.seen_at >= self.stall_window_s:
            return self.seen_at  # unchanged for a whole window since we first looked
        return None
