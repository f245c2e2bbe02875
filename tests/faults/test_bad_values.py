"""Bad numbers are one line naming the option or key and its range (exit 2), from the command line and from
hosts.toml alike: NaN, infinities, negatives and intervals below 0.1 s (dflashctl/bounds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashctl import bounds


@pytest.mark.parametrize(("argv", "option", "bad"), [
    (["stop", "--grace", "nan"], "--grace", "nan"),
    (["stop", "--grace", "inf"], "--grace", "inf"),
    (["stop", "--grace", "-1"], "--grace", "-1"),
    (["kill-zombies", "--grace", "1e9"], "--grace", "1000000000"),
    (["status", "--watch", "--interval", "0.01"], "--interval", "0.01"),
    (["status", "--watch", "--interval", "nan"], "--interval", "nan"),
    (["status", "--watch", "--gpu-interval", "-inf"], "--gpu-interval", "-inf"),
    (["logs", "--lines", "-5"], "--lines", "-5"),
    (["launch", "--timeout", "inf"], "--timeout", "inf"),
    (["hosts", "check", "--timeout", "nan"], "--timeout", "nan"),
    (["deploy", "--max-file-mib", "nan"], "--max-file-mib", "nan"),
    (["gpus", "--watch", "--interval", "nan"], "--interval", "nan"),
])
def test_a_bad_number_option_is_one_line_with_its_name_and_range_and_exit_2(local_host, cli, argv, option, bad):
    res = cli(*argv)
    assert res.code == 2, res.err
    assert "Traceback" not in res.err and res.err.count("\n") == 1, res.err
    assert res.err.startswith(f"ERROR: {option} must be ") and " from " in res.err and bad in res.err


def test_stop_with_a_nan_grace_is_refused_before_it_touches_the_run(local_host, cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "job.sh").write_text("sleep 300\n")
    started = cli("launch", "--exec", "--source", str(src), "--name", "sleeper", "--", "sleep", "300")
    assert started.code == 0, started.err
    res = cli("stop", "--grace", "nan")
    assert res.code == 2 and res.err.startswith("ERROR: --grace must be"), res.err
    (run,) = cli("runs", "--json").json()["runs"]
    assert run["alive"] and run["verdict"] in ("starting", "training") and not run.get("stopped"), run
    assert cli("stop", "--grace", "0").code == 103


@pytest.mark.parametrize(("line", "key"), [
    ('sentinel_interval = "0.000001s"', "sentinel_interval"),
    ("sentinel_interval = 0.05", "sentinel_interval"),
    ('stall_window = "0.01s"', "stall_window"),
    ("persist = nan", "persist"),
    ("persist = inf", "persist"),
    ("persist = -1", "persist"),
    ("code_max_file_mib = inf", "code_max_file_mib"),
    ("code_max_total_mib = nan", "code_max_total_mib"),
])
def test_a_bad_number_in_hosts_toml_is_one_line_naming_file_line_key_and_range(tmp_path: Path, cli, line, key):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'default = "l"\n[hosts.l]\ntransport = "ssh"\naddress = "pve.example.invalid"\n{line}\n')
    res = cli("runs", "--hosts", str(hosts))
    assert res.code == 2 and "Traceback" not in res.err, res.err
    first = res.err.splitlines()[0]
    assert first.startswith(f"ERROR: {hosts}:5: [hosts.l] {key}: "), first
    assert " from " in first or "longer than 0" in first, first


def test_in_range_values_pass_and_the_range_is_inclusive():
    assert bounds.check("--grace", 0.0, bounds.GRACE_S) == 0.0
    assert bounds.check("--interval", 0.1, bounds.INTERVAL_S) == 0.1
    assert bounds.problem(3600, bounds.INTERVAL_S) is None
    assert bounds.problem(True, bounds.LINES) is not None  # a TOML boolean is not a number
    assert bounds.problem(2.5, bounds.LINES) is not None
