"""The sentinel a launch starts with: the host's settings (hosts.toml) and the launch's flags merged into one
SentinelSpec, checked before anything is contacted (every malformed value a one-line error, exit 2).

A flag given wins over the host's key of the same meaning; `--notify none` drops the host's targets for one launch;
`--no-sentinel` (or `sentinel = false`) starts the run unwatched, as before there was one.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflashctl.analysis.watchspec import (
    Policy,
    SentinelSpec,
    parse_duration,
    parse_idle_limit,
    parse_kinds,
    parse_restart,
    parse_target,
    parse_worker_policy,
)
from dflashctl.errors import ConfigError
from dflashctl.model import Host


@dataclass
class WatchOptions:
    """The launch flags of the sentinel; None: the host's setting (else the default)."""

    enabled: bool | None = None  # --sentinel/--no-sentinel
    notify: list[str] | None = None  # --notify TARGET (repeatable); ["none"]: no targets
    notify_on: str | None = None  # --notify-on KINDS
    on_worker_failure: str | None = None  # --on-worker-failure stop|keep
    idle_limit: str | None = None  # --idle-limit 5%@30m
    stall_limit: str | None = None  # --stall-limit 20m
    restart_on: str | None = None  # --restart-on crashed,stalled
    max_restarts: int | None = None
    backoff: str | None = None
    interval_s: float | None = None  # --sentinel-interval (tests, and hosts that want it slower)


def sentinel_spec(host: Host, opts: WatchOptions) -> SentinelSpec | None:
    """The spec the run's sentinel gets, or None when the run goes unwatched."""
    if opts.enabled is False or (opts.enabled is None and not host.sentinel):
        if any(v is not None for v in (opts.notify, opts.notify_on, opts.on_worker_failure, opts.idle_limit,
                                       opts.stall_limit, opts.restart_on, opts.max_restarts)):
            raise ConfigError("--no-sentinel leaves nobody to notify, apply a policy or restart",
                              hint="drop --no-sentinel (or `sentinel = false` for the host), or the other flags")
        return None
    if opts.notify is not None:
        words = [w for w in opts.notify if w.strip()]
        targets = () if words == ["none"] else tuple(parse_target(w) for w in words)
    else:
        targets = tuple(parse_target(w) for w in host.notify)
    kinds = parse_kinds(opts.notify_on if opts.notify_on is not None else host.notify_on)
    stall = opts.stall_limit if opts.stall_limit is not None else host.stall_limit
    idle = opts.idle_limit if opts.idle_limit is not None else host.idle_limit
    policy = Policy(parse_worker_policy(opts.on_worker_failure or host.on_worker_failure),
                    None if idle is None else parse_idle_limit(idle),
                    None if stall is None else parse_duration(stall, "stall limit"))
    restart = parse_restart(opts.restart_on if opts.restart_on is not None else host.restart_on,
                            opts.max_restarts if opts.max_restarts is not None else host.max_restarts,
                            opts.backoff if opts.backoff is not None else host.restart_backoff)
    interval = opts.interval_s if opts.interval_s is not None else host.sentinel_interval_s
    return SentinelSpec(host=host.name, targets=targets, kinds=kinds, policy=policy, restart=restart,
                        interval_s=1.0 if interval is None else parse_duration(interval, "sentinel interval"),
                        min_gap_s=60.0 if host.notify_min_gap_s is None else host.notify_min_gap_s,
                        judge=host.judge)
