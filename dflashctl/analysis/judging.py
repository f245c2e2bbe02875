"""A host's judge settings (model.JudgeSettings, parsed once from hosts.toml) as the engine uses them: thresholds, the
compiled progress pattern, and the Watcher built from both. `status`, `status --watch`, `runs`, `logs` and the
sentinel all go through here, so a host's `stall_window` and `progress_regex` mean the same to each. Pure."""

from __future__ import annotations

import re
from functools import lru_cache

from dflashctl.analysis.gpuwindow import Thresholds
from dflashctl.analysis.logscan import LogScanner
from dflashctl.analysis.progress import custom
from dflashctl.analysis.watcher import Watcher
from dflashctl.model import JudgeSettings


def thresholds(judge: JudgeSettings) -> Thresholds:
    """The engine's thresholds: the defaults, with the host's stall window where it sets one."""
    return Thresholds() if judge.stall_window_s is None else Thresholds(stall_window_s=judge.stall_window_s)


@lru_cache(maxsize=32)
def _compiled(regex: str) -> re.Pattern[str]:
    return custom(regex)


def progress_pattern(judge: JudgeSettings) -> re.Pattern[str] | None:
    """The trainer's own progress line (None: the formats the engine knows). Checked when hosts.toml was read."""
    return _compiled(judge.progress_regex) if judge.progress_regex else None


def watcher(host: str, judge: JudgeSettings, *, live: bool = False) -> Watcher:
    """The state one run's judging carries from report to report, set up as the host says."""
    return Watcher(host, thresholds(judge), live=live, scanner=LogScanner(progress_pattern(judge)))
