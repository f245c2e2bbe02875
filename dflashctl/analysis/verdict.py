"""A run's process verdict and "has it ended": the rules `runs`, `stop`, `launch --wait-for`, `logs -f` and
`status` share, so no two commands can disagree about the same run.

`health.judge` adds what the log, the heartbeat and the GPUs say; everything it concludes from the process
alone comes from here. Pure: "now" is an argument (the container's clock, from the probe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dflashctl.model import Verdict

# The supervisor writes exit_code only after it has reaped the trainer's process group (SIGTERM, up to 5 s
# grace, SIGKILL, wait): a run seen gone without one is believed lost only after this long.
EXIT_CODE_GRACE_S = 10.0
# The launcher writes `pid` right after it forks: a run with no pid yet is starting, not lost, for this long.
STARTING_GRACE_S = 15.0


@dataclass(frozen=True)
class ProcessState:
    """What is known about the run's process. alive=None: unknown (offline diagnose of copied files)."""

    alive: bool | None = None
    exit_code: int | None = None
    stopped: bool = False  # stopped by the user (`dflashctl stop`) or by the sentinel's failure policy
    stopped_why: str | None = None  # the sentinel's policy: why it stopped the run (None: the user did)
    started_at: float | None = None
    ending: bool = False  # alive, but the trainer has exited: its supervisor is reaping the group (probe `ending`)
    job: str | None = None  # a run that is not training (eval, generate): what it does; it logs no training steps
    survivors: tuple = ()  # {pid, cmdline} of its process tree alive after its end was recorded (issue 24)


def recorded_end(proc: ProcessState) -> tuple[Verdict, str] | None:
    """How the run's own records say it ended: the user's `stopped` marker (written before the first signal,
    so a run being stopped is already `stopped`), else its exit code once the process is gone; None while
    nothing is recorded."""
    if proc.stopped and not proc.survivors:  # never while a process of its tree outlives its recorded end
        return Verdict.STOPPED, (f"stopped by the failure policy: {proc.stopped_why}" if proc.stopped_why
                                 else "stopped by the user")
    if proc.alive is False and proc.exit_code == 0:
        return Verdict.FINISHED, "exited 0"
    if proc.alive is False and proc.exit_code is not None:
        return Verdict.CRASHED, f"exited with code {proc.exit_code}"
    return None


def process_verdict(proc: ProcessState, *, stepped: bool, pid_known: bool, now: float | None) -> Verdict:
    """The verdict from process state alone (no log judged, no GPUs): what `runs`, `stop` and `launch` say.
    stepped: a training step has been logged; pid_known: the launcher has recorded the trainer's pid."""
    end = recorded_end(proc)
    if end is not None:
        return end[0]
    if proc.alive:  # an evaluation or data generation logs no steps: running is all there is to say
        return Verdict.TRAINING if stepped or proc.job is not None else Verdict.STARTING
    if (not pid_known and now is not None and proc.started_at is not None
            and now - proc.started_at < STARTING_GRACE_S):
        return Verdict.STARTING
    return Verdict.LOST


Ending = Literal["running", "settling", "ended"]


@dataclass
class EndWatch:
    """Has the run ended, seen over successive probe reports? Ended once its exit code (or the user's stop) is
    recorded with the process gone, or at once when no supervisor of ours records one (an adopted run).
    A process gone with nothing recorded is `settling` for `grace_s` (the supervisor may still be reaping the
    group), then ended: lost."""

    grace_s: float = EXIT_CODE_GRACE_S
    gone_since: float | None = None  # the container's clock when the process was first seen gone, unrecorded

    def see(self, proc: ProcessState, now: float, *, supervised: bool = True) -> Ending:
        if proc.alive is not False:
            self.gone_since = None
            return "running"
        if proc.exit_code is not None or not supervised:
            return "ended"
        self.gone_since = now if self.gone_since is None else self.gone_since
        return "ended" if now - self.gone_since >= self.grace_s else "settling"
