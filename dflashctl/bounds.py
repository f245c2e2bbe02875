"""Numbers from the command line and from hosts.toml: finite and within a sane range, or one line naming the option
or key, the range and the value given (exit 2).

One helper for both spellings (issue 26 part 5): click's own `min=`/`max=` let NaN through (every comparison with
NaN is false), `inf` passed as a grace period, and a `0.000001s` sentinel interval spun a core for a run's life.
cli/ options take `option(RANGE)` as their callback; config.py and hostkeys.py call `problem()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflashctl.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of one kind of number, with its unit for the message."""

    lo: float
    hi: float
    unit: str = ""
    integer: bool = False

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        kind = "a whole number" if self.integer else "a number"
        return f"{kind} from {_num(self.lo)} to {_num(self.hi)}{unit}"


# Seconds between two looks (a watch, a sentinel): below 0.1 s a loop only burns a core.
INTERVAL_S = Range(0.1, 3600.0, "s")
# Seconds between SIGTERM and SIGKILL (0: SIGKILL at once).
GRACE_S = Range(0.0, 86400.0, "s")
# Seconds a command waits for something (a launch, a check); a week is more than any run takes to start.
TIMEOUT_S = Range(0.1, 7 * 86400.0, "s")
# Windows and limits of the sentinel (stall window, stall limit, idle time, restart backoff): up to 30 days.
WINDOW_S = Range(0.1, 30 * 86400.0, "s")
# Seconds a connection master stays (0: none).
PERSIST_S = Range(0.0, 86400.0, "s")
# Deploy size limits.
SIZE_MIB = Range(0.001, 1024.0 * 1024.0, "MiB")
# Restarts of a run: each is a new attempt with its own run dir; beyond a thousand a loop only fills the disk.
RESTARTS = Range(1, 1000, integer=True)
# Lines of a log to show.
LINES = Range(0, 10_000_000, integer=True)


def problem(value: Any, rng: Range) -> str | None:
    """Why value is not a number within rng ("must be …, not …"), or None when it is."""
    ok_type = type(value) is int or (type(value) is float and not rng.integer)
    if ok_type and math.isfinite(value) and rng.lo <= value <= rng.hi:
        return None
    return f"must be {rng.describe()}, not {value!r}"


def check(name: str, value: Any, rng: Range) -> Any:
    """value when it is within rng, else a ConfigError naming `name` (an option like --grace, or a key)."""
    why = problem(value, rng)
    if why is not None:
        raise ConfigError(f"{name} {why}")
    return value


def option(rng: Range) -> Callable[..., Any]:
    """A typer option callback checking the value (None: not given, left alone) against rng."""

    def callback(ctx: Any, param: Any, value: Any) -> Any:  # click's (ctx, param, value) order
        if value is None or getattr(ctx, "resilient_parsing", False):  # completion parses without checking
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(check(_name(param), v, rng) for v in value)
        return check(_name(param), value, rng)

    return callback


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _name(param: Any) -> str:
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    return opts[0] if opts else str(getattr(param, "name", "value"))
