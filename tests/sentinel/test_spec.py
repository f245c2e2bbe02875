"""spec.py: the sentinel's flags and hosts.toml values, checked on the laptop; every malformed value is one
ConfigError line (exit 2) with a hint, and the spec crosses launch.json intact."""

from __future__ import annotations

import json

import pytest

from dflashctl.analysis.watchspec import (
    DEFAULT_NOTIFY,
    NOTIFIABLE,
    IdleLimit,
    NotifyTarget,
    Policy,
    Restart,
    SentinelSpec,
    parse_duration,
    parse_idle_limit,
    parse_kinds,
    parse_restart,
    parse_target,
    parse_worker_policy,
)
from dflashctl.errors import ConfigError, ExitCode
from dflashctl.model import JudgeSettings


def refused(fn, *args, **kwargs) -> str:  # noqa: ANN001 - any of the parsers
    """The one-line message of the ConfigError fn raises (exit 2, with a hint)."""
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    assert e.value.exit_code == ExitCode.USAGE and e.value.hint
    assert "\n" not in e.value.message and "\n" not in e.value.hint
    return e.value.message


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800.0), ("90s", 90.0), ("1h30m", 5400.0), ("45", 45.0),
                                               (" 2h ", 7200.0), ("1.5m", 90.0), (12, 12.0), (0.5, 0.5)])
def test_durations_are_read_as_seconds(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "message"), [
    ("", "duration '' is not a duration"),
    ("soon", "duration 'soon' is not a duration"),
    ("30x", "duration '30x' is not a duration"),
    ("-5m", "duration '-5m' is not a duration"),
    (True, "duration True is not a duration"),
    ("0", "duration '0' must be longer than 0 s"),
    (0, "duration 0 must be longer than 0 s"),
])
def test_a_malformed_duration_is_one_config_error(text: str | float, message: str) -> None:
    assert refused(parse_duration, text) == message


def test_a_duration_error_names_the_setting() -> None:
    assert refused(parse_duration, "later", "restart backoff") == "restart backoff 'later' is not a duration"


def test_an_idle_limit_is_utilisation_at_duration() -> None:
    assert parse_idle_limit("5%@30m") == IdleLimit(5.0, 1800.0)
    assert parse_idle_limit(" 2.5 % @ 90s ") == IdleLimit(2.5, 90.0)


@pytest.mark.parametrize(("text", "message"), [
    ("5@30m", "idle limit '5@30m' is not UTIL%@DURATION"),
    ("5%", "idle limit '5%' is not UTIL%@DURATION"),
    ("0%@30m", "idle limit '0%@30m': the utilisation must be between 0 and 100 %"),
    ("150%@30m", "idle limit '150%@30m': the utilisation must be between 0 and 100 %"),
    ("5%@never", "idle limit duration 'never' is not a duration"),
])
def test_a_malformed_idle_limit_is_one_config_error(text: str, message: str) -> None:
    assert refused(parse_idle_limit, text) == message


@pytest.mark.parametrize(("text", "kind", "target"), [
    ("https://hooks.example.invalid/x", None, NotifyTarget("webhook", url="https://hooks.example.invalid/x")),
    ("webhook:http://hooks.example.invalid:8080/hook", None, NotifyTarget("webhook", url="http://hooks.example.invalid:8080/hook")),
    ("slack:https://hooks.slack.com/services/T0/B0/secret", None,
     NotifyTarget("slack", url="https://hooks.slack.com/services/T0/B0/secret")),
    ("ntfy:https://ntfy.sh/dflash-runs", None, NotifyTarget("ntfy", url="https://ntfy.sh/dflash-runs")),
    ("command:logger -t dflash", None, NotifyTarget("command", command="logger -t dflash")),
    ("cmd: echo hi", None, NotifyTarget("command", command="echo hi")),
    ("https://ntfy.sh/t", "ntfy", NotifyTarget("ntfy", url="https://ntfy.sh/t")),  # hosts.toml: the key is the kind
])
def test_notify_targets_are_parsed_by_their_prefix(text: str, kind: str | None, target: NotifyTarget) -> None:
    assert parse_target(text, kind) == target


def test_a_target_label_hides_the_url_path_that_may_hold_a_token() -> None:
    t = parse_target("slack:https://hooks.slack.com/services/T0/B0/secret")
    assert t.label == "slack https://hooks.slack.com/…" and "secret" not in t.label
    assert parse_target("http://hooks.example.invalid:8080").label == "webhook http://hooks.example.invalid:8080"
    assert t.address == ("hooks.slack.com", 443) and parse_target("http://h:8080/x").address == ("h", 8080)
    assert parse_target("command:true").label == "command 'true'" and parse_target("command:true").address is None


@pytest.mark.parametrize(("text", "kind", "message"), [
    ("ftp://files.example.invalid/x", None, "notify URL 'ftp://files.example.invalid/x' is not an http(s) URL"),
    ("slack:hooks.slack.com/x", None, "notify URL 'hooks.slack.com/x' is not an http(s) URL"),
    ("https://host:99999/x", None, "notify URL 'https://host:99999/x' is not an http(s) URL"),
    ("https://host/a b", None, "notify URL 'https://host/a b' is not an http(s) URL"),
    ("https:///nohost", None, "notify URL 'https:///nohost' is not an http(s) URL"),
    ("command:", None, "notify command is empty"),
    ("https://x.invalid", "email", "notify target kind 'email' is unknown"),
])
def test_a_malformed_target_is_one_config_error(text: str, kind: str | None, message: str) -> None:
    assert refused(parse_target, text, kind) == message


def test_event_kinds_take_all_default_and_leaving_one_out() -> None:
    assert parse_kinds(None) == DEFAULT_NOTIFY
    assert parse_kinds("all") == NOTIFIABLE
    assert parse_kinds("default") == DEFAULT_NOTIFY
    assert parse_kinds("ended,stalled") == ("stalled", "ended")  # in the table's order
    assert parse_kinds(["ended", "stalled,first-step"]) == ("first-step", "stalled", "ended")
    assert parse_kinds("default,first-step,-ended") == tuple(
        k for k in NOTIFIABLE if k in DEFAULT_NOTIFY and k != "ended" or k == "first-step")
    assert parse_kinds("-ended,-restart") == tuple(k for k in DEFAULT_NOTIFY if k not in ("ended", "restart"))
    assert "verdict" not in DEFAULT_NOTIFY and "verdict" in parse_kinds("all")


@pytest.mark.parametrize(("values", "message"), [
    ("bogus", "unknown event kind 'bogus'"),
    ("stalled,-nope", "unknown event kind 'nope'"),
    ("sentinel", "unknown event kind 'sentinel'"),  # the sentinel's own records are never notified
    ("notify-failed", "unknown event kind 'notify-failed'"),
    (" , ", "no event kinds given"),
])
def test_an_unknown_event_kind_is_one_config_error(values: str, message: str) -> None:
    assert refused(parse_kinds, values) == message


def test_a_worker_policy_is_stop_or_keep() -> None:
    assert [parse_worker_policy(v) for v in ("stop", "keep", None)] == ["stop", "keep", None]
    assert refused(parse_worker_policy, "restart") == "on_worker_failure 'restart' is neither stop nor keep"


def test_a_restart_rule_is_parsed_with_its_defaults() -> None:
    assert parse_restart(None, None, None) is None
    assert parse_restart("crashed", 3, "30s") == Restart(("crashed",), 3, 30.0)
    assert parse_restart(["stalled", "crashed"], None, None) == Restart(("crashed", "stalled"), 1, 10.0)


@pytest.mark.parametrize(("on", "n", "backoff", "message"), [
    (None, 3, None, "--max-restarts without --restart-on"),
    (None, None, "30s", "--backoff without --restart-on"),
    ("exploded", 3, None, "--restart-on exploded: exploded is not a restartable ending"),
    ("crashed,finished", 3, None, "--restart-on crashed,finished: finished is not a restartable ending"),
    ("", 3, None, "--restart-on (empty): nothing is not a restartable ending"),
    ("crashed", 0, None, "--max-restarts must be a whole number from 1 to 1000, not 0"),
    ("crashed", True, None, "--max-restarts must be a whole number from 1 to 1000, not True"),
    ("crashed", 10**9, None, "--max-restarts must be a whole number from 1 to 1000, not 1000000000"),
    ("crashed", 2, "0s", "restart backoff '0s' must be longer than 0 s"),
])
def test_a_restart_rule_missing_a_piece_is_refused(on: str | None, n: int | None, backoff: str | None,
                                                   message: str) -> None:
    assert refused(parse_restart, on, n, backoff) == message


def test_a_sentinel_spec_crosses_launch_json_intact() -> None:
    spec = SentinelSpec(
        host="pve1",
        targets=(parse_target("slack:https://hooks.slack.com/services/T0/B0/x"), parse_target("command:logger x")),
        kinds=parse_kinds("default,first-step"),
        policy=Policy(on_worker_failure="stop", idle_limit=parse_idle_limit("5%@30m"), stall_limit_s=900.0),
        restart=parse_restart("crashed,stalled", 3, "1m"),
        interval_s=2.0, gpu_interval_s=10.0, gather_s=0.5, min_gap_s=120.0, attempt=2,
        judge=JudgeSettings(stall_window_s=240.0, progress_regex=r"^it (?P<step>\d+) loss (?P<loss>[\d.]+)"),
    )
    assert SentinelSpec.from_record(json.loads(json.dumps(spec.to_record()))) == spec
    plain = SentinelSpec("pve1")  # report only: no targets, no policy, no restart
    assert SentinelSpec.from_record(json.loads(json.dumps(plain.to_record()))) == plain
    assert not plain.policy.acts and spec.policy.acts


def test_an_empty_sentinel_record_reads_as_report_only() -> None:
    spec = SentinelSpec.from_record({})
    assert spec.host == "?" and spec.targets == () and spec.kinds == DEFAULT_NOTIFY and spec.restart is None
    assert spec.policy == Policy()


def test_a_spec_written_before_judge_settings_keeps_its_window_and_regex() -> None:
    old = {"host": "pve1", "stall_window_s": 120.0, "progress_regex": r"it (?P<step>\d+)"}
    assert SentinelSpec.from_record(old).judge == JudgeSettings(120.0, r"it (?P<step>\d+)")
