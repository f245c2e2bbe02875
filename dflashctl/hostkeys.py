"""The sentinel's keys in hosts.toml, read with the parsers the launch flags go through (analysis/watchspec.py), so
a value that `launch --idle-limit` refuses is refused in the file too — with the key named (config.py adds file and
line). `stall_window` comes back as stall_window_s, which config.py puts into the host's JudgeSettings.

    [hosts.pve1]
    on_worker_failure = "stop"          # or "keep"
    idle_limit = "5%@30m"
    stall_limit = "20m"
    restart_on = ["crashed", "stalled"]
    max_restarts = 3
    restart_backoff = "30s"
    sentinel = true                      # false: runs go unwatched
    stall_window = "5m"                  # no new step for this long → stalled (status and the sentinel judge alike)
    [hosts.pve1.notify]
    webhook = "https://hooks.example.invalid/dflash"     # a string or an array, for each kind
    slack = "https://hooks.example.invalid/services/T/B/x"
    ntfy = "https://ntfy.example.invalid/dflash-runs"
    command = "logger -t dflash"
    events = ["default", "first-step"]
    min_gap = "60s"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dflashctl.errors import ConfigError, toml_type

# every key of a [hosts.X] table host_keys reads: a table with none of them (most) loads no parser — a one-shot status
# reads hosts.toml before it sends its request, and watchspec's records cost ~3 ms to define
KEYS = ("sentinel", "sentinel_interval", "stall_window", "idle_limit", "stall_limit", "restart_backoff",
        "on_worker_failure", "restart_on", "max_restarts", "notify")
NOTIFY_KEYS = ("webhook", "slack", "ntfy", "command", "events", "min_gap")


class KeyProblem(ConfigError):
    def __init__(self, key: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.key = key


def _check(key: str, parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except KeyProblem:
        raise
    except ConfigError as e:
        raise KeyProblem(key, e.message, e.hint) from None


def _string(t: Mapping[str, Any], key: str, parse: Callable[[Any], Any], example: str, *,
            numbers: bool = False) -> str | None:
    v = t.get(key)
    if v is None:
        return None
    if not (isinstance(v, str) or (numbers and type(v) in (int, float))):
        raise KeyProblem(key, f"must be a string like {example!r}, not {toml_type(v)}")
    _check(key, parse, v)
    return str(v)


def _seconds(bound: str) -> Callable[[Any], float]:
    """A duration parser that also keeps the value within dflashctl.bounds' range of that name (issue 26: a
    `0.000001s` interval spun a core for the run's life)."""
    def parse(value: Any) -> float:
        from dflashctl import bounds
        from dflashctl.analysis import watchspec as spec

        seconds = spec.parse_duration(value)
        why = bounds.problem(seconds, getattr(bounds, bound))
        if why is not None:
            raise ConfigError(f"{why.rsplit(', not ', 1)[0]}, not {value!r}")
        return seconds
    return parse


def host_keys(t: Mapping[str, Any]) -> dict[str, Any]:
    """model.Host's sentinel fields from one [hosts.X] table (only the keys present)."""
    out: dict[str, Any] = {}
    if not any(k in t for k in KEYS):
        return out
    from dflashctl.analysis import watchspec as spec

    if "sentinel" in t:
        if type(t["sentinel"]) is not bool:
            raise KeyProblem("sentinel", f"must be true or false, not {toml_type(t['sentinel'])}")
        out["sentinel"] = t["sentinel"]
    if "sentinel_interval" in t:
        out["sentinel_interval_s"] = _check("sentinel_interval", _seconds("INTERVAL_S"), t["sentinel_interval"])
    if "stall_window" in t:
        out["stall_window_s"] = _check("stall_window", _seconds("WINDOW_S"), t["stall_window"])
    for key, parse, example in (("idle_limit", spec.parse_idle_limit, "5%@30m"),
                                ("stall_limit", _seconds("WINDOW_S"), "20m"),
                                ("restart_backoff", _seconds("WINDOW_S"), "30s")):
        value = _string(t, key, parse, example, numbers=key != "idle_limit")
        if value is not None:
            out[key] = value
    if "on_worker_failure" in t:
        out["on_worker_failure"] = _check("on_worker_failure", spec.parse_worker_policy, t["on_worker_failure"])
    if "restart_on" in t or "max_restarts" in t:
        r = _check("restart_on" if "restart_on" in t else "max_restarts",
                   lambda _: spec.parse_restart(t.get("restart_on"), t.get("max_restarts"), t.get("restart_backoff")),
                   None)
        out["restart_on"], out["max_restarts"] = r.on, r.max_restarts
    notify = t.get("notify")
    if notify is None:
        return out
    if not isinstance(notify, Mapping):
        raise KeyProblem("notify", 'must be a table: [hosts.NAME.notify] webhook = "https://…"')
    for key in notify:
        if key not in NOTIFY_KEYS:
            raise KeyProblem(f"notify.{key}", f"unknown key (known: {', '.join(NOTIFY_KEYS)})")
    targets = []
    for kind in spec.TARGET_KINDS:
        values = notify.get(kind, [])
        for v in values if isinstance(values, list) else [values]:
            if not isinstance(v, str):
                raise KeyProblem(f"notify.{kind}", f"must be a string or an array of strings, not {toml_type(v)}")
            _check(f"notify.{kind}", lambda x, k=kind: spec.parse_target(x, k), v)
            targets.append(f"{kind}:{v}")
    out["notify"] = tuple(targets)
    if "events" in notify:
        out["notify_on"] = _check("notify.events", spec.parse_kinds, notify["events"])
    if "min_gap" in notify:
        out["notify_min_gap_s"] = _check("notify.min_gap", _seconds("WINDOW_S"), notify["min_gap"])
    return out
