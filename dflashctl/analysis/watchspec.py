"""What a run's sentinel is told to do: where to send notifications, on which events, the failure policy, the
restart rule and how to judge (JudgeSettings) — parsed and checked on the laptop before anything is launched
(config.py through hostkeys.py, the launch flags through commands/sentinel.py), carried in the run's launch.json as
a plain dict (SentinelSpec.to_record), read back in the container (from_record). Here, not in sentinel/, so that
reading hosts.toml never imports the sentinel program.

Pure (no I/O): every malformed value is a ConfigError (exit 2) with one line that says what is wrong and what to
write instead. The CLI flags (`--notify`, `--notify-on`, `--idle-limit`, …) and hosts.toml (`[hosts.X.notify]`,
`idle_limit`, …) both end here, so the two spellings cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from dflashctl import bounds
from dflashctl.errors import ConfigError
from dflashctl.model import JudgeSettings

# What the sentinel writes to <run>/events.jsonl. `sentinel` (it started watching) and `notify-failed` (a delivery
# that gave up) are records of the sentinel itself, never notified.
EVENT_KINDS = ("sentinel", "first-step", "verdict", "worker-crashed", "stalled", "idle-gpus", "signature", "policy",
               "ended", "restart", "stacks", "notify-failed")
NOTIFIABLE = tuple(k for k in EVENT_KINDS if k not in ("sentinel", "notify-failed"))
# what a notification is sent for unless told otherwise: everything that needs a person, and the end
DEFAULT_NOTIFY = ("worker-crashed", "stalled", "idle-gpus", "signature", "policy", "ended", "restart")
TARGET_KINDS = ("webhook", "slack", "ntfy", "command")
RESTART_ON = ("crashed", "stalled")
NEVER_RETRY = (2,)  # a usage / config error: the next attempt would fail the same way
# causes (signature ids) that fail every attempt the same way: an attempt that ended with one is never restarted,
# and `--restart-on` refuses to name one (issue 28)
NEVER_RESTART_IDS = ("import-error",)
WORKER_POLICIES = ("stop", "keep")

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*$")
_IDLE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*@\s*(\S+)\s*$")


def parse_duration(text: str | float | int, what: str = "duration") -> float:
    """Seconds from "30m", "90s", "1h30m", "45" (seconds) or a number; positive."""
    if isinstance(text, bool):
        raise ConfigError(f"{what} {text!r} is not a duration", hint="write it as 90s, 30m, 1h30m or a number of "
                                                                    "seconds")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION.match(str(text))
        if not m or not str(text).strip() or not any(m.groups()):
            raise ConfigError(f"{what} {text!r} is not a duration",
                              hint="write it as 90s, 30m, 1h30m or a number of seconds")
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mi * 60 + s
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{what} {text!r} must be longer than 0 s", hint="e.g. 30m")
    return seconds


@dataclass(frozen=True)
class IdleLimit:
    """`5%@30m`: every GPU of the run that holds memory below 5 % utilisation for 30 minutes → stalled."""

    util_pct: float
    for_s: float

    def __str__(self) -> str:
        return f"{self.util_pct:g}%@{self.for_s:g}s"


def parse_idle_limit(text: str) -> IdleLimit:
    m = _IDLE.match(str(text))
    if not m:
        raise ConfigError(f"idle limit {text!r} is not UTIL%@DURATION",
                          hint="e.g. --idle-limit 5%@30m (GPUs below 5 % for 30 minutes with memory held)")
    pct = float(m.group(1))
    if not 0 < pct <= 100:
        raise ConfigError(f"idle limit {text!r}: the utilisation must be between 0 and 100 %", hint="e.g. 5%@30m")
    return IdleLimit(pct, parse_duration(m.group(2), "idle limit duration"))


def where(url: str) -> str:
    """scheme://host[:port] of a URL: how a notify target's place is shown (labels, delivery errors) — never its
    user:password, path or query, which hold secrets (sentinel/deliver.py redact keeps them out of error lines)."""
    parts = urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}"


@dataclass(frozen=True)
class NotifyTarget:
    """One place a notification goes: a webhook (JSON POST), a Slack-compatible webhook ({"text": …}), an
    ntfy-style topic URL (text body, Title/Priority/Tags headers), or a command run in the container."""

    kind: str
    url: str | None = None
    command: str | None = None

    @property
    def label(self) -> str:
        """How events.jsonl and messages name it: scheme://host/… (a URL's path may hold a secret token)."""
        if self.kind == "command":
            return f"command {self.command!r}"
        parts = urlsplit(self.url or "")
        place = where(self.url or "")
        return f"{self.kind} {place}/…" if parts.path not in ("", "/") or parts.query else f"{self.kind} {place}"

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) a URL target connects to, for the reachability check before launch."""
        if self.url is None:
            return None
        parts = urlsplit(self.url)
        return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "command": self.command}

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> NotifyTarget:
        return cls(str(d["kind"]), d.get("url"), d.get("command"))


def parse_target(text: str, kind: str | None = None) -> NotifyTarget:
    """`--notify` values: `webhook:URL`, `slack:URL`, `ntfy:URL`, `command:SHELL` (or `cmd:`), or a bare http(s)
    URL (a JSON webhook). kind: the hosts.toml key it came from (then text is the URL or command itself)."""
    text = str(text).strip()
    if kind is None:
        head, sep, rest = text.partition(":")
        if sep and head in (*TARGET_KINDS, "cmd") and not rest.startswith("//"):
            kind, text = ("command" if head == "cmd" else head), rest.strip()
        else:
            kind = "webhook"
    if kind not in TARGET_KINDS:
        raise ConfigError(f"notify target kind {kind!r} is unknown", hint=f"use one of {', '.join(TARGET_KINDS)}")
    if kind == "command":
        if not text:
            raise ConfigError("notify command is empty", hint="e.g. --notify 'command:logger -t dflash'")
        return NotifyTarget("command", command=text)
    parts = urlsplit(text)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or any(c.isspace() for c in text):
        raise ConfigError(f"notify URL {text!r} is not an http(s) URL",
                          hint=f"e.g. --notify {kind + ':' if kind != 'webhook' else ''}https://hooks.example.invalid/x")
    return NotifyTarget(kind, url=text)


def parse_kinds(values: str | Iterable[str] | None) -> tuple[str, ...]:
    """Which events are notified: a comma list (or list) of kinds, `all`, `default`, and `-KIND` to leave one out
    (`default,first-step,-ended`). None: the default set."""
    if values is None:
        return DEFAULT_NOTIFY
    items = [v.strip() for v in (values.split(",") if isinstance(values, str) else values) for v in str(v).split(",")]
    items = [v for v in items if v]
    if not items:
        raise ConfigError("no event kinds given", hint=f"name some of: {', '.join(NOTIFIABLE)} (or all, default)")
    chosen: list[str] = [] if not all(v.startswith("-") for v in items) else list(DEFAULT_NOTIFY)
    for v in items:
        drop = v.startswith("-")
        name = v[1:] if drop else v
        group = NOTIFIABLE if name == "all" else DEFAULT_NOTIFY if name == "default" else (name,)
        for k in group:
            if k not in NOTIFIABLE:
                raise ConfigError(f"unknown event kind {k!r}", hint=f"known kinds: {', '.join(NOTIFIABLE)} "
                                                                     "(or all, default; -KIND leaves one out)")
            if drop and k in chosen:
                chosen.remove(k)
            elif not drop and k not in chosen:
                chosen.append(k)
    return tuple(k for k in NOTIFIABLE if k in chosen)


@dataclass(frozen=True)
class Policy:
    """What the sentinel does on its own. None everywhere: report only (today's behaviour)."""

    on_worker_failure: str | None = None  # "stop": end the run when a worker dies; "keep": let it go on
    idle_limit: IdleLimit | None = None
    stall_limit_s: float | None = None  # no new step for this long after the first one → stalled → stop

    @property
    def acts(self) -> bool:
        return self.on_worker_failure == "stop" or self.idle_limit is not None or self.stall_limit_s is not None


def parse_worker_policy(value: str | None) -> str | None:
    if value is None:
        return None
    if value not in WORKER_POLICIES:
        raise ConfigError(f"on_worker_failure {value!r} is neither stop nor keep",
                          hint="stop: end the run so its GPUs are freed; keep: let it go on (reported)")
    return value


@dataclass(frozen=True)
class Restart:
    """`--restart-on crashed,stalled --max-restarts N --backoff S`: a new attempt (a new run directory) after an
    attempt that ended that way, resumed from the newest checkpoint where the program supports it. `on` may name
    causes too (signature ids, `--restart-on nccl-timeout,host-oom`): an attempt that crashed or stalled with one of
    them restarts; one that ended with a cause in NEVER_RESTART_IDS never does."""

    on: tuple[str, ...]
    max_restarts: int
    backoff_s: float = 10.0
    gpu_free_mib: float = 512.0  # wait until every GPU's memory is below this before the next attempt (NVRx's rule)
    gpu_wait_s: float = 600.0  # ... for at most this long, then start anyway (and say so in events.jsonl)
    never: tuple[int, ...] = NEVER_RETRY

    def to_record(self) -> dict[str, Any]:
        return {"on": list(self.on), "max_restarts": self.max_restarts, "backoff_s": self.backoff_s,
                "gpu_free_mib": self.gpu_free_mib, "gpu_wait_s": self.gpu_wait_s, "never": list(self.never)}

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> Restart:
        return cls(tuple(d["on"]), int(d["max_restarts"]), float(d.get("backoff_s", 10.0)),
                   float(d.get("gpu_free_mib", 512.0)), float(d.get("gpu_wait_s", 600.0)),
                   tuple(int(c) for c in d.get("never", NEVER_RETRY)))


def parse_restart(on: str | Iterable[str] | None, max_restarts: int | None,
                  backoff: str | float | None) -> Restart | None:
    """None when no restart is asked for. `--max-restarts` without `--restart-on` (or the reverse) is refused."""
    if on is None and max_restarts is None:
        if backoff is not None:
            raise ConfigError("--backoff without --restart-on", hint="e.g. --restart-on crashed --max-restarts 3 "
                                                                     "--backoff 30s")
        return None
    if on is None:
        raise ConfigError("--max-restarts without --restart-on", hint="say what to restart on: --restart-on crashed "
                                                                      "(or crashed,stalled)")
    items = [v.strip() for v in (on.split(",") if isinstance(on, str) else on) for v in str(v).split(",")]
    items = [v for v in items if v]
    ids = _restart_causes([v for v in items if v not in RESTART_ON], ",".join(items))
    if not items:
        raise ConfigError("--restart-on (empty): nothing is not a restartable ending",
                          hint=f"use {' and/or '.join(RESTART_ON)}, or signature ids (docs/failures.md)")
    n = 1 if max_restarts is None else max_restarts
    why = bounds.problem(n, bounds.RESTARTS)
    if why:
        raise ConfigError(f"--max-restarts {why}", hint="e.g. --max-restarts 3")
    return Restart(tuple(k for k in RESTART_ON if k in items) + ids, n,
                   10.0 if backoff is None else parse_duration(backoff, "restart backoff"))


def _restart_causes(ids: list[str], given: str) -> tuple[str, ...]:
    """The signature ids `--restart-on` names (restart when an attempt ends with that cause), checked: known ids
    only, and none that fails every attempt the same way."""
    if not ids:
        return ()
    from dflashctl.analysis.signatures import BY_ID  # only here: reading a config must not compile the table

    for v in ids:
        if v in NEVER_RESTART_IDS:
            raise ConfigError(f"--restart-on {given}: {v} is never restarted (the next attempt fails the same way)",
                              hint="fix its cause and launch again; restart on causes that pass: nccl-timeout, "
                                   "host-oom, cuda-oom, gpu-hardware …")
        if v not in BY_ID:
            raise ConfigError(f"--restart-on {given}: {v} is not a restartable ending",
                              hint=f"use {' and/or '.join(RESTART_ON)}, or causes: signature ids from "
                                   "docs/failures.md (e.g. nccl-timeout,host-oom)")
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True)
class SentinelSpec:
    """Everything the sentinel of one run needs to know from the laptop (launch.json `sentinel`)."""

    host: str  # the hosts.toml name, for messages and the `dflashctl …` command they suggest
    targets: tuple[NotifyTarget, ...] = ()
    kinds: tuple[str, ...] = DEFAULT_NOTIFY
    policy: Policy = field(default_factory=Policy)
    restart: Restart | None = None
    interval_s: float = 1.0  # how often the log and the process are looked at
    gpu_interval_s: float = 5.0  # how often the GPUs are read (nvidia-smi is not free)
    gather_s: float = 2.0  # events this close together go out as one message (longer than interval_s: a storm
    # whose tracebacks straddle one of the sentinel's reads is still one message)
    min_gap_s: float = 60.0  # after a message, further events wait this long and go out as one (rate limit)
    attempt: int = 1  # which attempt of its launch this run is (restarts count up)
    judge: JudgeSettings = JudgeSettings()  # the host's judge settings (hosts.toml), as `status` uses them

    def to_record(self) -> dict[str, Any]:
        p = self.policy
        return {
            "host": self.host, "targets": [t.to_record() for t in self.targets], "kinds": list(self.kinds),
            "policy": {"on_worker_failure": p.on_worker_failure,
                       "idle_limit": None if p.idle_limit is None else {"util_pct": p.idle_limit.util_pct,
                                                                        "for_s": p.idle_limit.for_s},
                       "stall_limit_s": p.stall_limit_s},
            "restart": None if self.restart is None else self.restart.to_record(),
            "interval_s": self.interval_s, "gpu_interval_s": self.gpu_interval_s, "gather_s": self.gather_s,
            "min_gap_s": self.min_gap_s, "attempt": self.attempt, "judge": self.judge.to_record(),
        }

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> SentinelSpec:
        p = d.get("policy") or {}
        idle = p.get("idle_limit")
        restart = d.get("restart")
        return cls(
            host=str(d.get("host") or "?"),
            targets=tuple(NotifyTarget.from_record(t) for t in d.get("targets") or ()),
            kinds=tuple(d["kinds"]) if d.get("kinds") is not None else DEFAULT_NOTIFY,
            policy=Policy(p.get("on_worker_failure"),
                          None if not idle else IdleLimit(float(idle["util_pct"]), float(idle["for_s"])),
                          None if p.get("stall_limit_s") is None else float(p["stall_limit_s"])),
            restart=None if not restart else Restart.from_record(restart),
            interval_s=float(d.get("interval_s", 1.0)), gpu_interval_s=float(d.get("gpu_interval_s", 5.0)),
            gather_s=float(d.get("gather_s", 2.0)), min_gap_s=float(d.get("min_gap_s", 60.0)),
            attempt=int(d.get("attempt", 1)),
            judge=JudgeSettings.from_record(d.get("judge") or dict(d)),  # a spec from before: its keys at the top
        )
