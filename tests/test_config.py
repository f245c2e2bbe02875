"""hosts.toml: search order, defaults per transport, and one-line errors naming file, table, key, line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dflashctl.config import load_inventory
from dflashctl.errors import ConfigError, ExitCode

REPO = Path(__file__).resolve().parents[1]

PROXMOX = """\
default = "pve1"

[hosts.local]
workspace = ".dflash/workspace"

[hosts.pve1]
transport = "ssh"
address = "pve1.example.invalid"
user = "root"
port = 2222
identity_file = "~/.ssh/id_ed25519"
proxy_jump = "ops@bastion.example.invalid"
container = 200
workspace = "/workspace/dflash"
python = "/workspace/venv/bin/python"
gpus.target = [0, 1, 2, 3, 4]
gpus.drafters = [5, 6, 7]
config = "trainer/configs/tiny-cpu.toml"
accept_new_host_key = true
"""


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No hosts.toml from the developer's cwd or ~/.config leaks into these tests."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DFLASHCTL_HOSTS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(text: str, tmp_path: Path) -> ConfigError:
    f = write(tmp_path / "conf" / "hosts.toml", text)
    with pytest.raises(ConfigError) as exc:
        load_inventory(f)
    assert exc.value.exit_code == ExitCode.USAGE
    assert "\n" not in exc.value.message
    assert str(f) in exc.value.message
    return exc.value


def test_every_key_of_a_proxmox_host_is_read(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path / "hosts.toml", PROXMOX))
    h = inv.get(None)
    assert (h.name, h.transport, h.address, h.user, h.port) == ("pve1", "ssh", "pve1.example.invalid", "root", 2222)
    assert (h.identity_file, h.proxy_jump, h.container) == ("~/.ssh/id_ed25519", "ops@bastion.example.invalid", 200)
    assert (h.workspace, h.python) == ("/workspace/dflash", "/workspace/venv/bin/python")
    assert (h.gpus_target, h.gpus_drafters) == ((0, 1, 2, 3, 4), (5, 6, 7))
    assert (h.config, h.accept_new_host_key) == ("trainer/configs/tiny-cpu.toml", True)
    assert h.source == tmp_path / "hosts.toml"
    assert inv.names() == ["local", "pve1"]


def test_local_host_defaults_to_this_python_and_a_workspace_next_to_the_file(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path / "etc" / "hosts.toml", PROXMOX))
    local = inv.get("local")
    assert local.transport == "local" and local.python == sys.executable
    assert local.workspace == str(tmp_path / "etc" / ".dflash" / "workspace")


def test_ssh_host_defaults_to_python3_and_the_container_workspace(tmp_path: Path) -> None:
    f = write(tmp_path / "hosts.toml", '[hosts.gpu]\naddress = "gpu.example.invalid"\n')
    h = load_inventory(f).get("gpu")
    assert (h.transport, h.python, h.workspace, h.port, h.accept_new_host_key) == (
        "ssh", "python3", "/workspace/dflash", None, False)


def test_search_order_is_option_then_env_then_cwd_then_user_config(tmp_path: Path, monkeypatch) -> None:
    one = '[hosts.{0}]\ntransport = "local"\n'
    user = write(tmp_path / "xdg-config" / "dflashctl" / "hosts.toml", one.format("from_user_config"))
    assert load_inventory(None).path == user
    cwd = write(tmp_path / "hosts.toml", one.format("from_cwd"))
    assert load_inventory(None).path.resolve() == cwd
    env = write(tmp_path / "env.toml", one.format("from_env"))
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(env))
    assert load_inventory(None).path == env
    opt = write(tmp_path / "opt.toml", one.format("from_option"))
    assert load_inventory(opt).get(None).name == "from_option"


def test_without_any_file_the_embedded_default_is_one_local_host(tmp_path: Path) -> None:
    inv = load_inventory(None)
    assert inv.path is None and inv.names() == ["local"]
    h = inv.get(None)
    assert (h.transport, h.python, h.container) == ("local", sys.executable, None)
    assert h.workspace == str(tmp_path / "xdg-data" / "dflashctl" / "workspace")


def test_the_shipped_hosts_toml_has_a_working_local_default() -> None:
    inv = load_inventory(REPO / "hosts.toml")
    h = inv.get(None)
    assert (h.name, h.transport, h.workspace) == ("local", "local", str(REPO / ".dflash" / "workspace"))
    assert "pve1.example.invalid" in (REPO / "hosts.toml").read_text()  # the commented Proxmox example


def test_a_named_file_that_does_not_exist_is_an_error_not_a_fallback(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="--hosts"):
        load_inventory(tmp_path / "missing.toml")
    monkeypatch.setenv("DFLASHCTL_HOSTS", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="DFLASHCTL_HOSTS"):
        load_inventory(None)


def test_malformed_toml_names_the_file_and_line(tmp_path: Path) -> None:
    e = error_of('default = "x"\n[hosts.x]\ntransport = \n', tmp_path)
    assert "invalid TOML" in e.message and "line 3" in e.message


def test_unknown_key_names_table_key_line_and_suggests_the_right_one(tmp_path: Path) -> None:
    e = error_of('[hosts.pve]\ntransport = "ssh"\nadress = "pve1.example.invalid"\n', tmp_path)
    assert e.message.endswith("hosts.toml:3: [hosts.pve] adress: unknown key")
    assert "address" in e.hint


@pytest.mark.parametrize(
    ("body", "line", "key", "problem"),
    [
        ('port = "22"', 3, "port", "integer"),
        ("port = 70000", 3, "port", "1-65535"),
        ('container = "200"', 3, "container", "CTID"),
        ("accept_new_host_key = 1", 3, "accept_new_host_key", "true or false"),
        ("gpus.target = [0, -1]", 3, "gpus.target", "GPU indices"),
        ("gpus.spare = [0]", 3, "gpus.spare", "unknown key"),
        ('transport = "telnet"', 3, "transport", '"local" or "ssh"'),
        ('workspace = "relative/dir"', 3, "workspace", "absolute"),
        ("user = 5", 3, "user", "string"),
    ],
)
def test_wrong_types_name_table_key_and_line(tmp_path: Path, body: str, line: int, key: str, problem: str) -> None:
    e = error_of(f'[hosts.pve]\naddress = "pve1.example.invalid"\n{body}\n', tmp_path)
    assert f"hosts.toml:{line}: [hosts.pve] {key}: " in e.message
    assert problem in e.message


def test_ssh_without_an_address_is_an_error(tmp_path: Path) -> None:
    e = error_of('[hosts.pve]\ntransport = "ssh"\ncontainer = 200\n', tmp_path)
    assert "[hosts.pve]" in e.message and "needs an address" in e.message


def test_ssh_only_keys_on_a_local_host_are_an_error(tmp_path: Path) -> None:
    e = error_of('[hosts.here]\ntransport = "local"\nport = 22\n', tmp_path)
    assert "[hosts.here] port:" in e.message and 'transport = "ssh"' in e.message


def test_default_naming_an_undefined_host_is_an_error(tmp_path: Path) -> None:
    e = error_of('default = "pve"\n[hosts.local]\n', tmp_path)
    assert "hosts.toml:1: default: names host 'pve'" in e.message and "known: local" in e.message


def test_unknown_top_level_key_is_an_error(tmp_path: Path) -> None:
    e = error_of('defualt = "local"\n[hosts.local]\n', tmp_path)
    assert "hosts.toml:1: defualt: unknown top-level key" in e.message


def test_unknown_host_name_lists_the_known_ones(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path / "hosts.toml", PROXMOX))
    with pytest.raises(ConfigError) as exc:
        inv.get("pve2")
    assert exc.value.exit_code == ExitCode.USAGE
    assert "unknown host 'pve2'" in exc.value.message and "known: local, pve1" in exc.value.message
    assert "pve1" in exc.value.hint


def test_a_local_host_with_a_container_runs_pct_on_this_machine(tmp_path: Path) -> None:
    """dflashctl run on the Proxmox host itself: no ssh, but still `pct exec`."""
    h = load_inventory(write(tmp_path / "hosts.toml", '[hosts.pve]\ntransport = "local"\ncontainer = 200\n')).get()
    assert (h.transport, h.container, h.python, h.workspace) == ("local", 200, "python3", "/workspace/dflash")


def test_without_default_several_hosts_need_a_name(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path / "hosts.toml", '[hosts.a]\naddress = "a.example.invalid"\n'
                                                        '[hosts.b]\naddress = "b.example.invalid"\n'))
    with pytest.raises(ConfigError, match="no `default` host"):
        inv.get(None)
    assert inv.get("b").address == "b.example.invalid"


def test_a_hosts_progress_regex_is_checked_where_it_is_written(tmp_path: Path) -> None:
    good = write(tmp_path / "good.toml", "[hosts.x]\ntransport = \"local\"\n"
                                         "progress_regex = 'it (?P<step>\\d+) of (?P<total>\\d+)'\n")
    assert load_inventory(good).get("x").judge.progress_regex == r"it (?P<step>\d+) of (?P<total>\d+)"
    for regex, problem in (("it (\\d+", "does not compile"), ("it (\\d+)", "none of the named groups"),
                           ("(?P<step>\\d*)", "matches an empty line")):
        bad = write(tmp_path / "bad.toml", f"[hosts.x]\ntransport = \"local\"\nprogress_regex = '{regex}'\n")
        with pytest.raises(ConfigError) as e:
            load_inventory(bad)
        assert f"{bad}:3: [hosts.x] progress_regex:" in e.value.message and problem in e.value.message


SENTINEL_HOST = """\
[hosts.pve]
address = "pve1.example.invalid"
container = 200
sentinel = true
sentinel_interval = "2s"
on_worker_failure = "stop"
idle_limit = "5%@30m"
stall_limit = "20m"
restart_on = ["crashed", "stalled"]
max_restarts = 3
restart_backoff = "30s"

[hosts.pve.notify]
webhook = ["https://hooks.example.invalid/a", "https://hooks.example.invalid/b"]
ntfy = "https://ntfy.example.invalid/dflash-runs"
command = "logger -t dflash"
events = ["default", "first-step"]
min_gap = "90s"
"""


def test_a_hosts_sentinel_and_notify_keys_are_read_into_the_host(tmp_path: Path) -> None:
    h = load_inventory(write(tmp_path / "hosts.toml", SENTINEL_HOST)).get("pve")
    assert (h.sentinel, h.sentinel_interval_s) == (True, 2.0)
    assert h.notify == ("webhook:https://hooks.example.invalid/a", "webhook:https://hooks.example.invalid/b",
                        "ntfy:https://ntfy.example.invalid/dflash-runs", "command:logger -t dflash")
    assert h.notify_on == ("first-step", "worker-crashed", "stalled", "idle-gpus", "signature", "policy", "ended",
                           "restart")
    assert h.notify_min_gap_s == 90.0
    assert (h.on_worker_failure, h.idle_limit, h.stall_limit) == ("stop", "5%@30m", "20m")
    assert (h.restart_on, h.max_restarts, h.restart_backoff) == (("crashed", "stalled"), 3, "30s")


def test_a_host_without_sentinel_keys_gets_a_watched_run_with_no_targets(tmp_path: Path) -> None:
    h = load_inventory(write(tmp_path / "hosts.toml", '[hosts.gpu]\naddress = "gpu.example.invalid"\n')).get("gpu")
    assert (h.sentinel, h.sentinel_interval_s, h.notify, h.notify_on, h.notify_min_gap_s) == (True, None, (), None,
                                                                                              None)
    assert (h.on_worker_failure, h.idle_limit, h.stall_limit, h.restart_on, h.max_restarts, h.restart_backoff) == (
        None, None, None, None, None, None)


def test_the_hosts_sentinel_keys_become_the_runs_spec_unless_a_flag_says_otherwise(tmp_path: Path) -> None:
    from dflashctl.commands.sentinel import WatchOptions, sentinel_spec

    h = load_inventory(write(tmp_path / "hosts.toml", SENTINEL_HOST)).get("pve")
    spec = sentinel_spec(h, WatchOptions())
    assert [t.kind for t in spec.targets] == ["webhook", "webhook", "ntfy", "command"]
    assert spec.kinds == h.notify_on and spec.min_gap_s == 90.0 and spec.interval_s == 2.0
    assert spec.policy.on_worker_failure == "stop" and spec.policy.stall_limit_s == 1200.0
    assert (spec.policy.idle_limit.util_pct, spec.policy.idle_limit.for_s) == (5.0, 1800.0)
    assert (spec.restart.on, spec.restart.max_restarts, spec.restart.backoff_s) == (("crashed", "stalled"), 3, 30.0)
    flagged = sentinel_spec(h, WatchOptions(notify=["none"], notify_on="ended", on_worker_failure="keep"))
    assert flagged.targets == () and flagged.kinds == ("ended",) and flagged.policy.on_worker_failure == "keep"
    off = write(tmp_path / "off.toml", '[hosts.pve]\naddress = "pve1.example.invalid"\nsentinel = false\n')
    assert sentinel_spec(load_inventory(off).get("pve"), WatchOptions()) is None


@pytest.mark.parametrize(
    ("body", "line", "key", "problem"),
    [
        ('idle_limit = "5@30m"', 3, "idle_limit", "is not UTIL%@DURATION"),
        ('idle_limit = "5%@0"', 3, "idle_limit", "must be longer than 0 s"),
        ('stall_limit = "abc"', 3, "stall_limit", "is not a duration"),
        ('on_worker_failure = "restart"', 3, "on_worker_failure", "neither stop nor keep"),
        ("sentinel = 1", 3, "sentinel", "true or false"),
        ("max_restarts = 2", 3, "max_restarts", "without --restart-on"),
        ('restart_on = ["exploded"]', 3, "restart_on", "not a restartable ending"),
        ('notify = "x"', 3, "notify", "must be a table"),
        ('notify.events = ["crash"]', 3, "notify.events", "unknown event kind 'crash'"),
        ('notify.webhook = "ftp://x"', 3, "notify.webhook", "is not an http(s) URL"),
        ("notify.bogus = 1", 3, "notify.bogus", "unknown key"),
        ('notify.min_gap = "soon"', 3, "notify.min_gap", "is not a duration"),
        ("notify.slack = 5", 3, "notify.slack", "must be a string or an array of strings"),
        # the same keys in a [hosts.pve.notify] table of their own: the line is the key's, in that table
        ('\n[hosts.pve.notify]\nwebhook = "https://ok.example.invalid/x"\nevents = ["crash"]', 6, "notify.events",
         "unknown event kind 'crash'"),
        ('\n[hosts.pve.notify]\nwebhook = "ftp://x"', 5, "notify.webhook", "is not an http(s) URL"),
        ('\n[hosts.pve.notify]\nntfy = "https://ntfy.example.invalid/t"\nbogus = 1', 6, "notify.bogus", "unknown key"),
    ],
)
def test_a_malformed_sentinel_key_names_file_line_and_key(tmp_path: Path, body: str, line: int, key: str,
                                                          problem: str) -> None:
    e = error_of(f'[hosts.pve]\naddress = "pve1.example.invalid"\n{body}\n', tmp_path)
    assert f"hosts.toml:{line}: [hosts.pve] {key}: " in e.message, e.message
    assert problem in e.message, e.message


@pytest.mark.parametrize("key", ["accept_new_host_key", "sentinel"])  # a host key (config.py), a sentinel key
def test_a_value_of_the_wrong_type_is_named_by_its_toml_type(tmp_path: Path, key: str) -> None:
    e = error_of(f'[hosts.pve]\naddress = "pve1.example.invalid"\n{key} = 1\n', tmp_path)
    assert e.message.endswith(f"[hosts.pve] {key}: must be true or false, not an integer"), e.message


def test_the_judge_settings_are_parsed_once_and_every_judge_receives_that_object(tmp_path: Path) -> None:
    """hosts.toml `stall_window` and `progress_regex` become one JudgeSettings on the Host; `status` (its Watcher),
    `runs`/`logs` (the pattern) and the sentinel (through launch.json) all get that object, not their own parse."""
    import json

    from dflashctl.analysis import judging
    from dflashctl.analysis.watchspec import SentinelSpec
    from dflashctl.commands.sentinel import WatchOptions, sentinel_spec
    from dflashctl.model import JudgeSettings

    h = load_inventory(write(tmp_path / "hosts.toml", '[hosts.x]\ntransport = "local"\nstall_window = "4m"\n'
                             "progress_regex = 'it (?P<step>\\d+) of (?P<total>\\d+)'\n")).get("x")
    assert h.judge == JudgeSettings(240.0, r"it (?P<step>\d+) of (?P<total>\d+)")
    spec = sentinel_spec(h, WatchOptions())
    assert spec is not None and spec.judge is h.judge
    assert SentinelSpec.from_record(json.loads(json.dumps(spec.to_record()))).judge == h.judge  # as the sentinel reads
    w = judging.watcher("x", h.judge, live=True)
    assert w.thresholds.stall_window_s == 240.0 and w.steps.stall_window_s == 240.0
    assert w.scanner.progress_regex is judging.progress_pattern(h.judge)
    assert judging.progress_pattern(h.judge).search("it 7 of 100").group("step") == "7"
    plain = load_inventory(write(tmp_path / "plain.toml", '[hosts.y]\ntransport = "local"\n')).get("y")
    assert plain.judge == JudgeSettings() and judging.progress_pattern(plain.judge) is None
    assert judging.thresholds(plain.judge).stall_window_s == 300.0  # the engine's default


def test_judge_settings_from_a_malformed_record_are_the_defaults() -> None:
    from dflashctl.model import JudgeSettings

    for bad in (None, [], {"stall_window_s": "5m", "progress_regex": 3}, {"stall_window_s": -1},
                {"stall_window_s": True}):
        assert JudgeSettings.from_record(bad) == JudgeSettings()
    assert JudgeSettings.from_record({"stall_window_s": 60, "progress_regex": "x"}) == JudgeSettings(60.0, "x")


def test_host_keys_reads_no_key_outside_its_list() -> None:
    """hostkeys.KEYS is what lets a table without sentinel keys skip the parsers: every key host_keys looks at must
    be in it (one sentinel key present makes it look at all the others)."""
    from collections.abc import Mapping

    from dflashctl import hostkeys

    class Asked(Mapping):
        def __init__(self, d: dict[str, object]) -> None:
            self.d, self.keys_asked = d, set()

        def __getitem__(self, key: str) -> object:
            self.keys_asked.add(key)
            return self.d[key]

        def __iter__(self):  # noqa: ANN204
            return iter(self.d)

        def __len__(self) -> int:
            return len(self.d)

    table = Asked({"sentinel": True})
    assert hostkeys.host_keys(table) == {"sentinel": True}
    assert table.keys_asked == set(hostkeys.KEYS)
    assert hostkeys.host_keys({"name": "x", "workspace": "/w"}) == {}
